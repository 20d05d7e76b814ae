"""Runs the real Debezium MongoDB connector (embedded, ``debezium/``'s DebeziumRun) from Python.

``make setup`` builds ``debezium/target/debezium-run.jar`` and one class path per pinned connector
version (``debezium/target/debezium-<version>/``). A :class:`DebeziumRun` writes the connector and
engine properties to a file, starts ``java`` with them, and follows the JSON lines file the program
writes (one record per line, in delivery order). The caller decides when to stop: it waits for a
record that says the connector got where it had to (``wait_for``), then ``stop()`` closes the engine,
which commits its offsets to the offsets file, so the next run with the same file resumes there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
TARGET = HERE / "debezium" / "target"
JAR = TARGET / "debezium-run.jar"
#: The Debezium releases the suite runs: the newest 3.4.x and 3.6.x Final whose artifacts all resolve
#: from Maven Central (3.4.2/3.4.3 miss debezium-openlineage-api or the MongoDB connector there).
#: The Makefile's DEBEZIUM_VERSIONS builds the same list.
VERSIONS = ("3.4.1.Final", "3.6.1.Final")
#: A safety net for a broken run only: every wait ends as soon as its record arrives.
WAIT_SECONDS = 180.0


def pinned(series: str) -> str:
    """The pinned release of a series (``"3.6"`` -> ``"3.6.1.Final"``)."""
    (version,) = (v for v in VERSIONS if v.startswith(series + "."))
    return version


def classpath(version: str) -> str | None:
    """The class path of one version's build, or None when it is not built."""
    lib = TARGET / f"debezium-{version}"
    if not JAR.is_file() or not lib.is_dir():
        return None
    return f"{JAR}{os.pathsep}{lib}{os.sep}*"


def missing(version: str) -> str | None:
    """Why the connector of ``version`` cannot run here, or None when it can."""
    if shutil.which("java") is None:
        return "`java` (Java 17) is not on PATH"
    if classpath(version) is None:
        return f"Debezium {version} is not built under {TARGET} (`make setup` builds it)"
    return None


@dataclass(frozen=True)
class DebeziumRecord:
    """One record as the connector's JsonConverter serialized it (``value`` None for a tombstone)."""

    topic: str
    key: bytes | None
    value: bytes | None

    def payload(self) -> Any:
        """The value's payload (schema part dropped), or None for a tombstone."""
        if self.value is None:
            return None
        parsed = json.loads(self.value)
        return parsed["payload"] if isinstance(parsed, dict) and "schema" in parsed else parsed


@dataclass(frozen=True)
class Usage:
    """What a finished run cost: CPU seconds (user + system) and peak resident memory."""

    cpu_seconds: float
    peak_rss_bytes: int


class PeakRss:
    """Follows a child's peak resident memory (``VmHWM``) until it exits.

    ``wait4``'s ``ru_maxrss`` cannot be used for a child of a big process: Linux counts the
    parent's memory at the fork into it. ``VmHWM`` is the peak of the child's own program.
    """

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.peak = 0
        self._path = Path(f"/proc/{pid}/status")
        self._interval = interval
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._done.is_set():
            try:
                for line in self._path.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except (FileNotFoundError, ProcessLookupError, ValueError):
                return
            self._done.wait(self._interval)

    def stop(self) -> int:
        """The peak seen (call before reaping the child, whose /proc entry then disappears)."""
        self._done.set()
        self._thread.join()
        return self.peak


def wait_with_usage(process: subprocess.Popen[Any], peak: PeakRss) -> Usage:
    """Reap ``process``; its CPU seconds (from ``wait4``) and peak RSS (from ``peak``)."""
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # exited, /proc entry still there
    rss = peak.stop()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return Usage(usage.ru_utime + usage.ru_stime, rss)


