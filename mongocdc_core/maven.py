"""Jars from a Maven repository for the JVMs mongocdc starts (Spark's tables, the local Kafka broker): where
they are looked for and how a pip user gets them, in one place.

Each set is named by a pom that ships inside the package and lists every jar with its transitive
dependencies excluded, so the pom is the whole list: ``make setup`` hands it to Maven (copy-dependencies
into the checkout's ``.jars/<name>``), and an installed mongocdc reads it here to find, or fetch from Maven
Central, the very same files. :meth:`JarSet.find` looks, in order, in the directory the user names (an
argument or the set's environment variable), a checkout's ``.jars/<name>`` (``make setup``), then the user
cache the set's command fills (``$XDG_CACHE_HOME/mongocdc/<name>-jars``, or ``~/.cache/...``).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ENV_REPOSITORY = "MONGOCDC_MAVEN_REPOSITORY"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
#: A checkout's ``.jars`` (``make setup``); in an installed package it does not exist.
CHECKOUT_JARS = Path(__file__).resolve().parents[1] / ".jars"

EXIT_OK, EXIT_FAILED = 0, 1


class JarsError(RuntimeError):
    """A set's jars cannot be had: a named directory lacks some, none is anywhere, or a download failed."""


@dataclass(frozen=True)
class Artifact:
    """One jar of a pom, as Maven names it."""

    group: str
    name: str
    version: str

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.name}:{self.version}"

    @property
    def file_name(self) -> str:
        """The name Maven's copy-dependencies (and :meth:`JarSet.download`) gives the file."""
        return f"{self.name}-{self.version}.jar"

    def url(self, repository: str) -> str:
        return f"{repository.rstrip('/')}/{self.group.replace('.', '/')}/{self.name}/{self.version}/{self.file_name}"


def artifacts(pom: Path) -> list[Artifact]:
    """The pom's dependencies with its ``${property}`` versions filled in."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(pom).getroot()
    props = {p.tag.split("}", 1)[1]: p.text or "" for p in root.findall("m:properties/*", ns)}

    def text(node: ET.Element, tag: str) -> str:
        value = node.findtext(f"m:{tag}", default="", namespaces=ns).strip()
        for key, replacement in props.items():
            value = value.replace("${" + key + "}", replacement)
        return value

    return [Artifact(text(d, "groupId"), text(d, "artifactId"), text(d, "version"))
            for d in root.findall("m:dependencies/m:dependency", ns)]


def repository(chosen: str | None = None) -> str:
    """The Maven repository to fetch from: the one chosen, else ``MONGOCDC_MAVEN_REPOSITORY``, else Maven Central."""
    return chosen or os.environ.get(ENV_REPOSITORY) or MAVEN_CENTRAL


def user_cache_dir() -> Path:
    """mongocdc's directory in the user's cache: ``$XDG_CACHE_HOME/mongocdc``, or ``~/.cache/mongocdc``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mongocdc"


