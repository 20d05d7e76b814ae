"""Every benchmark still runs: each at CI size (``MONGOCDC_BENCH_SMALL=1``) through ``make bench``'s runner.

No timing is judged here (small-size ratios mean nothing): a benchmark passes when it completes
and writes its rows, each a finite measurement against a stated baseline.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from benchmarks.run import BENCHMARKS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
@pytest.mark.timeout(1800)  # Spark and the Kafka broker start inside; a loaded machine is slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_runs_at_ci_size_and_writes_its_results(name: str, tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    env = {**os.environ, "MONGOCDC_BENCH_SMALL": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--only", name, "--results", str(results)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1700, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    document = orjson.loads(results.read_bytes())
    assert document["small"] is True
    (line,) = document["baselines"].values()
    assert line.strip()
    assert document["rows"], "the benchmark wrote no rows"
    for row in document["rows"]:
        assert row["baseline"].strip()
        assert all(math.isfinite(row[k]) for k in ("value", "baseline_value", "ratio")), row
