"""``mongocdc run``: the connector as a command, with progress and a graceful SIGTERM/SIGINT.

The command only wires things together (config, sink, offset store, engine) and draws progress;
everything it runs is the public engine API, so the Dagster assets and this command behave alike.
Everything it says on stderr is a log event (``mongocdc_core.logs``): rich lines and progress bars on a
terminal, one line (or one JSON object) per event elsewhere.
Exit codes (documented in docs/connector.md): see ``EXIT_CODES``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from types import FrameType

from bson import Timestamp
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from mongocdc_core.config import ConfigError, ConnectorConfig
from mongocdc_core.coordinator import Engine, RunSummary
from mongocdc_core.failures import EventProcessingError
from mongocdc_core.logs import LogFormat, add_log_format_option, command_logging, fields, signal_safe_line
from mongocdc_core.metrics.prometheus import PrometheusExporter
from mongocdc_core.offsets import OffsetError, open_offset_store
from mongocdc_core.positions import Position
from mongocdc_core.progress_log import LogProgress
from mongocdc_core.receiver import ConnectionState, ProgressListener
from mongocdc_core.sinks.base import SinkError
from mongocdc_core.sinks.factory import open_sink
from mongocdc_core.source.errors import (
    AuthenticationError,
    CdcError,
    ChangeStreamFailedError,
    ConnectError,
    HistoryLostError,
    OffsetInvalidError,
)

log = logging.getLogger("mongocdc")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_AUTHENTICATION = 4
EXIT_HISTORY_LOST = 5
EXIT_STREAM_FAILED = 6
EXIT_OFFSETS_INVALID = 7
EXIT_EVENT_FAILED = 8
# The most specific class first: a user's scripts can tell "retry later" from "act now".
_EXIT_FOR: tuple[tuple[type[BaseException], int], ...] = (
    (AuthenticationError, EXIT_AUTHENTICATION),
    (ConnectError, EXIT_UNREACHABLE),
    (HistoryLostError, EXIT_HISTORY_LOST),
    (ChangeStreamFailedError, EXIT_STREAM_FAILED),
    (OffsetInvalidError, EXIT_OFFSETS_INVALID),
    (EventProcessingError, EXIT_EVENT_FAILED),
)


def exit_code(exc: BaseException) -> int:
    """The documented exit code of a failed run."""
    return next((code for kind, code in _EXIT_FOR if isinstance(exc, kind)), EXIT_FAILED)


class ReadyLine(ProgressListener):
    """Prints one ``streaming`` line on stdout when streaming begins, for scripts waiting on it,
    and logs the connection state while MongoDB does not answer."""

    def streaming_started(self, position: Position | None) -> None:
        start = position.to_str() if position else "now"
        print(f"mongocdc: streaming after {start}", flush=True)

    def connecting(self, state: ConnectionState) -> None:
        log.warning(state.line())

    def __enter__(self) -> ReadyLine:
        return self

    def __exit__(self, *exc: object) -> None:
        """Nothing drawn, nothing to stop (a bar that is drawn stops here)."""


class RateColumn(ProgressColumn):
    """Documents (or events) per second of a task, as rich measures it over its recent updates."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


TOTAL = "snapshot (all collections)"


class LineProgress(LogProgress, ReadyLine):
    """Progress where no bar can be drawn (stderr is not a terminal, or JSON logs): counts, rate and
    ETA as log lines every few seconds, and the ``streaming`` line on stdout."""

    def streaming_started(self, position: Position | None) -> None:
        ReadyLine.streaming_started(self, position)
        LogProgress.streaming_started(self, position)


