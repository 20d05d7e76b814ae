"""``make bench``: every benchmark, one table of ratios, and ``benchmarks/results.json``.

Each benchmark runs in its own process (``python -m benchmarks.<name> --json …``), so one's memory,
threads and brokers never weigh on the next; the rows are gathered into one table and one JSON
file, which runs can be compared by. ``--only NAME`` (repeatable) picks benchmarks and replaces only
their rows in a full-size results file, keeping the others with the time each was measured (the docs'
figures come from this file); ``MONGOCDC_BENCH_SMALL=1`` runs everything at CI size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.harness import Row, read_document, read_json, small, table, write_json

HERE = Path(__file__).resolve().parent
#: In the order they run: the pure ones first, the ones needing a broker or Spark last.
BENCHMARKS = (
    "bench_event_conversion",
    "bench_sinks",
    "bench_streaming",
    "bench_memory",
    "bench_emulator_find",
    "bench_emulator_stream",
    "bench_snapshot_ranges",
    "bench_incremental_snapshot",
    "bench_kafka_sink",
    "bench_dagster_slice",
    "bench_tables",
    "bench_tables_stream",
)


def run_one(name: str, work: Path) -> tuple[list[Row], dict[str, str]]:
    """Run one benchmark module in a child process; its rows and baseline line."""
    out = work / f"{name}.json"
    command = [sys.executable, "-m", f"benchmarks.{name}", "--json", str(out)]
    completed = subprocess.run(command, cwd=HERE.parent, check=False)
    if completed.returncode != 0 or not out.exists():
        raise SystemExit(f"benchmark {name} failed (exit code {completed.returncode})")
    return read_json(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", action="append", choices=BENCHMARKS, help="run only these benchmarks")
    parser.add_argument("--results", type=Path, default=HERE / "results.json", help="where to write the JSON")
    args = parser.parse_args(argv)
    if args.results.exists():
        same_size(args.results)  # before hours of benchmarks, not after
    names = args.only or list(BENCHMARKS)
    rows: list[Row] = []
    baselines: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-") as tmp:
        for name in names:
            got, lines = run_one(name, Path(tmp))
            rows += got
            baselines.update(lines)
    console = Console(width=180)
    console.rule("baselines")
    for name, line in baselines.items():
        console.print(f"[bold]{name}[/]: {line}")
    console.print(table(rows, "mongocdc benchmarks" + (" (small size: ratios mean nothing)" if small() else "")))
    measured = dict.fromkeys((row.benchmark for row in rows), time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    if args.only:
        rows, baselines, measured = keep_others(args.results, rows, baselines, measured)
    write_json(rows, args.results, baselines, measured)
    console.print(f"results written to {args.results}")
    return 0


def same_size(path: Path) -> dict[str, Any]:
    """The results file at ``path``, refused when its figures are of the other size than this run's (a CI-size
    run never replaces or mixes into full-size figures: the docs' figures come from them)."""
    document = read_document(path)
    if bool(document.get("small")) != small():
        size = {True: "CI-size", False: "full-size"}
        raise SystemExit(f"{path} holds {size[bool(document.get('small'))]} figures and this run is "
                         f"{size[small()]}: name another file with --results")
    return document


def keep_others(path: Path, rows: list[Row], baselines: dict[str, str], measured: dict[str, str],
                ) -> tuple[list[Row], dict[str, str], dict[str, str]]:
    """``rows`` in place of their benchmarks' rows in the results file at ``path``, the other benchmarks'
    rows kept as they were (in their order, with their times); see :func:`same_size`."""
    if not path.exists():
        return rows, baselines, measured
    document = same_size(path)
    old_rows, old_baselines = read_json(path)
    old_measured = document.get("measured") or dict.fromkeys((r.benchmark for r in old_rows), document["time"])
    order = list(dict.fromkeys([*(r.benchmark for r in old_rows), *(r.benchmark for r in rows)]))
    fresh = {r.benchmark for r in rows}
    kept = [r for r in old_rows if r.benchmark not in fresh] + rows
    kept.sort(key=lambda r: order.index(r.benchmark))
    return kept, {**old_baselines, **baselines}, {**old_measured, **measured}


if __name__ == "__main__":
    sys.exit(main())
