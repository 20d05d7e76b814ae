"""The one error type of the configuration, and the "did you mean" hint every message shares."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from mongocdc_core.quoting import TEXT_LIMIT, bounded

#: Longer than any real property name (a filter override names a database and a collection).
_NAME_LIMIT = 512


class ConfigError(ValueError):
    """Invalid connector configuration; `problems` holds one (property, message) pair per problem.

    Each name and message is cut to a bounded prefix: a megabyte-long bad value is quoted, not printed.
    """

    def __init__(self, problems: Iterable[tuple[str, str]]) -> None:
        self.problems: tuple[tuple[str, str], ...] = tuple(
            (bounded(prop, _NAME_LIMIT), bounded(msg, TEXT_LIMIT)) for prop, msg in problems
        )
        lines = [f"  {prop}: {msg}" for prop, msg in self.problems]
        noun = "problem" if len(self.problems) == 1 else "problems"
        super().__init__(f"invalid connector configuration ({len(self.problems)} {noun}):\n" + "\n".join(lines))

    @property
    def properties(self) -> tuple[str, ...]:
        """The names of the offending properties, in report order."""
        return tuple(prop for prop, _ in self.problems)


class Invalid(Exception):
    """A single property value could not be converted."""




def suggest(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or nothing when none is close."""
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""