class RichProgress(ReadyLine):
    """Snapshot bars per collection and in total (count, rate, ETA) and a streaming counter, on a terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            RateColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._copied: dict[str, int] = {}
        self._total_task: TaskID | None = None
        self._stream_task: TaskID | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def snapshot_started(self, totals: Mapping[str, int | None]) -> None:
        with self._lock:
            for namespace, total in totals.items():
                self._tasks[namespace] = self.progress.add_task(f"snapshot {namespace}", total=total)
            known = [t for t in totals.values() if t is not None]
            if len(totals) > 1:
                self._total_task = self.progress.add_task(TOTAL, total=sum(known) if known else None)

    def _update_total(self) -> None:
        if self._total_task is not None:
            self.progress.update(self._total_task, completed=sum(self._copied.values()))

    def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
        with self._lock:
            task = self._tasks.get(namespace)
            if task is None:
                task = self._tasks[namespace] = self.progress.add_task(f"snapshot {namespace}", total=total)
            self.progress.update(task, completed=copied, total=max(total or 0, copied) or None)
            self._copied[namespace] = copied
            self._update_total()

    def snapshot_collection_done(self, namespace: str, copied: int) -> None:
        with self._lock:
            task = self._tasks.get(namespace)
            if task is not None:
                self.progress.update(task, completed=copied, total=copied)
            self._copied[namespace] = copied
            self._update_total()

    def snapshot_finished(self, completed: bool, documents: int) -> None:
        state = "completed" if completed else "stopped"
        log.info(f"snapshot {state}: {documents} documents")

    def streaming_started(self, position: Position | None) -> None:
        super().streaming_started(position)
        with self._lock:
            self._stream_task = self.progress.add_task("streaming events", total=None)

    def streaming_progress(self, events: int, counts: Mapping[str, int], position: Position | None) -> None:
        with self._lock:
            if self._stream_task is not None:
                detail = " ".join(f"{op}={n}" for op, n in sorted(counts.items()))
                self.progress.update(self._stream_task, completed=events, description=f"streaming events {detail}")


def progress_listener(console: Console, fmt: LogFormat) -> ReadyLine:
    """Bars on a terminal; elsewhere (a file, a log shipper, JSON logs) counts, rate and ETA as log lines
    of ``mongocdc.progress``, one event a line, never a bar's control codes."""
    if fmt == "text" and console.is_terminal:
        return RichProgress(console)
    return LineProgress(logging.getLogger("mongocdc.progress"))


def _port(text: str) -> int:
    """A TCP port for ``--metrics-port``; argparse turns the error into one usage line."""
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port between 1 and 65535, got {text!r}")
    return int(text)
