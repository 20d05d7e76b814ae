"""The jars the tables need beyond pyspark's own (Delta Lake, the Kafka source), named once in ``pom.xml``.

The pom beside this file is the one list (:data:`SPARK_JARS`; where jars are looked for and how they are
fetched is :mod:`mongocdc_core.maven`'s, shared with the local Kafka broker). Spark finds them in the first
of these that holds them (:func:`spark_jars_conf`):

1. ``MONGOCDC_SPARK_JARS``: a directory the user names (``mongocdc tables jars --dir DIR`` fills one,
   for example on a machine with network access, to copy to an air-gapped one);
2. a checkout's ``.jars/spark`` (``make setup``), then the user cache that ``mongocdc tables jars`` fills
   by default (``$XDG_CACHE_HOME/mongocdc/spark-jars``, or ``~/.cache/...``);
3. Spark's own package mechanism (``spark.jars.packages``), which resolves them from Maven Central into
   Ivy's cache when the session starts, as ``delta-spark`` users do.
"""

from __future__ import annotations

from pathlib import Path

from mongocdc_core.maven import JarsError, JarSet

ENV_JARS = "MONGOCDC_SPARK_JARS"
SPARK_JARS = JarSet(
    name="spark", what="the Delta Lake and Kafka jars the tables need", pom=Path(__file__).with_name("pom.xml"),
    env=ENV_JARS, command="mongocdc tables jars",
    other_way="let Spark resolve them from Maven Central (spark.jars.packages, needs network when the session starts)")

#: What Ivy brings along with the pom's artifacts: the pom excludes every transitive dependency (pyspark
#: ships them in the versions Spark was built with, or the tables never load them), and
#: ``spark.jars.excludes`` does the same for Spark's package mechanism, so no second copy shadows Spark's.
TRANSITIVE = (
    "at.yawk.lz4:lz4-java", "com.fasterxml.jackson.core:jackson-annotations",
    "com.fasterxml.jackson.core:jackson-core", "com.fasterxml.jackson.core:jackson-databind",
    "com.fasterxml.jackson.datatype:jackson-datatype-jdk8", "com.fasterxml.jackson.datatype:jackson-datatype-jsr310",
    "com.github.luben:zstd-jni", "org.openapitools:jackson-databind-nullable",
    "com.google.code.findbugs:jsr305", "commons-pool:commons-pool", "io.airlift:aircompressor",
    "javax.annotation:javax.annotation-api", "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime", "org.apache.logging.log4j:log4j-api",
    "org.apache.logging.log4j:log4j-core", "org.apache.logging.log4j:log4j-slf4j2-impl",
    "org.apache.parquet:parquet-column", "org.apache.parquet:parquet-common", "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures", "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-jackson", "org.locationtech.jts:jts-core", "org.roaringbitmap:RoaringBitmap",
    "org.roaringbitmap:shims", "org.scala-lang.modules:scala-parallel-collections_2.13", "org.slf4j:slf4j-api",
    "org.xerial.snappy:snappy-java",
)


class SparkSetupError(RuntimeError):
    """The Delta Lake / Kafka jars cannot be had: none of the three ways in the module docstring worked."""


def spark_jars_conf() -> dict[str, str]:
    """The Spark properties that put the table jars on the class path, from the first way that has them."""
    try:
        folder = SPARK_JARS.find()
    except JarsError as exc:
        raise SparkSetupError(str(exc)) from exc
    if folder is not None:
        return {"spark.jars": ",".join(str(p) for p in SPARK_JARS.paths(folder))}
    return {"spark.jars.packages": ",".join(a.coordinate for a in SPARK_JARS.artifacts()),
            "spark.jars.excludes": ",".join(TRANSITIVE)}


def packages_failure(exc: BaseException) -> SparkSetupError:
    """The error for a session whose ``spark.jars.packages`` could not be resolved (e.g. no network)."""
    return SparkSetupError(f"Spark could not resolve the table jars from Maven Central ({exc}); "
                           + SPARK_JARS.how_to())
