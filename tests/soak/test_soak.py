"""The soak at CI size: a few minutes of the deployment under writers and faults, judged as ``make soak`` is.

Every fact the full soak checks is checked here (tables equal to the source with every key compared,
changelogs equal to the source's events, blocking checks pass, no gap, every failed run explained by a fault);
its figures (freshness, CPU share, Dagster's overhead per slice run, each phase's seconds) are printed, not
asserted. Smaller than ``make soak``: 5 collections and 2 minutes of writers, with every fault injected in
them (``SOAK_TEST_MINUTES`` sets the minutes). ``make test`` runs it (marker ``soak``) after the other tests,
alone: the deployment fills the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks import soak

pytestmark = [pytest.mark.slow, pytest.mark.daemon, pytest.mark.fault, pytest.mark.soak, pytest.mark.timeout(1500)]


def test_the_deployment_stays_green_under_writers_and_faults(tmp_path: Path) -> None:
    if os.environ.get("MONGOCDC_TEST_MONGODB_URI"):
        pytest.skip("the soak steps the emulated primary down and kills its processes")
    # the catch-up deadline leaves the verdict time inside the test's timeout (a timeout would print no figures)
    result = soak.run(float(os.environ.get("SOAK_TEST_MINUTES", "2")), collections=5, root=tmp_path,
                      catch_up_timeout=600)
    print(soak.asdict(result))
    assert result.writes > 100 and result.runs["launched"] > 5
    assert len(result.faults) >= 8
    assert result.passed, "\n".join(result.problems)
