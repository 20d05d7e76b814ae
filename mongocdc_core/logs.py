"""Where mongocdc's logs go and how they look: the one logging set-up of every mongocdc process.

Three shapes, chosen by ``--log-format`` (or ``MONGOCDC_LOG_FORMAT`` for processes started by
``make dev`` or Dagster) and by whether stderr is a terminal:

- ``text`` on a terminal: rich's log lines (colour, wrapped to the terminal, progress bars above them);
- ``text`` elsewhere (a file, a pipe, a log shipper): one line per event, never wrapped, no colour;
  a line break inside a message is written as ``\\n`` so that no event spans two lines;
- ``json``: one JSON object per line with ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``,
  ``message``, ``exception`` when there is one, and the event's structured fields (a notification
  under ``notification``), wherever stderr goes.

Structured fields ride on a record as ``extra={"fields": {...}}`` (see ``fields``).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, Literal, cast

import orjson
from rich.console import Console
from rich.logging import RichHandler

ENV_LOG_FORMAT = "MONGOCDC_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]


def log_format(requested: str | None = None) -> LogFormat:
    """The format asked for on the command line, else in ``MONGOCDC_LOG_FORMAT``, else ``text``."""
    value = (requested or os.environ.get(ENV_LOG_FORMAT) or "text").strip().lower()
    if value not in LOG_FORMATS:
        source = "--log-format" if requested else ENV_LOG_FORMAT
        raise ValueError(f"{source}: expected one of {', '.join(LOG_FORMATS)}, got {value!r}")
    return cast(LogFormat, value)


def fields(**values: Any) -> dict[str, dict[str, Any]]:
    """``extra=`` for a log call whose event has structured fields (JSON logs show them as fields)."""
    return {"fields": values}


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class OneLineFormatter(logging.Formatter):
    """``2026-05-01T10:00:03.123Z INFO logger: message``, one event per line whatever the message holds."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text.replace("\r", "\\r").replace("\n", "\\n")


class JsonFormatter(logging.Formatter):
    """One JSON object per event (see the module docstring for its fields)."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "timestamp": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        extra = getattr(record, "fields", None)
        if isinstance(extra, Mapping):
            event.update({key: value for key, value in extra.items() if key not in event})
        return orjson.dumps(event, default=str).decode()


def log_handler(fmt: LogFormat, console: Console | None = None) -> logging.Handler:
    """The handler of one format on ``console``'s stream (stderr by default): see the module docstring.

    On a terminal the rich handler shares ``console`` with the progress bars, so lines print above them.
    """
    console = console or Console(stderr=True, soft_wrap=True)
    if fmt == "text" and console.is_terminal:
        return RichHandler(console=console, show_path=False, rich_tracebacks=False, markup=False)
    handler = logging.StreamHandler(console.file)
    handler.setFormatter(JsonFormatter() if fmt == "json" else OneLineFormatter())
    return handler


def configure_logging(fmt: LogFormat, level: str = "INFO", console: Console | None = None) -> logging.Handler:
    """Route every logger of this process through ``log_handler`` (replacing earlier handlers), Python's
    warnings too (logger ``py.warnings``: one event, not a message and a source line)."""
    handler = log_handler(fmt, console)
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.captureWarnings(True)
    logging.getLogger("pymongo").setLevel(max(logging.WARNING, logging.getLevelName(level)))
    return handler


def add_log_format_option(parser: argparse.ArgumentParser) -> None:
    """``--log-format``, as every mongocdc command takes it."""
    parser.add_argument("--log-format", default=None, choices=LOG_FORMATS,
                        help=f"text (default; one line per event unless stderr is a terminal) or json "
                             f"(one object per line); default from {ENV_LOG_FORMAT}")


def command_logging(prog: str, requested: str | None, level: str,
                    console: Console | None = None) -> tuple[LogFormat, logging.Handler]:
    """A command's logging (``configure_logging``) in the format asked for (``log_format``); a bad one
    ends the command as a usage error (exit 2) naming it, as argparse ends a bad argument."""
    try:
        fmt = log_format(requested)
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return fmt, configure_logging(fmt, level, console)


def signal_safe_line(handler: logging.Handler, logger: str, message: str) -> bytes:
    """One event formatted for ``os.write`` by a signal handler, which must not take the handler's lock
    (the interrupted thread may hold it). On a terminal it starts on a fresh line, below a progress bar."""
    if isinstance(handler, RichHandler):
        return f"\n{logger}: {message}\n".encode()
    record = logging.LogRecord(logger, logging.WARNING, __file__, 0, message, None, None)
    return (handler.format(record) + "\n").encode()
