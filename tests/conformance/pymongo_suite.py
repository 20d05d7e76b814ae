"""pymongo's own test suite against the emulated replica set: fetch, run file by file, score.

The source distribution of the installed (pinned) pymongo version is downloaded from the package
index once (PEP 691 simple API, sha256 checked) and its ``test/`` tree is cached under
``.local/conformance/``. Each suite file then runs in its own pytest process against a fresh
emulator, with ``pymongo_plugin`` recording every outcome. A test counts as *applicable* unless a
real MongoDB 7.0 single-member replica set without a secondary would skip or fail it too; those
are listed with the reason (``not_applicable.py``). The pass rate is passed / applicable.

Command line (``make conformance`` runs the first)::

    python -m tests.conformance.pymongo_suite                 # every suite file
    python -m tests.conformance.pymongo_suite test_cursor     # some files
    python -m tests.conformance.pymongo_suite --fetch-only    # download and cache only
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from tests.conformance.not_applicable import REAL_SKIP_REASONS, known_failure

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".local" / "conformance"
DEFAULT_INDEX = "https://pypi.org/simple"
FILE_TIMEOUT_SECONDS = 900

#: The suite files run, in order; the change-stream files have their own, higher threshold.
CHANGE_STREAM_FILES = ("test_change_stream",)
SUITE_FILES = (
    "test_change_stream",
    "test_session",
    "test_sessions_unified",
    "test_transactions",
    "test_transactions_unified",
    "test_retryable_reads",
    "test_retryable_reads_unified",
    "test_retryable_writes",
    "test_retryable_writes_unified",
    "test_cursor",
    "test_collection",
    "test_crud_unified",
)
CHANGE_STREAM_THRESHOLD = 0.98
OVERALL_THRESHOLD = 0.95

_PYTEST_INI = """[pytest]
markers =
    default: pymongo's default suite
    default_async: pymongo's default async suite
    auth: authentication
    auth_aws: AWS authentication
    auth_oidc: OIDC authentication
    ocsp: OCSP
    atlas_connect: Atlas
    sfp: Atlas SFP
    perf: benchmarks
    search_index: search indexes
    kms: KMS
    encryption: encryption
    load_balancer: load balancers
    mockupdb: mockupdb
