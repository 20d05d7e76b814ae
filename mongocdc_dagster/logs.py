"""A Dagster run's console lines in mongocdc's format (``MONGOCDC_LOG_FORMAT``), for log shippers.

Dagster passes every event of a run (its own, ``context.log``'s, and the records of the Python loggers the
instance captures: ``python_logs.managed_python_loggers`` in dagster.yaml) to the run's loggers; ``console``
writes them to the process's stderr. The definitions give ``console`` this logger, which writes as
:mod:`mongocdc_core.logs` does:

- ``text`` on a terminal: Dagster's own coloured lines;
- ``text`` elsewhere: one line per event (``<time> <LEVEL> dagster: <job> - <run id> - <step> - <message>``;
  Dagster's events with their pid and type), never wrapped, a failure's traceback on the same line;
- ``json``: one object per line: ``timestamp``, ``level``, ``logger``, ``message`` (as logged), ``run_id``,
  ``job``, ``step_key`` and ``event_type`` where there is one, ``error`` for a failure, and the record's own
  fields (a notification under ``notification``).

From INFO on by default (Dagster's own events are DEBUG, a failure ERROR), as dagster.yaml's
``python_log_level``; ``loggers: {console: {config: {log_level: DEBUG}}}`` shows them all, and
``log_format`` in that config wins over ``MONGOCDC_LOG_FORMAT`` (``mongocdc check --log-format``).

Dagster uses a code location's loggers only for a run whose config names them (dagster-io/dagster#20084);
a run whose config names none (the UI's Materialize, the automation sensor: the implicit asset job, which
takes no default config) gets Dagster's default system loggers, its coloured console. Dagster has no
setting for those: ``python_log_level`` silences the coloured logger only with ``context.log`` and the
captured records, and handlers from ``python_logs.dagster_handler_config`` print beside it, not instead.
``use_for_runs_without_loggers`` makes ``console`` the default system logger of the process that loads
the definitions (the run's worker); ``RUN_CONFIG`` names it for runs mongocdc requests itself.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dagster import (
    DagsterInstance,
    Enum,
    EnumValue,
    Field,
    InitLoggerContext,
    LoggerDefinition,
    colored_console_logger,
    logger,
)
from dagster._core.execution import context_creation_job
from dagster._core.log_manager import LOG_RECORD_METADATA_ATTR

from mongocdc_core.logs import LOG_FORMATS, JsonFormatter, LogFormat, OneLineFormatter, log_format


class _RunFields(logging.Filter):
    """A run's record for JSON: the message as logged, the run's context as fields next to the record's own."""

    def filter(self, record: logging.LogRecord) -> bool:
        meta = getattr(record, LOG_RECORD_METADATA_ATTR, None)
        if not isinstance(meta, Mapping):
            return True
        event = meta.get("dagster_event")
        context: dict[str, Any] = {
            "run_id": meta.get("run_id"),
            "job": meta.get("job_name"),
            "step_key": meta.get("step_key"),
            "event_type": event.event_type.name if event is not None else None,  # RUN_SUCCESS, as the UI names it
            "error": _error_text(event),
        }
        own = getattr(record, "fields", None)
        record.fields = {**{k: v for k, v in context.items() if v is not None},
                         **(own if isinstance(own, Mapping) else {})}
        record.msg, record.args = meta.get("orig_message", record.getMessage()), ()
        return True


class NotARunsRecord(logging.Filter):
    """For a command's own handler (``mongocdc check``): drops the records a run captured (the instance's
    ``python_logs`` loggers), which reach the run's console logger and would otherwise print twice."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not hasattr(record, LOG_RECORD_METADATA_ATTR)


def _error_text(event: object) -> str | None:
    """A failure event's error (the traceback Dagster shows under the message), else None."""
    error = getattr(getattr(event, "event_specific_data", None), "error", None)
    return error.to_string() if error is not None else None  # type: ignore[no-any-return]


@logger(
    {
        "log_level": Field(str, is_required=False, default_value="INFO",
                           description="The logger's threshold (Dagster's own DEBUG events left out by default)."),
        "name": Field(str, is_required=False, default_value="dagster", description="The logger's name."),
        "log_format": Field(Enum("LogFormat", [EnumValue(f) for f in LOG_FORMATS]), is_required=False,
                            description="text or json; default from MONGOCDC_LOG_FORMAT (mongocdc check "
                                        "--log-format sets it)."),
    },
    description="Dagster's console logger in mongocdc's format (MONGOCDC_LOG_FORMAT: text or json).",
)
def console_logger(init_context: InitLoggerContext) -> logging.Logger:
    config = init_context.logger_config
    fmt = config.get("log_format") or log_format()  # a bad value fails the run at its start, naming MONGOCDC_LOG_FORMAT
    if fmt == "text" and sys.stderr.isatty():
        return colored_console_logger.logger_fn(init_context)  # type: ignore[no-any-return]
    run_logger = logging.Logger(config["name"], level=config["log_level"].upper())
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
        handler.addFilter(_RunFields())
    else:
        handler.setFormatter(OneLineFormatter())
    run_logger.addHandler(handler)
    return run_logger


#: The definitions' loggers: one object for every connector, so that their definitions merge.
LOGGERS = {"console": console_logger}
#: The run config that makes a run use them.
RUN_CONFIG: dict[str, Any] = {"loggers": {"console": {}}}


def run_config(fmt: LogFormat) -> dict[str, Any]:
    """``RUN_CONFIG`` in the format a command was asked for (``--log-format``), whatever the environment says."""
    return {"loggers": {"console": {"config": {"log_format": fmt}}}}


def _default_system_loggers(instance: DagsterInstance | None) -> Sequence[tuple[LoggerDefinition, Mapping[str, object]]]:
    """``console`` where Dagster would use its coloured one, at the instance's ``python_log_level``."""
    level = instance.python_log_level if instance is not None and instance.python_log_level else "INFO"
    return [(console_logger, {"name": "dagster", "log_level": level})]


#: Set to ``dagster`` to keep Dagster's own coloured console for runs whose config names no logger.
KEEP_DAGSTER_CONSOLE_ENV = "MONGOCDC_DAGSTER_RUN_LOGS"


def use_for_runs_without_loggers() -> None:
    """Make ``console`` the logger of every run of this process whose config names no logger.

    Dagster (``context_creation_job.create_log_manager``, private) falls back to ``default_system_loggers``
    there; this process loads a mongocdc code location, so its runs (other assets of the same code location
    too) log as mongocdc does, from the instance's ``python_log_level`` (INFO when unset, where Dagster's
    own starts at DEBUG). ``MONGOCDC_DAGSTER_RUN_LOGS=dagster`` keeps Dagster's. Pinned by
    tests/dagster/test_run_logs.py; a Dagster without that function keeps its console and says so once.
    """
    if os.environ.get(KEEP_DAGSTER_CONSOLE_ENV, "").strip().lower() == "dagster":
        return
    if not callable(getattr(context_creation_job, "default_system_loggers", None)):
        logging.getLogger(__name__).warning(
            "this Dagster has no context_creation_job.default_system_loggers, which mongocdc replaces so that runs "
            "without logger config log in its format: those runs keep Dagster's console")
        return
    context_creation_job.default_system_loggers = _default_system_loggers