class DebeziumRun:
    """One run of the embedded connector; use as a context manager (a run left open is killed)."""

    def __init__(
        self,
        version: str,
        workdir: Path,
        properties: Mapping[str, str],
        *,
        name: str = "run",
        max_heap: str = "512m",
    ) -> None:
        cp = classpath(version)
        if cp is None:
            raise RuntimeError(missing(version) or f"Debezium {version} is not built")
        self.version = version
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.output = workdir / f"{name}.jsonl"
        self.stderr_path = workdir / f"{name}.stderr"
        self.properties_path = workdir / f"{name}.properties"
        self.properties = {
            "name": "mongocdc-compat",
            "connector.class": "io.debezium.connector.mongodb.MongoDbConnector",
            "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
            "offset.storage.file.filename": str(workdir / "debezium-offsets.dat"),
            "offset.flush.interval.ms": "0",
            **properties,
        }
        self.command = [
            shutil.which("java") or "java",
            f"-Xmx{max_heap}",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            cp,
            "mongocdc.compat.DebeziumRun",
            str(self.properties_path),
            str(self.output),
        ]
        self._process: subprocess.Popen[bytes] | None = None
        self._peak: PeakRss | None = None
        self._stderr: IO[bytes] | None = None
        self._records: list[DebeziumRecord] = []
        self._read_bytes = 0
        self.usage: Usage | None = None

    def __enter__(self) -> DebeziumRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._stderr is not None:
            self._stderr.close()

    def start(self) -> DebeziumRun:
        lines = [f"{k}={_escape(v)}" for k, v in self.properties.items()]
        self.properties_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.output.unlink(missing_ok=True)
        self._stderr = self.stderr_path.open("wb")
        self._process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stderr=self._stderr)
        self._peak = PeakRss(self._process.pid)
        return self

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def records(self) -> list[DebeziumRecord]:
        """Every complete record line written so far."""
        try:
            with self.output.open("rb") as f:
                f.seek(self._read_bytes)
                data = f.read()
        except FileNotFoundError:
            return list(self._records)
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            row = json.loads(line)
            key, value = row["key"], row["value"]
            self._records.append(DebeziumRecord(
                row["topic"],
                key.encode() if key is not None else None,
                value.encode() if value is not None else None,
            ))
        self._read_bytes += end
        return list(self._records)

    def stderr_tail(self, chars: int = 4000) -> str:
        try:
            return self.stderr_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def wait_for(
        self,
        condition: Callable[[list[DebeziumRecord]], bool],
        what: str,
        *,
        tick: Callable[[], None] | None = None,
        tick_seconds: float = 0.5,
    ) -> list[DebeziumRecord]:
        """Poll the records until ``condition`` holds; fail (with the connector's log) if it exits first.

        ``tick`` runs first and then every ``tick_seconds`` (e.g. writing a probe until the
        connector's change stream is open and reports one)."""
        assert self._process is not None
        deadline = time.monotonic() + WAIT_SECONDS
        next_tick = time.monotonic()
        while True:
            if tick is not None and time.monotonic() >= next_tick:
                tick()
                next_tick = time.monotonic() + tick_seconds
            records = self.records()
            if condition(records):
                return records
            if self._process.poll() is not None:
                raise AssertionError(
                    f"Debezium {self.version} exited with {self._process.returncode} before {what}:\n"
                    f"{self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"Debezium {self.version}: no {what} after {WAIT_SECONDS:.0f} s:\n{self.stderr_tail()}")
            time.sleep(0.05)

    def stop(self) -> list[DebeziumRecord]:
        """Close the engine (offsets committed), wait for the process, and return every record."""
        process = self._process
        assert process is not None and process.stdin is not None
        try:
            process.stdin.write(b"stop\n")
            process.stdin.close()
        except BrokenPipeError:
            pass
        assert self._peak is not None
        self.usage = wait_with_usage(process, self._peak)
        if process.returncode != 0:
            raise AssertionError(f"Debezium {self.version} exited with {process.returncode}:\n{self.stderr_tail()}")
        return self.records()


def _escape(value: str) -> str:
    """A value for a Java .properties file (backslashes, and leading spaces, kept literally)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")

