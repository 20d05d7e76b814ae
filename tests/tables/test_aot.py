"""Spark's driver on Java 25+ records an ahead-of-time cache as it exits, and later drivers start from it.

The decisions (record, one recorder at a time, promote a finished recording, use the cache, give up on a
failed one for a day, tidy up) are judged on JDKs made of a ``release`` file; the last test starts real JVMs
of the newest installed Java 25+, through the tables' session and the Dagster resource.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from mongocdc_core.java import java_runtime
from mongocdc_core.tables import aot
from mongocdc_core.tables.session import COMPILE_THRESHOLD_SCALING
from mongocdc_dagster.local_stack import newest_java_home

CONF = {"spark.jars": "/j/delta.jar", "spark.driver.extraJavaOptions": "-Dlog=/a -XX:+UseParallelGC"}


def _jdk(root: Path, version: str) -> Path:
    """A directory that looks like a JDK of ``version`` to the launcher's choice (never run)."""
    (root / "bin").mkdir(parents=True)
    java = root / "bin" / "java"
    java.write_text("#!/bin/sh\nexit 1\n")
    java.chmod(0o755)
    (root / "release").write_text(f'IMPLEMENTOR="test"\nJAVA_VERSION="{version}"\nJAVA_RUNTIME_VERSION="{version}+1"\n')
    return root


def _option(conf: dict[str, str] = CONF) -> str:
    """The option the cache adds to ``conf``'s driver options ('' for none)."""
    return aot.with_start_cache(conf)["spark.driver.extraJavaOptions"].removeprefix(conf["spark.driver.extraJavaOptions"]).strip()


def _path(option: str) -> Path:
    return Path(option.split()[0].split("=", 1)[1])


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "aot"
    monkeypatch.setenv(aot.ENV_AOT_CACHE, str(folder))
    monkeypatch.setenv("JAVA_HOME", str(_jdk(tmp_path / "jdk25", "25.0.3")))
    for name in aot.CLASS_PATH_ENV:
        monkeypatch.delenv(name, raising=False)
    return folder


def _finish(recording: Path, content: bytes = b"whole") -> None:
    """What the JVM does as it exits: the configuration filled, the recording assembled, the configuration removed."""
    recording.with_name(recording.name + ".config").unlink(missing_ok=True)
    recording.write_bytes(content)


def _start(recording: Path) -> None:
    """What the recording JVM does as it starts: its configuration file, empty."""
    recording.with_name(recording.name + ".config").write_text("")


def test_below_java_25_off_or_another_spark_nothing_is_added(tmp_path: Path, cache: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert _option().startswith("-XX:AOTCacheOutput=")
    monkeypatch.setenv("JAVA_HOME", str(_jdk(tmp_path / "jdk17", "17.0.15")))
    runtime = java_runtime(str(tmp_path / "jdk17" / "bin" / "java"))
    assert runtime is not None and runtime.major == 17 and runtime.build == "17.0.15+1"
    assert _option() == ""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk25"))
    monkeypatch.setenv(aot.ENV_AOT_CACHE, "off")
    assert _option() == ""
    monkeypatch.setenv(aot.ENV_AOT_CACHE, str(tmp_path / "with space"))
    assert _option() == ""  # Spark's launcher would split the option
    monkeypatch.setenv(aot.ENV_AOT_CACHE, str(cache))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "another-spark"))
    assert _option() == ""  # its spark-env.sh may choose another Java


def test_one_driver_records_and_its_finished_recording_becomes_the_cache(cache: Path) -> None:
    first = _option()
    assert first.startswith("-XX:AOTCacheOutput=") and f"file={cache}" in first  # the JVM's own log beside it
    recording = _path(first)
    assert recording.parent == cache and f".rec-{os.getpid()}-" in recording.name
    _start(recording)
    assert _option() == ""  # this process records: nobody else does meanwhile
    _finish(recording)
    used = _option()
    assert used.startswith("-XX:AOTCache=")
    cached = _path(used)
    assert cached.read_bytes() == b"whole" and cached.parent == cache
    # a driver that recorded at the same time finishes later: its recording is removed
    recording.with_name(recording.name.replace(f".rec-{os.getpid()}-", ".rec-1-")).write_bytes(b"later")
    assert _option() == used
    assert sorted(p.name for p in cache.iterdir()) == [cached.name]