def parse_stop_at(text: str) -> Timestamp:
    """``SECONDS[:INCREMENT]`` (a BSON timestamp, as ``Timestamp(seconds, increment)``)."""
    seconds, _, increment = text.partition(":")
    try:
        return Timestamp(int(seconds), int(increment or 0))
    except (ValueError, TypeError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"expected SECONDS[:INCREMENT], a cluster time such as 1735689600:1, got {text!r}"
        ) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of events, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mongocdc run", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="Debezium connector JSON or .properties file")
    parser.add_argument("--sink", required=True, help="jsonl:DIR, parquet:DIR or kafka:HOST:PORT")
    parser.add_argument("--offsets", required=True, help="offset store: PATH, file:PATH or kafka:HOST:PORT[/TOPIC]")
    parser.add_argument("--max-events", type=_positive_int, default=None, help="stop after this many change events")
    parser.add_argument(
        "--stop-at", type=parse_stop_at, default=None, metavar="SECONDS[:INC]",
        help="stop once every change up to this cluster time was delivered",
    )
    parser.add_argument(
        "--until-idle", type=_seconds, default=None,
        help="stop after MongoDB reported nothing new for this many seconds",
    )
    parser.add_argument("--metrics-file", default=None, help="rewrite Debezium metrics as JSON here while running")
    parser.add_argument("--metrics-port", type=_port, default=None,
                        help="serve the metrics in Prometheus format on this port (overrides mongocdc.metrics.port)")
    parser.add_argument("--no-progress", action="store_true", help="no progress display (bars or progress lines)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="log level (log-channel notifications are INFO)")
    add_log_format_option(parser)
    return parser


class _Stopper:
    """Signal handler: the first SIGTERM/SIGINT asks the engine to stop, later ones are noted.

    It writes with ``os.write`` only: a handler runs between two bytecodes of the main thread,
    possibly while that thread holds rich's console lock or the log handler's, so it must not log.
    """

    def __init__(self, engine: Engine, handler: logging.Handler) -> None:
        self.engine = engine
        self.handler = handler
        self.received = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received += 1
        name = signal.Signals(signum).name
        if self.received == 1:
            message = f"{name}: stopping after the current batch"
        else:
            message = f"{name}: already stopping (flushing the sink, saving the offset)"
        os.write(sys.stderr.fileno(), signal_safe_line(self.handler, log.name, message))
        self.engine.stop()


def _report_metrics(engine: Engine) -> None:
    """The metrics' lines of the closing summary, also when the run ends in an error (an outage that
    outlasted the retries still shows the disconnects it counted)."""
    for line in engine.metrics.summary().splitlines():
        log.info(line)


def _report(engine: Engine, summary: RunSummary) -> None:
    """The closing summary: one event per line of it, the metrics as fields of the last one."""
    _report_metrics(engine)
    if summary.stopped_because == "snapshot_only" and not summary.snapshot_performed:
        log.info(f"snapshot already complete (snapshot.mode={engine.cfg.snapshot_mode} takes it once and does not "
                 "stream): nothing to do", extra=fields(metrics=engine.metrics.contexts()))
        return
    log.info(f"stopped: {summary.stopped_because}; {summary.records} records, {summary.events} change events",
             extra=fields(stopped_because=summary.stopped_because, records=summary.records, events=summary.events,
                          metrics=engine.metrics.contexts()))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(stderr=True, soft_wrap=True)  # paths and messages stay on one line, unbroken
    fmt, handler = command_logging("mongocdc", args.log_format, args.log_level, console)
    try:
        cfg = ConnectorConfig.load(args.config)
    except (ConfigError, OSError) as exc:
        log.error(f"invalid configuration {args.config}:\n{exc}")
        return EXIT_USAGE
    try:
        sink = open_sink(args.sink, cfg)
    except (ValueError, SinkError) as exc:
        log.error(f"cannot open sink {args.sink}: {exc}")
        return EXIT_USAGE
    try:
        offsets = open_offset_store(args.offsets, cfg, sink)
    except (ValueError, OffsetError) as exc:
        sink.close()
        log.error(f"cannot open offsets {args.offsets}: {exc}")
        return EXIT_USAGE
    listener = ReadyLine() if args.no_progress else progress_listener(console, fmt)
    engine = Engine(cfg, sink, offsets, progress=listener, metrics_file=args.metrics_file)
    port = cfg.mongocdc_metrics_port if args.metrics_port is None else args.metrics_port
    exporter = PrometheusExporter(engine.metrics, port) if port else None
    try:
        if exporter is not None:
            exporter.start()
            log.info(f"metrics on http://0.0.0.0:{exporter.port}/metrics")
    except OSError as exc:
        sink.close()
        offsets.close()
        log.error(f"--metrics-port / mongocdc.metrics.port: {exc.strerror or exc}")
        return EXIT_USAGE
    stopper = _Stopper(engine, handler)
    signal.signal(signal.SIGTERM, stopper)
    signal.signal(signal.SIGINT, stopper)
    bounds = {"max_events": args.max_events, "until_idle": args.until_idle, "stop_at": args.stop_at}
    try:
        with listener:
            summary = engine.run(**bounds)
    except (CdcError, SinkError, OffsetError, EventProcessingError) as exc:
        _report_metrics(engine)
        log.error(str(exc), extra=fields(metrics=engine.metrics.contexts()))
        return exit_code(exc)
    finally:
        if exporter is not None:
            exporter.stop()
        sink.close()
        offsets.close()
    _report(engine, summary)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
