"""The jars the tables need beyond pyspark's own (Delta Lake, the Kafka source), named once in ``pom.xml``.

The pom beside this file is the one list: ``make setup`` hands it to Maven, and a pip-installed mongocdc
reads it here. Spark finds the jars in the first of these that holds them (:func:`spark_jars_conf`):

1. ``MONGOCDC_SPARK_JARS``: a directory the user names (``mongocdc tables jars --dir DIR`` fills one,
   for example on a machine with network access, to copy to an air-gapped one);
2. a checkout's ``.jars/spark`` (``make setup``), then the user cache that ``mongocdc tables jars`` fills
   by default (``$XDG_CACHE_HOME/mongocdc/spark-jars``, or ``~/.cache/...``);
3. Spark's own package mechanism (``spark.jars.packages``), which resolves them from Maven Central into
   Ivy's cache when the session starts, as ``delta-spark`` users do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ENV_JARS = "MONGOCDC_SPARK_JARS"
ENV_REPOSITORY = "MONGOCDC_MAVEN_REPOSITORY"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
POM = Path(__file__).with_name("pom.xml")
CHECKOUT_JARS = Path(__file__).resolve().parents[2] / ".jars" / "spark"

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


@dataclass(frozen=True)
class Artifact:
    """One jar of the pom, as Maven names it."""

    group: str
    name: str
    version: str

    @property
    def coordinate(self) -> str:
        return f"{self.group}:{self.name}:{self.version}"

    @property
    def file_name(self) -> str:
        """The name Maven's copy-dependencies (and :func:`download`) gives the file."""
        return f"{self.name}-{self.version}.jar"

    def url(self, repository: str) -> str:
        return f"{repository.rstrip('/')}/{self.group.replace('.', '/')}/{self.name}/{self.version}/{self.file_name}"


def artifacts(pom: Path = POM) -> list[Artifact]:
    """The pom's dependencies with its ``${property}`` versions filled in."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.parse(pom).getroot()
    props = {p.tag.split("}", 1)[1]: p.text or "" for p in root.findall("m:properties/*", ns)}

    def text(node: ET.Element, tag: str) -> str:
        value = node.findtext(f"m:{tag}", default="", namespaces=ns).strip()
        for key, replacement in props.items():
            value = value.replace("${" + key + "}", replacement)
        return value

    return [Artifact(text(d, "groupId"), text(d, "artifactId"), text(d, "version"))
            for d in root.findall("m:dependencies/m:dependency", ns)]


def user_cache() -> Path:
    """Where ``mongocdc tables jars`` puts the jars when no directory is named."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "mongocdc" / "spark-jars"


def missing(folder: Path, wanted: list[Artifact] | None = None) -> list[Artifact]:
    """The pom's artifacts that ``folder`` lacks (all of them when it does not exist)."""
    wanted = artifacts() if wanted is None else wanted
    have = {p.name for p in folder.glob("*.jar")} if folder.is_dir() else set()
    return [a for a in wanted if a.file_name not in have]


def _how_to() -> str:
    return (f"set {ENV_JARS} to a directory holding them, run `mongocdc tables jars` (downloads them from "
            f"{os.environ.get(ENV_REPOSITORY) or MAVEN_CENTRAL} into {user_cache()}; `--dir DIR` for a copy to "
            "carry to a machine without network), or let Spark resolve them from Maven Central "
            "(spark.jars.packages, needs network when the session starts)")


def spark_jars_conf() -> dict[str, str]:
    """The Spark properties that put the table jars on the class path, from the first way that has them."""
    wanted = artifacts()
    named = os.environ.get(ENV_JARS)
    if named:
        folder = Path(named).expanduser()
        lacking = missing(folder, wanted)
        if lacking:
            raise SparkSetupError(f"{ENV_JARS}={folder} lacks {', '.join(a.file_name for a in lacking)}; "
                                  + _how_to())
        return {"spark.jars": ",".join(str(folder / a.file_name) for a in wanted)}
    for folder in (CHECKOUT_JARS, user_cache()):
        if not missing(folder, wanted):
            return {"spark.jars": ",".join(str(folder / a.file_name) for a in wanted)}
    return {"spark.jars.packages": ",".join(a.coordinate for a in wanted),
            "spark.jars.excludes": ",".join(TRANSITIVE)}


def packages_failure(exc: BaseException) -> SparkSetupError:
    """The error for a session whose ``spark.jars.packages`` could not be resolved (e.g. no network)."""
    return SparkSetupError(f"Spark could not resolve the table jars from Maven Central ({exc}); " + _how_to())


def download(folder: Path, repository: str | None = None,
             progress: Callable[[int, int, Artifact], None] | None = None) -> list[Path]:
    """Fetch every jar of the pom into ``folder`` (checked against the repository's SHA-1), skipping those
    already there; returns the jars' paths. Each file appears whole or not at all."""
    repo = repository or os.environ.get(ENV_REPOSITORY) or MAVEN_CENTRAL
    wanted = artifacts()
    folder.mkdir(parents=True, exist_ok=True)
    lacking = set(missing(folder, wanted))
    for done, artifact in enumerate(wanted, 1):
        if artifact in lacking:
            _fetch(artifact, repo, folder)
        if progress is not None:
            progress(done, len(wanted), artifact)
    return [folder / a.file_name for a in wanted]


def _fetch(artifact: Artifact, repository: str, folder: Path) -> None:
    url = artifact.url(repository)
    handle, name = tempfile.mkstemp(dir=folder, prefix=artifact.file_name, suffix=".part")
    os.close(handle)
    part = Path(name)
    try:
        with urllib.request.urlopen(url + ".sha1", timeout=60) as reply:
            words = reply.read().decode("ascii", "replace").split()
        if not words:
            raise SparkSetupError(f"{url}.sha1 is empty: the repository gives no checksum to check the jar against")
        expected = words[0].strip().lower()
        digest = hashlib.sha1()
        with urllib.request.urlopen(url, timeout=60) as reply, part.open("wb") as out:
            while chunk := reply.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != expected:
            raise SparkSetupError(f"{url} does not match its SHA-1 ({digest.hexdigest()} != {expected}); not kept")
        shutil.move(part, folder / artifact.file_name)
    except (urllib.error.URLError, OSError) as exc:
        raise SparkSetupError(f"could not download {artifact.coordinate} from {url}: {exc}") from exc
    finally:
        part.unlink(missing_ok=True)