def test_the_cache_is_one_per_java_build_spark_and_jvm_options(tmp_path: Path, cache: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _finish(_path(_option()))
    key = _path(_option()).name
    assert _path(_option({**CONF, "spark.driver.extraJavaOptions": "-Dlog=/b -XX:+UseParallelGC"})).name == key
    assert _path(_option({**CONF, "spark.driver.extraJavaOptions": "-Dlog=/a"})).name.split(".")[0] != key.split(".")[0]
    assert _path(_option({**CONF, "spark.jars": "/j/other.jar"})).name.split(".")[0] != key.split(".")[0]
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    assert _path(_option()).name.split(".")[0] != key.split(".")[0]
    monkeypatch.delenv("HADOOP_CONF_DIR")
    monkeypatch.setenv("JAVA_HOME", str(_jdk(tmp_path / "jdk25b", "25.0.4")))
    assert _path(_option()).name.split(".")[0] != key.split(".")[0]


def test_the_lock_follows_the_recording_jvm_which_outlives_its_python(cache: Path) -> None:
    recording = _path(_option())
    lock = cache / (recording.name.split(".rec-")[0] + ".recording")
    assert lock.read_text() == str(os.getpid())
    jvm = subprocess.Popen(["sleep", "60"])  # the driver JVM, as the session started it
    try:
        aot.driver_started({"spark.driver.extraJavaOptions": f"-Dlog=/a -XX:AOTCacheOutput={recording}"}, jvm.pid)
        assert lock.read_text() == str(jvm.pid)
        _start(recording)
        recording.with_name(recording.name + ".config").write_text("classes")  # it exits: this process is gone
        assert _option() == ""  # its JVM still assembles the recording: nothing removed, nobody else records
        assert recording.with_name(recording.name + ".config").exists()
        _finish(recording)
        assert _option() == f"-XX:AOTCache={cache / (lock.stem + '.aot')}"
    finally:
        jvm.kill()
        jvm.wait()


def test_a_killed_recorder_is_tried_again_and_a_failed_assembly_waits_a_day(cache: Path) -> None:
    recording = _path(_option())
    lock = cache / (recording.name.split(".rec-")[0] + ".recording")
    _start(recording)
    lock.write_text(str(_dead_pid()))
    # killed before it exited: its empty configuration and lock are removed, and another driver records
    again = _path(_option())
    assert again != recording and not recording.with_name(recording.name + ".config").exists()
    # this one exited and its assembly failed: the JVM gone, its configuration left filled
    config = again.with_name(again.name + ".config")
    config.write_text("classes")
    lock.write_text(str(_dead_pid()))
    assert _option() == ""
    failed = lock.with_suffix(".failed")
    assert failed.exists() and not config.exists() and not lock.exists()
    assert _option() == ""  # not tried again within the day
    day_ago = time.time() - aot.RETRY_S - 60
    os.utime(failed, (day_ago, day_ago))
    assert _option().startswith("-XX:AOTCacheOutput=")


def test_caches_unused_for_30_days_are_removed(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _finish(_path(_option()))
    old = _path(_option())
    long_ago = time.time() - aot.UNUSED_S - 60
    os.utime(old, (long_ago, long_ago))
    assert _option() == f"-XX:AOTCache={old}"  # in use: kept, and marked as used
    assert time.time() - old.stat().st_mtime < 60
    os.utime(old, (long_ago, long_ago))
    _finish(_path(_option({**CONF, "spark.jars": "/j/new.jar"})))
    assert _option({**CONF, "spark.jars": "/j/new.jar"}).startswith("-XX:AOTCache=")
    assert not old.exists()


def test_the_stack_runs_spark_on_the_newest_java_it_supports_when_that_is_25(tmp_path: Path) -> None:
    jvm = tmp_path / "jvm"
    _jdk(jvm / "java-17-openjdk-amd64", "17.0.15")
    (jvm / "openjdk-17").mkdir()  # sources only, no bin/java
    assert newest_java_home(jvm) is None
    _jdk(jvm / "temurin-25-jdk-amd64", "25.0.10")
    _jdk(jvm / "temurin-25-old", "25.0.3")
    _jdk(jvm / "jdk-27-ea", "27-ea")  # newer than Spark runs on
    (jvm / "default-java").symlink_to(jvm / "jdk-27-ea")
    assert newest_java_home(jvm) == str(jvm / "temurin-25-jdk-amd64")


_SESSION = """
import sys
from mongocdc_core.tables.session import spark_conf, spark_session
from mongocdc_dagster.resources import MongoCdcPySparkResource
if sys.argv[1] == "tables":
    spark = spark_session()
else:  # the Dagster resource, as a run starts it
    resource = MongoCdcPySparkResource(spark_config=spark_conf() | {"spark.master": "local[1]"})
    resource.setup_for_execution(None)
    spark = resource.spark_session
assert spark.range(1000).selectExpr("sum(id)").first()[0] == 499500
arguments = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
print("flags:", " ".join(a for a in arguments if a.startswith("-XX:AOT")), flush=True)
"""


def _flags(output: str) -> str:
    return next(line.removeprefix("flags: ") for line in output.splitlines() if line.startswith("flags: "))


@pytest.mark.spark
def test_a_real_driver_records_the_cache_and_the_next_one_starts_from_it(tmp_path: Path) -> None:
    java_home = newest_java_home()
    if java_home is None:
        pytest.skip("no Java 25 installed in /usr/lib/jvm")
    env = dict(os.environ, JAVA_HOME=java_home, **{aot.ENV_AOT_CACHE: str(tmp_path / "aot")})
    first = subprocess.run([sys.executable, "-c", _SESSION, "tables"], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert _flags(first.stdout).startswith("-XX:AOTCacheOutput="), first.stdout
    assert "AOTCache creation is complete" in first.stdout
    second = subprocess.run([sys.executable, "-c", _SESSION, "dagster"], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    used = _flags(second.stdout)
    assert used.startswith("-XX:AOTCache="), second.stdout
    assert _path(used).stat().st_size > 10_000_000
    assert "][aot]" not in second.stdout + second.stderr  # the JVM mapped the cache it was given, without a word


def test_a_local_driver_runs_with_scaled_jit_thresholds(spark: SparkSession) -> None:
    """The JIT thresholds ``spark_conf`` gives local mode's driver reach its JVM (they cut a table run's CPU: see
    ``session.spark_conf``); the JVM reports the flags it runs with."""
    bean = spark._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()  # type: ignore[union-attr]
    arguments = list(bean.getInputArguments())
    assert f"-XX:CompileThresholdScaling={COMPILE_THRESHOLD_SCALING}" in arguments, arguments
    flags = spark._jvm.java.lang.management.ManagementFactory.getPlatformMXBean(  # type: ignore[union-attr]
        spark._jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))  # type: ignore[union-attr]
    assert float(flags.getVMOption("CompileThresholdScaling").getValue()) == COMPILE_THRESHOLD_SCALING
