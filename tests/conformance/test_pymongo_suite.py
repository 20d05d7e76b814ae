"""The conformance job: pymongo's own tests against the emulator, with pass-rate thresholds.

pymongo's change-stream, session, transaction, retryable-read/write, cursor, collection and
unified CRUD test files run one by one, each against a fresh emulator (or against the real
deployment of ``MONGOCDC_TEST_MONGODB_URI``). The job fails when the change-stream files pass less
than 98%, or the whole less than 95%, of the tests a real single-member replica set would pass.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.conformance import pymongo_suite

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(3600)]


def test_pymongo_suite_pass_rates() -> None:
    score = pymongo_suite.run(uri=os.environ.get("MONGOCDC_TEST_MONGODB_URI"))
    report = score.report()
    pymongo_suite.CACHE.mkdir(parents=True, exist_ok=True)
    (pymongo_suite.CACHE / f"report-{int(time.time())}.txt").write_text(report + "\n")
    assert not score.problems(), "\n".join([*score.problems(), report])