@dataclass(frozen=True)
class JarSet:
    """The jars one pom lists, and where they are looked for (see the module docstring)."""

    name: str
    """``.jars/<name>`` in a checkout, ``<name>-jars`` in the user cache."""
    what: str
    """What they are, for messages ("the Kafka broker's jars")."""
    pom: Path
    env: str
    """The environment variable naming a directory that holds them."""
    command: str
    """The command that downloads them ("mongocdc kafka jars")."""
    other_way: str = ""
    """A further way to get them, beyond the ones every set has (Spark's own package mechanism)."""

    def artifacts(self) -> list[Artifact]:
        return artifacts(self.pom)

    @property
    def checkout(self) -> Path:
        return CHECKOUT_JARS / self.name

    @staticmethod
    def in_checkout() -> bool:
        """Whether this mongocdc runs from a checkout (where ``make setup`` can fetch the jars), not a wheel."""
        return (CHECKOUT_JARS.parent / "Makefile").is_file()

    def user_cache(self) -> Path:
        """Where :attr:`command` puts the jars when no directory is named."""
        return user_cache_dir() / f"{self.name}-jars"

    def missing(self, folder: Path) -> list[Artifact]:
        """The pom's artifacts that ``folder`` lacks (all of them when it does not exist)."""
        have = {p.name for p in folder.glob("*.jar")} if folder.is_dir() else set()
        return [a for a in self.artifacts() if a.file_name not in have]

    def paths(self, folder: Path) -> list[Path]:
        """The pom's jars in ``folder``, in the pom's order (a class path of exactly these files)."""
        return [folder / a.file_name for a in self.artifacts()]

    def how_to(self) -> str:
        """The ways to get the jars, for an error that has none."""
        ways = [f"run `{self.command}` (downloads them from {repository()} into {self.user_cache()}; "
                "`--dir DIR` for a copy to carry to a machine without network)",
                f"set {self.env} to a directory holding them"]
        if self.in_checkout():
            ways.append(f"run `make setup` (Maven, into {self.checkout})")
        if self.other_way:
            ways.append(self.other_way)
        return ", ".join(ways[:-1]) + ", or " + ways[-1]

    def find(self, named: Path | None = None) -> Path | None:
        """The first folder holding every jar: ``named`` or the one ``env`` names (which then must hold
        them all: JarsError otherwise), else the checkout's, else the user cache; None when neither has them."""
        env_value = os.environ.get(self.env)
        if named is not None or env_value:
            folder = (named if named is not None else Path(str(env_value))).expanduser()
            label = str(folder) if named is not None else f"{self.env}={folder}"
            if not folder.is_dir():
                raise JarsError(f"{label} is not a directory; {self.how_to()}")
            lacking = self.missing(folder)
            if lacking:
                names = ", ".join(a.file_name for a in lacking[:5]) + (f" and {len(lacking) - 5} more"
                                                                       if len(lacking) > 5 else "")
                raise JarsError(f"{label} lacks {names} ({self.what}); {self.how_to()}")
            return folder
        for folder in (self.checkout, self.user_cache()):
            if not self.missing(folder):
                return folder
        return None

    def require(self, named: Path | None = None) -> Path:
        """:meth:`find`, for a set that has no other way: JarsError naming the ways when none has them."""
        found = self.find(named)
        if found is None:
            places = f"neither {self.checkout} nor {self.user_cache()} holds" if self.in_checkout() \
                else f"{self.user_cache()} does not hold"
            raise JarsError(f"{self.what} are missing: {self.env} is not set and {places} them; {self.how_to()}")
        return found

    def download(self, folder: Path, repo: str | None = None,
                 progress: Callable[[int, int, Artifact], None] | None = None) -> list[Path]:
        """Fetch every jar of the pom into ``folder`` (checked against the repository's SHA-1), skipping those
        already there; returns the jars' paths. Each file appears whole or not at all."""
        source = repository(repo)
        wanted = self.artifacts()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JarsError(f"cannot make the directory {folder} for {self.what}: {exc.strerror or exc}") from exc
        lacking = set(self.missing(folder))
        for done, artifact in enumerate(wanted, 1):
            if artifact in lacking:
                _fetch(artifact, source, folder)
            if progress is not None:
                progress(done, len(wanted), artifact)
        return self.paths(folder)


def _fetch(artifact: Artifact, repo: str, folder: Path) -> None:
    url = artifact.url(repo)
    try:
        handle, name = tempfile.mkstemp(dir=folder, prefix=artifact.file_name, suffix=".part")
    except OSError as exc:
        raise JarsError(f"cannot write {artifact.file_name} into {folder}: {exc.strerror or exc}") from exc
    os.close(handle)
    part = Path(name)
    try:
        with urllib.request.urlopen(url + ".sha1", timeout=60) as reply:
            words = reply.read().decode("ascii", "replace").split()
        if not words:
            raise JarsError(f"{url}.sha1 is empty: the repository gives no checksum to check the jar against")
        expected = words[0].strip().lower()
        digest = hashlib.sha1()
        with urllib.request.urlopen(url, timeout=60) as reply, part.open("wb") as out:
            while chunk := reply.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise JarsError(f"{url} does not match its SHA-1 ({digest.hexdigest()} != {expected}); not kept")
        shutil.move(part, folder / artifact.file_name)
    except (urllib.error.URLError, OSError) as exc:
        raise JarsError(f"could not download {artifact.coordinate} from {url}: {exc}") from exc
    finally:
        part.unlink(missing_ok=True)


def add_download_arguments(parser: argparse.ArgumentParser, jars: JarSet) -> None:
    """The options of a set's download command (``mongocdc tables jars``, ``mongocdc kafka jars``)."""
    parser.add_argument("--dir", type=Path, default=None,
                        help=f"put them here (default: {jars.user_cache()}, where they are looked for "
                             f"without {jars.env})")
    parser.add_argument("--repository", default=None,
                        help=f"a Maven repository to fetch from (default: {ENV_REPOSITORY} or Maven Central)")


def download_command(jars: JarSet, folder: Path | None, repo: str | None, log: logging.Logger) -> int:
    """A set's download command: one line per jar, then where they are and how to point at them; exit 1
    (the failure in one line, nothing half-written kept) when a jar cannot be fetched."""
    target = folder if folder is not None else jars.user_cache()

    def report(done: int, total: int, artifact: Artifact) -> None:
        log.info(f"[{done}/{total}] {artifact.coordinate}")

    try:
        paths = jars.download(target, repo, report)
    except JarsError as exc:
        log.error(f"{jars.command}: {exc}")
        return EXIT_FAILED
    size = sum(p.stat().st_size for p in paths)
    log.info(f"{len(paths)} jars ({size / 1e6:.1f} MB) in {target}")
    if folder is not None:
        log.info(f"point mongocdc at them with {jars.env}={target}")
    return EXIT_OK