"""


# -- fetching -----------------------------------------------------------------------------------
def pymongo_version() -> str:
    return metadata.version("pymongo")


def suite_dir(version: str | None = None) -> Path:
    return CACHE / f"pymongo-{version or pymongo_version()}"


def fetch(version: str | None = None, index: str | None = None) -> Path:
    """The cached ``test/`` tree of pymongo's sdist, downloaded from the package index if missing."""
    version = version or pymongo_version()
    target = suite_dir(version)
    if (target / ".complete").exists():
        return target
    filename = f"pymongo-{version}.tar.gz"
    base = (index or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")
    request = urllib.request.Request(f"{base}/pymongo/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        listing = json.load(reply)
    entry = next((f for f in listing.get("files", ()) if f.get("filename") == filename), None)
    if entry is None:
        raise RuntimeError(f"the package index {base} lists no {filename}")
    with urllib.request.urlopen(entry["url"], timeout=300) as reply:
        payload = reply.read()
    expected = entry.get("hashes", {}).get("sha256")
    actual = hashlib.sha256(payload).hexdigest()
    if expected and actual != expected:
        raise RuntimeError(f"{filename}: sha256 {actual} does not match the index's {expected}")
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="pymongo-", dir=CACHE))
    prefix = f"pymongo-{version}/test/"
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:gz") as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for member in members:
            member.name = member.name[len(f"pymongo-{version}/") :]
        archive.extractall(staging, members=members, filter="data")
    # Only the tests are extracted: the installed pymongo (with its C extensions) is what runs.
    (staging / "pytest.ini").write_text(_PYTEST_INI)
    (staging / ".complete").write_text(f"{filename} sha256={actual}\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


# -- running ------------------------------------------------------------------------------------
@dataclass
class Outcome:
    nodeid: str
    outcome: str  # passed | failed | skipped | xfailed | xpassed
    detail: str = ""
    real_skip: str | None = None


@dataclass
class FileResult:
    name: str
    seconds: float
    outcomes: list[Outcome]
    exit_code: int
    passed: int = 0
    failed: list[Outcome] = field(default_factory=list)  # applicable failures (and unexplained skips)
    not_applicable: list[tuple[Outcome, str]] = field(default_factory=list)

    @property
    def applicable(self) -> int:
        return self.passed + len(self.failed)

    @property
    def rate(self) -> float:
        return self.passed / self.applicable if self.applicable else 1.0

    def count(self, kind: str) -> int:
        return sum(1 for o in self.outcomes if o.outcome == kind)


def _merge(records: list[dict[str, str]]) -> list[Outcome]:
    """One outcome per test: a failure in any phase wins over a skip, a skip over a pass."""
    by_test: dict[str, Outcome] = {}
    rank = {"passed": 0, "xpassed": 1, "xfailed": 2, "skipped": 3, "failed": 4}
    for record in records:
        outcome = Outcome(record["nodeid"], record["outcome"], record.get("reason") or record.get("message") or "",
                          record.get("real_skip"))  # fmt: skip
        known = by_test.get(outcome.nodeid)
        if known is None or rank[outcome.outcome] > rank[known.outcome]:
            by_test[outcome.nodeid] = outcome
    return list(by_test.values())


def _short_id(nodeid: str) -> str:
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def classify(name: str, outcomes: list[Outcome], seconds: float, exit_code: int) -> FileResult:
    result = FileResult(name, seconds, outcomes, exit_code)
    for outcome in outcomes:
        if outcome.outcome in ("passed", "xpassed"):
            result.passed += 1
        elif outcome.outcome == "xfailed":
            result.not_applicable.append((outcome, "pymongo marks it an expected failure"))
        elif outcome.outcome == "skipped":
            reason = outcome.real_skip or known_failure(outcome.nodeid) or next(
                (why for pattern, why in REAL_SKIP_REASONS if re.search(pattern, outcome.detail)), None
            )
            if reason is None:
                result.failed.append(outcome)
            else:
                result.not_applicable.append((outcome, reason))
        else:
            reason = known_failure(outcome.nodeid)
            if reason is None:
                result.failed.append(outcome)
            else:
                result.not_applicable.append((outcome, reason))
    return result


@contextmanager
def _deployment(uri: str | None) -> Iterator[tuple[str, int]]:
    """A fresh emulator per file, or the real deployment of ``MONGOCDC_TEST_MONGODB_URI``."""
    if uri:
        host = uri.split("://", 1)[1].split("/", 1)[0].split(",")[0].rsplit("@", 1)[-1]
        name, _, port = host.partition(":")
        yield name, int(port or 27017)
        return
    from mongocdc_devstack.fixture import EmulatedReplicaSet

    # The few of pymongo's tests that open ``MongoClient()`` reach it too (the plugin points the default there).
    with EmulatedReplicaSet(noop_interval=1.0) as emulated:
        yield emulated.host, emulated.port


def run_file(name: str, root: Path, uri: str | None = None) -> FileResult:
    """Run one suite file in its own pytest process against its own deployment."""
    with tempfile.TemporaryDirectory(prefix="conformance-") as scratch:
        out = Path(scratch) / "outcomes.jsonl"
        out.touch()
        with _deployment(uri) as (host, port):
            env = dict(os.environ, DB_IP=host, DB_PORT=str(port), MONGOCDC_CONFORMANCE_OUT=str(out),
                       PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))  # fmt: skip
            env.pop("PYTEST_XDIST_WORKER", None)
            env.pop("PYTEST_ADDOPTS", None)
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                       "-p", "no:randomly", "-p", "tests.conformance.pymongo_plugin", "-c", str(root / "pytest.ini"),
                       "--rootdir", str(root), "--tb=no", "--no-header", "-o", "timeout=300",
                       f"test/{name}.py"]  # fmt: skip
            started = time.monotonic()
            try:
                finished = subprocess.run(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          timeout=FILE_TIMEOUT_SECONDS, check=False)  # fmt: skip
                exit_code = finished.returncode
            except subprocess.TimeoutExpired:
                exit_code = -1
            seconds = time.monotonic() - started
        records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    result = classify(name, _merge(records), seconds, exit_code)
    if exit_code not in (0, 1) or not records:
        result.failed.append(Outcome(f"test/{name}.py", "failed", f"pytest exited with {exit_code}"))
    return result


