"""Kafka's config providers: secrets kept out of the connector config, as Kafka Connect keeps them.

A Debezium deployment names its providers (``config.providers=env,file`` with
``config.providers.env.class=org.apache.kafka.common.config.provider.EnvVarConfigProvider``) and writes
``${env:MONGODB_PASSWORD}``, ``${file:/etc/cdc/secrets.properties:password}`` or
``${dir:/run/secrets:mongodb-password}`` where a value goes. mongocdc has no Connect worker, so the
providers are named in the connector config itself and resolved before it is validated. Kafka's three
built-in providers are supported, with their ``allowed.paths`` and ``allowlist.pattern`` parameters; a
variable naming a provider that is not configured stays as written (Kafka's behaviour). Errors name the
property and the variable, never a resolved value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mongocdc_core.config.codec import parse_properties

PREFIX = "config.providers"
ENV = "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
FILE = "org.apache.kafka.common.config.provider.FileConfigProvider"
DIRECTORY = "org.apache.kafka.common.config.provider.DirectoryConfigProvider"
# Kafka's ConfigTransformer pattern: ${provider:[path:]key}
VARIABLE = re.compile(r"\$\{([^}]*?):(?:([^}]*?):)?([^}]*?)\}")
PARAMETERS = {ENV: {"allowlist.pattern"}, FILE: {"allowed.paths"}, DIRECTORY: {"allowed.paths"}}


class Unresolved(Exception):
    """A variable a configured provider cannot give a value for (the message names no value)."""


@dataclass(frozen=True)
class Provider:
    """One configured provider: its class and its ``param.*`` settings."""

    name: str
    kind: str
    params: Mapping[str, str]

    def value(self, path: str | None, key: str) -> str:
        lookups: dict[str, Callable[[str | None, str], str]] = {ENV: self._env, FILE: self._file, DIRECTORY: self._dir}
        return lookups[self.kind](path, key)

    def _env(self, path: str | None, key: str) -> str:
        pattern = self.params.get("allowlist.pattern", ".*")
        if not re.fullmatch(pattern, key):
            raise Unresolved(f"the environment variable {key} is not allowed by allowlist.pattern {pattern!r}")
        if key not in os.environ:
            raise Unresolved(f"the environment variable {key} is not set")
        return os.environ[key]

    def _allowed(self, path: Path) -> None:
        allowed = [Path(p.strip()).resolve() for p in self.params.get("allowed.paths", "").split(",") if p.strip()]
        if allowed and not any(path.resolve().is_relative_to(root) for root in allowed):
            raise Unresolved(f"{path} is outside allowed.paths")

    def _file(self, path: str | None, key: str) -> str:
        if not path:
            raise Unresolved("a file variable is ${" + self.name + ":<properties file>:<key>}")
        file = Path(path)
        self._allowed(file)
        try:
            values = parse_properties(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise Unresolved(f"cannot read {file}: {getattr(exc, 'strerror', None) or type(exc).__name__}") from None
        if key not in values:
            raise Unresolved(f"{file} has no key {key}")
        return values[key]

    def _dir(self, path: str | None, key: str) -> str:
        if not path:
            raise Unresolved("a directory variable is ${" + self.name + ":<directory>:<file name>}")
        file = Path(path) / key
        self._allowed(file)
        if file.parent.resolve() != Path(path).resolve():
            raise Unresolved(f"{key} is not a file name inside {path}")
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise Unresolved(f"cannot read {file}: {getattr(exc, 'strerror', None) or type(exc).__name__}") from None


def providers(raw: Mapping[str, str]) -> tuple[dict[str, Provider], list[tuple[str, str]]]:
    """The providers ``config.providers`` names, and the problems of their settings."""
    problems: list[tuple[str, str]] = []
    names = [n.strip() for n in raw.get(PREFIX, "").split(",") if n.strip()]
    found: dict[str, Provider] = {}
    for name in names:
        key = f"{PREFIX}.{name}.class"
        kind = raw.get(key)
        if kind not in PARAMETERS:
            problems.append((key, f"must name one of Kafka's config providers ({', '.join(sorted(PARAMETERS))})"
                             + (f", not {kind!r}" if kind else "; it is not set")))
            continue
        prefix = f"{PREFIX}.{name}.param."
        params = {k[len(prefix):]: v for k, v in raw.items() if k.startswith(prefix)}
        for param in sorted(set(params) - PARAMETERS[kind]):
            problems.append((prefix + param, f"unknown parameter of {kind.rsplit('.', 1)[1]} "
                             f"(it takes {', '.join(sorted(PARAMETERS[kind]))})"))
        if "allowlist.pattern" in params:
            try:
                re.compile(params["allowlist.pattern"])
            except re.error as exc:
                problems.append((prefix + "allowlist.pattern", f"not a regular expression: {exc}"))
                continue
        found[name] = Provider(name, kind, params)
    for key in raw:
        if key.startswith(PREFIX + ".") and key.split(".")[2] not in found and key.split(".")[2] not in names:
            problems.append((key, f"configures a provider that {PREFIX} does not list"))
    return found, problems


@dataclass(frozen=True)
class Resolved:
    """The properties with their variables replaced, the problems, and each resolved value with the text
    it was written as: messages show that text, never the value (:meth:`mask`)."""

    properties: dict[str, str]
    problems: list[tuple[str, str]]
    written: dict[str, str]

    def mask(self, text: str) -> str:
        """``text`` with every resolved value (and its escaped form, as ``repr`` quotes it) replaced by the
        property text it came from."""
        for value, written in sorted(self.written.items(), key=lambda item: -len(item[0])):
            if len(value) < MASKED_FROM:
                continue
            for form in {value, repr(value)[1:-1]}:
                text = text.replace(form, written)
        return text


#: Values shorter than this are left in messages (``true``, a port): nothing secret is that short, and
#: masking them would garble the words around them.
MASKED_FROM = 4


def resolve(raw: Mapping[str, str]) -> Resolved:
    """``raw`` with every variable of a configured provider replaced by its value, and the problems."""
    configured, problems = providers(raw)
    if not configured:
        return Resolved(dict(raw), problems, {})
    resolved: dict[str, str] = {}
    written: dict[str, str] = {}
    for key, value in raw.items():
        if key.startswith(PREFIX):
            resolved[key] = value
            continue

        def substitute(match: re.Match[str], key: str = key) -> str:
            provider = configured.get(match.group(1))
            if provider is None:
                return match.group(0)
            try:
                return provider.value(match.group(2), match.group(3))
            except Unresolved as exc:
                problems.append((key, f"{match.group(0)}: {exc}"))
                return match.group(0)

        resolved[key] = VARIABLE.sub(substitute, value)
        if resolved[key] != value:
            written[resolved[key]] = value
    return Resolved(resolved, problems, written)
