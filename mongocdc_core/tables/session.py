"""Spark session configuration for the tables: Delta Lake and Kafka jars from `make setup`, no Ivy.

`make setup` copies the jars declared in ``mongocdc_core/tables/pom.xml`` into ``<repo>/.jars/spark``
(or wherever ``MONGOCDC_SPARK_JARS`` points). They are handed to Spark through ``spark.jars``;
``spark.jars.packages`` is never used, so nothing is downloaded when a session starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

ENV_JARS = "MONGOCDC_SPARK_JARS"
ENV_MASTER = "MONGOCDC_SPARK_MASTER"
DEFAULT_MASTER = "local[2]"
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Jars without which the tables cannot work (prefixes of the file names Maven writes).
REQUIRED_JARS = ("delta-spark_", "delta-storage-", "spark-sql-kafka-0-10_", "kafka-clients-")


class SparkSetupError(RuntimeError):
    """The Delta Lake / Kafka jars are missing: `make setup` has not been run."""


def jars_dir() -> Path:
    """Directory holding the table jars (``MONGOCDC_SPARK_JARS`` or ``<repo>/.jars/spark``)."""
    return Path(os.environ.get(ENV_JARS) or REPO_ROOT / ".jars" / "spark")


def table_jars() -> list[str]:
    """Absolute paths of the table jars, checked for the ones the tables cannot do without."""
    folder = jars_dir()
    jars = sorted(str(p) for p in folder.glob("*.jar")) if folder.is_dir() else []
    names = [Path(j).name for j in jars]
    missing = [prefix for prefix in REQUIRED_JARS if not any(n.startswith(prefix) for n in names)]
    if missing:
        raise SparkSetupError(
            f"Spark table jars missing in {folder} ({', '.join(p + '*.jar' for p in missing)}); run `make setup` "
            f"(mvn -f mongocdc_core/tables/pom.xml dependency:copy-dependencies -DoutputDirectory={folder})"
        )
    return jars


def spark_conf(*, local_tuning: bool = True) -> dict[str, str]:
    """Spark properties for Delta Lake tables and the Kafka source (e.g. ``PySparkResource.spark_config``).

    ``local_tuning`` keeps shuffles and Delta state reconstruction small (2 partitions, no UI) and
    runs Python workers with this interpreter (it has pyarrow), which is what local mode on a laptop
    or CI runner wants; cluster deployments pass ``False``. Executors need no mongocdc: the tables
    run Spark SQL, and their one Python function is shipped with the job (it needs pyarrow only).
    """
    conf = {
        "spark.jars": ",".join(table_jars()),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
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
    return conf


def spark_session(master: str | None = None, app_name: str = "mongocdc-tables") -> SparkSession:
    """A (shared) SparkSession for the tables; master from the argument, ``MONGOCDC_SPARK_MASTER`` or local[2]."""
    chosen = master or os.environ.get(ENV_MASTER) or DEFAULT_MASTER
    builder = SparkSession.builder.master(chosen).appName(app_name)
    for key, value in spark_conf(local_tuning=chosen.startswith("local")).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