# -- reporting ----------------------------------------------------------------------------------
@dataclass
class Score:
    results: list[FileResult]

    def _rate(self, files: Sequence[FileResult]) -> float:
        passed = sum(r.passed for r in files)
        applicable = sum(r.applicable for r in files)
        return passed / applicable if applicable else 1.0

    @property
    def overall(self) -> float:
        return self._rate(self.results)

    @property
    def change_streams(self) -> float:
        return self._rate([r for r in self.results if r.name in CHANGE_STREAM_FILES])

    def problems(self) -> list[str]:
        out = []
        if any(r.name in CHANGE_STREAM_FILES for r in self.results) and self.change_streams < CHANGE_STREAM_THRESHOLD:
            out.append(f"change-stream files pass {self.change_streams:.1%} of applicable tests (< {CHANGE_STREAM_THRESHOLD:.0%})")
        if self.overall < OVERALL_THRESHOLD:
            out.append(f"the suite passes {self.overall:.1%} of applicable tests (< {OVERALL_THRESHOLD:.0%})")
        return out

    def report(self, verbose: bool = True) -> str:
        lines = [f"pymongo {pymongo_version()} test suite against the emulated replica set (one fresh emulator per file)",
                 f"{'file':32} {'pass':>5} {'fail':>5} {'skip':>5} {'n/a':>5} {'rate':>7} {'secs':>6}"]  # fmt: skip
        for r in self.results:
            lines.append(f"{r.name:32} {r.passed:5d} {len(r.failed):5d} {r.count('skipped'):5d} "
                         f"{len(r.not_applicable):5d} {r.rate:7.1%} {r.seconds:6.0f}")  # fmt: skip
        lines.append(f"{'change streams':32} {self.change_streams:>37.1%}")
        lines.append(f"{'overall (applicable tests)':32} {self.overall:>37.1%}")
        lines.append("fail: applicable tests that failed (FAIL) or that only the emulator made skip (SKIP); "
                     "n/a: tests a real single-member 7.0 replica set also skips or fails")  # fmt: skip
        if verbose:
            for r in self.results:
                for outcome in r.failed:
                    label = "SKIP" if outcome.outcome == "skipped" else "FAIL"
                    lines.append(f"  {label} {r.name}::{_short_id(outcome.nodeid)}: {' '.join(outcome.detail.split())[:200]}")
            reasons: dict[str, int] = {}
            for r in self.results:
                for outcome, why in r.not_applicable:
                    if outcome.outcome == "failed":
                        lines.append(f"  N/A  {r.name}::{_short_id(outcome.nodeid)}: {why}")
                    else:
                        reasons[why] = reasons.get(why, 0) + 1
            for why, count in sorted(reasons.items(), key=lambda item: -item[1]):
                lines.append(f"  N/A  {count:4d} skipped: {why}")
        return "\n".join(lines)


def run(files: Sequence[str] = SUITE_FILES, uri: str | None = None, echo: bool = False) -> Score:
    root = fetch()
    results = []
    for name in files:
        result = run_file(name, root, uri)
        results.append(result)
        if echo:
            print(f"{name}: {result.passed} passed, {len(result.failed)} failed, {result.rate:.1%}", flush=True)
    return Score(results)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.conformance.pymongo_suite", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help=f"suite files to run (default: all {len(SUITE_FILES)})")
    parser.add_argument("--fetch-only", action="store_true", help="download and cache the suite, run nothing")
    args = parser.parse_args(argv)
    if args.fetch_only:
        print(f"pymongo's test suite is in {fetch()}")
        return 0
    unknown = [f for f in args.files if f not in SUITE_FILES]
    if unknown:
        parser.error(f"not a suite file: {', '.join(unknown)} (choose from {', '.join(SUITE_FILES)})")
    score = run(args.files or SUITE_FILES, os.environ.get("MONGOCDC_TEST_MONGODB_URI"), echo=True)
    print(score.report())
    problems = score.problems()
    for problem in problems:
        print(f"FAILED: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
