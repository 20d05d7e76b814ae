"""``mongocdc run``: the connector as a command, with rich progress and a graceful SIGTERM.

The command only wires things together (config, sink, offset store, engine) and draws progress;
everything it runs is the public engine API, so the Dagster assets and this command behave alike.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Mapping
from types import FrameType

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
from mongocdc_core.dispatcher import ProgressListener
from mongocdc_core.engine import Engine
from mongocdc_core.metrics.prometheus import PrometheusExporter
from mongocdc_core.offsets import OffsetError, open_offset_store
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import SinkError
from mongocdc_core.sinks.factory import open_sink
from mongocdc_core.source.errors import CdcError


class ReadyLine(ProgressListener):
    """Prints one ``streaming`` line on stdout when streaming begins, for scripts waiting on it."""

    def streaming_started(self, position: Position | None) -> None:
        start = position.to_str() if position else "now"
        print(f"mongocdc: streaming after {start}", flush=True)


class RateColumn(ProgressColumn):
    """Documents (or events) per second of a task, as rich measures it over its recent updates."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.0f}/s", style="progress.data.speed")


TOTAL = "snapshot (all collections)"


class RichProgress(ReadyLine):
    """Snapshot bars per collection and in total (count, rate, ETA) and a streaming counter, on stderr."""

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
        self.progress.console.log(f"snapshot {state}: {documents} documents")

    def streaming_started(self, position: Position | None) -> None:
        super().streaming_started(position)
        with self._lock:
            self._stream_task = self.progress.add_task("streaming events", total=None)

    def streaming_progress(self, events: int, counts: Mapping[str, int], position: Position | None) -> None:
        with self._lock:
            if self._stream_task is not None:
                detail = " ".join(f"{op}={n}" for op, n in sorted(counts.items()))
                self.progress.update(self._stream_task, completed=events, description=f"streaming events {detail}")


def _port(text: str) -> int:
    """A TCP port for ``--metrics-port``; argparse turns the error into one usage line."""
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port between 1 and 65535, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mongocdc run", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="Debezium connector JSON or .properties file")
    parser.add_argument("--sink", required=True, help="jsonl:DIR, parquet:DIR or kafka:HOST:PORT")
    parser.add_argument("--offsets", required=True, help="offset store: PATH, file:PATH or kafka:HOST:PORT[/TOPIC]")
    parser.add_argument("--max-events", type=int, default=None, help="stop after this many change events")
    parser.add_argument("--until-idle", type=float, default=None, help="stop after this many seconds without events")
    parser.add_argument("--metrics-file", default=None, help="rewrite Debezium metrics as JSON here while running")
    parser.add_argument("--metrics-port", type=_port, default=None,
                        help="serve the metrics in Prometheus format on this port (overrides mongocdc.metrics.port)")
    parser.add_argument("--no-progress", action="store_true", help="no progress display")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console(stderr=True)
    try:
        cfg = ConnectorConfig.load(args.config)
    except (ConfigError, OSError) as exc:
        console.print(f"[red]mongocdc: invalid configuration {args.config}:[/red]\n{exc}")
        return 2
    try:
        sink = open_sink(args.sink, cfg)
    except (ValueError, SinkError) as exc:
        console.print(f"[red]mongocdc: cannot open sink {args.sink}: {exc}[/red]")
        return 2
    try:
        offsets = open_offset_store(args.offsets, cfg, sink)
    except (ValueError, OffsetError) as exc:
        sink.close()
        console.print(f"[red]mongocdc: cannot open offsets {args.offsets}: {exc}[/red]")
        return 2
    listener = RichProgress(console) if not args.no_progress else ReadyLine()
    engine = Engine(cfg, sink, offsets, progress=listener, metrics_file=args.metrics_file)
    port = cfg.mongocdc_metrics_port if args.metrics_port is None else args.metrics_port
    exporter = PrometheusExporter(engine.metrics, port, tags=cfg.custom_metric_tags) if port else None
    try:
        if exporter is not None:
            exporter.start()
            console.print(f"mongocdc: metrics on http://0.0.0.0:{exporter.port}/metrics")
    except OSError as exc:
        sink.close()
        offsets.close()
        console.print(f"[red]mongocdc: --metrics-port / mongocdc.metrics.port: {exc.strerror or exc}[/red]")
        return 2

    def _graceful(signum: int, frame: FrameType | None) -> None:
        console.log(f"{signal.Signals(signum).name}: stopping after the current batch")
        engine.stop()

    signal.signal(signal.SIGTERM, _graceful)
    signal.signal(signal.SIGINT, _graceful)
    try:
        if isinstance(listener, RichProgress):
            with listener:
                summary = engine.run(max_events=args.max_events, until_idle=args.until_idle)
        else:
            summary = engine.run(max_events=args.max_events, until_idle=args.until_idle)
    except (CdcError, SinkError, OffsetError) as exc:
        console.print(f"[red]mongocdc: {exc}[/red]")
        return 1
    finally:
        if exporter is not None:
            exporter.stop()
        sink.close()
        offsets.close()
    console.print(engine.metrics.summary())
    console.print(f"stopped: {summary.stopped_because}; {summary.records} records, {summary.events} change events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
