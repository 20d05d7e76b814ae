"""Spark session configuration for the tables: Delta Lake and the Kafka source, found as :mod:`.jars` says.

A checkout's ``make setup`` copies the jars into ``.jars/spark``; a pip-installed mongocdc takes them from
``MONGOCDC_SPARK_JARS``, the user cache ``mongocdc tables jars`` fills, or Spark's package mechanism.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

from mongocdc_core.tables.aot import driver_started, with_start_cache
from mongocdc_core.tables.jars import SparkSetupError, packages_failure, spark_jars_conf

ENV_MASTER = "MONGOCDC_SPARK_MASTER"
DEFAULT_MASTER = "local[2]"
#: A file for Spark's own log lines from WARN on (see log4j2.properties beside this file; unset: none kept).
ENV_SPARK_LOG = "MONGOCDC_SPARK_LOG"
LOG4J2 = Path(__file__).with_name("log4j2.properties")
#: The local driver's JIT thresholds, scaled (see :func:`spark_conf`).
COMPILE_THRESHOLD_SCALING = 10


def spark_conf(*, local_tuning: bool = True) -> dict[str, str]:
    """Spark properties for Delta Lake tables and the Kafka source (e.g. ``PySparkResource.spark_config``).

    ``local_tuning`` keeps shuffles and Delta state reconstruction small (2 partitions, no UI) and
    runs Python workers with this interpreter (it has pyarrow) and the driver with the throughput
    collector, which is what local mode on a laptop or CI runner wants; cluster deployments pass ``False``.
    Executors need no mongocdc: the tables run Spark SQL, and their one Python function is shipped with
    the job (it needs pyarrow only). :func:`start_session` adds, as the session starts, the option that
    starts the driver from an ahead-of-time cache on Java 25 and newer.
    """
    log_file = os.environ.get(ENV_SPARK_LOG)
    conf = spark_jars_conf() | {
        # the driver logs through mongocdc's log4j2 profile: errors on stderr, the rest in MONGOCDC_SPARK_LOG
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}"
        + (f" -Dmongocdc.spark.log={Path(log_file).resolve()}" if log_file else ""),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        # jobs of different scheduler pools share the executors in turn (collection.concurrently gives each
        # collection refreshed at once its own pool); jobs without a pool run first come, first served
        "spark.scheduler.mode": "FAIR",
        # Spark keeps 100 compiled classes by default, and a refresh of a collection's tables compiles about 70
        # of the tables' own shape (a small one none: changelog.interpreted): in a cycle over a few collections
        # every refresh compiled all of its own again
        "spark.sql.codegen.cache.maxEntries": "2000",
        # dates before 1582 are written as they are (proleptic Gregorian), never rebased or refused
        "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
        "spark.sql.parquet.int96RebaseModeInWrite": "CORRECTED",
        "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    }
    if local_tuning:
        # PySpark takes the worker interpreter from PYSPARK_PYTHON when the SparkContext starts
        # (default: whatever `python3` is on PATH, which may lack mongocdc's dependencies).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        conf |= {
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.adaptive.enabled": "true",
            "spark.driver.memory": "2g",
        }
        # the throughput collector: G1's concurrent work competes with the tasks on a small machine (a first cycle
        # of 20 collections × 1 change in a fresh JVM: 75 s against 83–88 s, an eighth less CPU); not when the
        # environment already chooses a collector (two are a JVM that does not start)
        if not any(re.search(r"-XX:\+Use\w+GC\b", os.environ.get(name, "")) for name in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")):
            conf["spark.driver.extraJavaOptions"] += " -XX:+UseParallelGC"
        # the JIT compiles a tenth as eagerly: a driver lives for one Dagster run, and at the default thresholds
        # compiling (C1 and C2) was over half of its CPU, mostly code a run uses a few times (a table run's work
        # over 20 collections in a fresh JVM: 133-143 s of CPU, 72-75 s of it compiling; 104-108 s, 33-34 s, and
        # no slower; a 300k-document build and three 20k-change refreshes: 99-101 s, 80-87 s, as fast)
        conf["spark.driver.extraJavaOptions"] += f" -XX:CompileThresholdScaling={COMPILE_THRESHOLD_SCALING}"
    return conf


@contextmanager
def _jvm_output_to(path: str | None) -> Iterator[None]:
    """While a session starts, standard error is the Spark log file, so the JVM it launches keeps that file
    for what it prints itself (the JVM's own warnings come before any log4j profile applies)."""
    if not path:
        yield
        return
    with open(path, "ab") as log_file:
        saved = os.dup(2)
        os.dup2(log_file.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def spark_session(master: str | None = None, app_name: str = "mongocdc-tables") -> SparkSession:
    """A (shared) SparkSession for the tables; master from the argument, ``MONGOCDC_SPARK_MASTER`` or local[2]."""
    chosen = master or os.environ.get(ENV_MASTER) or DEFAULT_MASTER
    return start_session(spark_conf(local_tuning=chosen.startswith("local")) | {
        "spark.master": chosen, "spark.app.name": app_name})


def start_session(conf: dict[str, str]) -> SparkSession:
    """The SparkSession of ``conf`` (the process's, if one runs): its driver JVM started from an ahead-of-time
    cache where there is one (:func:`.aot.with_start_cache`), its own output in ``MONGOCDC_SPARK_LOG``, and a
    :class:`SparkSetupError` naming why when it cannot start."""
    if SparkContext._active_spark_context is None:  # a running driver keeps the options it started with
        conf = with_start_cache(conf)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        with _jvm_output_to(os.environ.get(ENV_SPARK_LOG)):
            session = builder.getOrCreate()
    except PySparkRuntimeError as exc:  # the JVM did not start (with spark.jars.packages: often Ivy's resolve)
        log_file = os.environ.get(ENV_SPARK_LOG)
        resolving = "spark.jars.packages" in conf and (
            not log_file or "unresolved dependency" in Path(log_file).read_text(errors="replace")
            or "could not resolve" in Path(log_file).read_text(errors="replace").lower())
        if resolving:
            raise packages_failure(exc) from exc
        raise SparkSetupError(f"Spark did not start ({exc})" + (f"; its output is in {log_file}" if log_file else "")) from exc
    session.sparkContext.setLogLevel("ERROR")
    driver_started(conf, session._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[attr-defined,union-attr]
    return session
