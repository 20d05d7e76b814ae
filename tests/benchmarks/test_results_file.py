"""``make bench --only``-style runs replace their own rows of ``benchmarks/results.json`` and keep the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import run
from benchmarks.harness import SMALL_ENV, Row, read_document, read_json, write_json


def _row(benchmark: str, name: str, ratio: float) -> Row:
    return Row(benchmark=benchmark, name=name, baseline="b", value=ratio, baseline_value=1.0, unit="x",
               ratio=ratio, target=None, op=">=")


def test_a_partial_run_replaces_its_benchmarks_rows_and_keeps_the_others_with_their_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SMALL_ENV, raising=False)
    path = tmp_path / "results.json"
    write_json([_row("a", "one", 1.0), _row("b", "two", 2.0), _row("c", "three", 3.0)], path,
               {"a": "A", "b": "B", "c": "C"}, {"a": "t0", "b": "t0", "c": "t0"})
    rows, baselines, measured = run.keep_others(path, [_row("b", "two", 5.0), _row("b", "new", 6.0)], {"b": "B2"},
                                                {"b": "t1"})
    write_json(rows, path, baselines, measured)
    again, kept = read_json(path)
    assert [(r.benchmark, r.name, r.ratio) for r in again] == [("a", "one", 1.0), ("b", "two", 5.0), ("b", "new", 6.0),
                                                               ("c", "three", 3.0)]
    assert kept == {"a": "A", "b": "B2", "c": "C"} and read_document(path)["measured"] == {"a": "t0", "b": "t1", "c": "t0"}
    monkeypatch.setenv(SMALL_ENV, "1")  # a CI-size run never replaces or mixes into full-size figures
    with pytest.raises(SystemExit, match="holds full-size figures and this run is CI-size"):
        run.keep_others(path, [_row("a", "one", 9.0)], {}, {"a": "t2"})
