"""What every benchmark shares: the result row, the size switch, timing, and its command line.

Each ``bench_*.py`` module has ``BASELINE`` (one line saying what it is measured against) and
``run(small) -> list[Row]``; every row is a measurement next to a baseline measured in the same
process, as a ratio, with the goal it is held to. ``python -m benchmarks.bench_x`` prints its rows;
``python -m benchmarks.run`` (``make bench``) runs them all, prints one table and writes
``benchmarks/results.json``. ``MONGOCDC_BENCH_SMALL=1`` runs them at a size that only proves they
work (the test suite does that); small-size ratios mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

SMALL_ENV = "MONGOCDC_BENCH_SMALL"


def small() -> bool:
    """Whether to run at CI size (``MONGOCDC_BENCH_SMALL=1``)."""
    return os.environ.get(SMALL_ENV, "") not in ("", "0", "false")


def size(full: int, small_size: int) -> int:
    return small_size if small() else full


@dataclass(frozen=True)
class Row:
    """One measurement against its same-process baseline.

    ``ratio`` is oriented so that the goal reads ``ratio <op> target`` (``op`` is ``>=`` or
    ``<=``); ``target`` None marks a figure reported without a goal (e.g. bytes per record).
    ``note`` says what varies from run to run (such as the spread of its rounds), shown next to the name
    but no part of it: the docs name a row by its name, which a run does not change unless what it
    guarantees does.
    """

    benchmark: str
    name: str
    baseline: str
    value: float
    baseline_value: float
    unit: str
    ratio: float
    target: float | None = None
    op: str = ">="
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.ratio >= self.target if self.op == ">=" else self.ratio <= self.target

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "met": self.met}


def median_of(rounds: int, measure: Callable[[], float]) -> float:
    """The median of ``rounds`` measurements (the issue's convention: 3 rounds, medians)."""
    return statistics.median(measure() for _ in range(rounds))


def cpu_seconds(work: Callable[[], object]) -> float:
    """Process CPU time of ``work`` (other load on a shared machine barely moves it)."""
    start = time.process_time()
    work()
    return time.process_time() - start


def table(rows: list[Row], title: str) -> Table:
    out = Table(title=title)
    for column, justify in (("benchmark", "left"), ("measure", "left"), ("value", "right"),
                            ("baseline", "right"), ("ratio", "right"), ("goal", "right"), ("", "left")):
        out.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        goal = "" if row.target is None else f"{row.op} {row.target:g}"
        met = {True: "[green]met[/]", False: "[red]not met[/]", None: ""}[row.met]
        out.add_row(row.benchmark, f"{row.name}; {row.note}" if row.note else row.name, f"{row.value:,.4g} {row.unit}", f"{row.baseline_value:,.4g} {row.unit}",
                    f"{row.ratio:.2f}", goal, met)
    return out


def write_json(rows: list[Row], path: Path, baselines: dict[str, str], measured: dict[str, str] | None = None) -> None:
    """The rows as ``benchmarks/results.json`` keeps them; ``measured``: when each benchmark's rows were
    measured, where they come from different runs."""
    document = {
        "small": small(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "baselines": baselines,
        "measured": measured or dict.fromkeys((row.benchmark for row in rows), time.strftime("%Y-%m-%dT%H:%M:%S%z")),
        "rows": [row.as_dict() for row in rows],
    }
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


def read_document(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads(path.read_bytes())
    return document


def read_json(path: Path) -> tuple[list[Row], dict[str, str]]:
    document = read_document(path)
    fields = set(Row.__dataclass_fields__)
    return [Row(**{k: v for k, v in row.items() if k in fields}) for row in document["rows"]], document["baselines"]


def main(name: str, baseline: str, run: Callable[..., list[Row]], parts: Sequence[str] = ()) -> None:
    """Command line of one benchmark module: print its rows; ``--json PATH`` also writes them. A module
    with ``parts`` (its groups of rows) takes ``--only PART`` (repeatable), handed to ``run`` as a list."""
    parser = argparse.ArgumentParser(description=baseline)
    parser.add_argument("--json", type=Path, help="write the rows here (benchmarks.run uses this)")
    if parts:
        parser.add_argument("--only", action="append", choices=parts, help="measure only these parts (all by default)")
    args = parser.parse_args()
    rows = run(small(), args.only) if parts and args.only else run(small())
    console = Console(width=180)
    console.print(f"[bold]{name}[/]: baseline = {baseline}")
    console.print(table(rows, name))
    if args.json is not None:
        write_json(rows, args.json, {name: baseline})
