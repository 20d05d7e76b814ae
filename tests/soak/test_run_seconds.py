"""The soak's account of where a run's time goes: per kind of run, and per step of it (a table run's refreshes
and its reconciliations apart).

No ``from __future__ import annotations``: Dagster reads the assets' annotations at definition time."""

import time

from dagster import DagsterInstance, Definitions, asset, define_asset_job

from benchmarks import soak


@asset
def first() -> int:
    time.sleep(0.2)  # the step's length is asserted only as at least this
    return 1


@asset
def second(first: int) -> int:
    return first + 1


def test_each_kind_of_run_reports_its_steps() -> None:
    defs = Definitions(assets=[first, second],
                       jobs=[define_asset_job("both", [first, second]), define_asset_job("one", [first])])
    with DagsterInstance.ephemeral() as instance:
        for _ in range(3):
            assert defs.resolve_job_def("both").execute_in_process(instance=instance).success
        assert defs.resolve_job_def("one").execute_in_process(instance=instance).success
        runs = list(instance.get_runs())
        figures = soak._run_seconds(soak._run_timings(instance, runs))
    assert set(figures) == {"both", "one"}  # runs without an asset selection go by their job's name
    both = figures["both"]
    assert both["runs"] == 3
    assert set(both["steps_p50"]) == {"first", "second"}
    assert both["steps_p50"]["first"] >= 0.2
    assert both["run_p50"] >= both["steps_p50"]["first"] + both["steps_p50"]["second"] - 0.1
    assert figures["one"]["runs"] == 1 and set(figures["one"]["steps_p50"]) == {"first"}
