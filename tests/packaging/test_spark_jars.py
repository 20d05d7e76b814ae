"""The tables' jars for a pip user: the pom as the one list, ``mongocdc tables jars``, Spark's package mechanism.

Each way runs for real against Maven Central (the package index this machine reaches) and in a fresh
Python process, so no Spark session of another test decides which jars are on the class path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mongocdc_core.tables import jars

BIN = Path(sys.executable).parent


def test_the_pom_names_every_jar_with_its_version() -> None:
    found = jars.SPARK_JARS.artifacts()
    assert len(found) == 11 and all("${" not in a.coordinate for a in found)
    assert {a.file_name for a in found} >= {"delta-spark_4.2_2.13-4.4.0.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar"}
    if jars.SPARK_JARS.checkout.is_dir():  # what Maven copied for `make setup` is exactly the same list
        assert {p.name for p in jars.SPARK_JARS.checkout.glob("*.jar")} == {a.file_name for a in found}


def test_jars_command_fetches_what_maven_fetches(tmp_path: Path) -> None:
    target = tmp_path / "jars"
    run = subprocess.run([str(BIN / "mongocdc"), "tables", "jars", "--dir", str(target)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr
    assert "[11/11]" in run.stderr and f"MONGOCDC_SPARK_JARS={target}" in run.stderr  # the command's log lines
    assert jars.SPARK_JARS.missing(target) == [] and not list(target.glob("*.part"))
    if jars.SPARK_JARS.checkout.is_dir():
        for jar in target.glob("*.jar"):
            assert jar.read_bytes() == (jars.SPARK_JARS.checkout / jar.name).read_bytes(), jar.name
    again = subprocess.run([str(BIN / "mongocdc"), "tables", "jars", "--dir", str(target),
                            "--repository", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, "jars already there are not fetched again"


def test_a_download_that_fails_keeps_nothing_and_says_so(tmp_path: Path) -> None:
    run = subprocess.run([str(BIN / "mongocdc"), "tables", "jars", "--dir", str(tmp_path),
                          "--repository", "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert " mongocdc tables jars: could not download io.delta:delta-spark_4.2_2.13:4.4.0" in run.stderr
    assert "Traceback" not in run.stderr and list(tmp_path.iterdir()) == []


def test_a_directory_that_cannot_be_made_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    run = subprocess.run([str(BIN / "mongocdc"), "tables", "jars", "--dir", str(tmp_path / "file" / "jars")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stderr
    assert "mongocdc tables jars: cannot make the directory" in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_a_named_directory_without_the_jars_says_what_to_do(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "delta-storage-4.4.0.jar").write_bytes(b"")
    monkeypatch.setenv(jars.ENV_JARS, str(tmp_path))
    with pytest.raises(jars.SparkSetupError) as error:
        jars.spark_jars_conf()
    message = str(error.value)
    assert "delta-spark_4.2_2.13-4.4.0.jar" in message and "delta-storage-4.4.0.jar" not in message.split(";")[0]
    assert "mongocdc tables jars" in message and "spark.jars.packages" in message


#: A session built as a pip user's is: no checkout jars, an empty user cache, Ivy's cache in tmp.
_SESSION = textwrap.dedent("""
    import sys
    from pathlib import Path
    from mongocdc_core import maven
    from mongocdc_core.tables import jars, session
    maven.CHECKOUT_JARS = Path(sys.argv[1]) / "no-checkout"
    try:
        spark = session.spark_session("local[1]")
    except jars.SparkSetupError as exc:
        print("SETUP-ERROR", exc)
        raise SystemExit(3)
    spark.range(5).write.format("delta").save(sys.argv[1] + "/table")
    print("ROWS", spark.read.format("delta").load(sys.argv[1] + "/table").count())
    print("JARS", ",".join(sorted(Path(j).name for j in spark.sparkContext._jsc.sc().listJars().mkString(",").split(","))))
""")


def _pip_user_session(tmp_path: Path, ivy_settings: str | None = None) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "conf"
    conf.mkdir()
    defaults = f"spark.jars.ivy {tmp_path / 'ivy'}\n"
    if ivy_settings is not None:
        (conf / "ivysettings.xml").write_text(ivy_settings)
        defaults += f"spark.jars.ivySettings {conf / 'ivysettings.xml'}\n"
    (conf / "spark-defaults.conf").write_text(defaults)
    env = {k: v for k, v in os.environ.items() if k != jars.ENV_JARS}
    env |= {"SPARK_CONF_DIR": str(conf), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-c", _SESSION, str(tmp_path)], capture_output=True, text=True,
                          timeout=600, env=env, check=False)


@pytest.mark.slow
def test_spark_resolves_exactly_the_pom_jars_from_maven_central(tmp_path: Path) -> None:
    run = _pip_user_session(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "ROWS 5" in run.stdout
    listed = next(line for line in run.stdout.splitlines() if line.startswith("JARS ")).split(" ", 1)[1].split(",")
    # Ivy names a jar <group>_<artifact>-<version>.jar: the pom's jars and nothing pyspark already ships
    assert sorted(listed) == sorted(f"{a.group}_{a.file_name}" for a in jars.SPARK_JARS.artifacts())


@pytest.mark.slow
def test_spark_without_a_reachable_repository_names_the_three_ways(tmp_path: Path) -> None:
    unreachable = textwrap.dedent("""
        <ivysettings><settings defaultResolver="nowhere"/>
          <resolvers><ibiblio name="nowhere" m2compatible="true" root="http://127.0.0.1:9/maven2/"/></resolvers>
        </ivysettings>""")
    run = _pip_user_session(tmp_path, unreachable)
    assert run.returncode == 3, run.stdout + run.stderr[-3000:]
    message = next(line for line in run.stdout.splitlines() if line.startswith("SETUP-ERROR"))
    assert "could not resolve the table jars" in message
    assert "MONGOCDC_SPARK_JARS" in message and "mongocdc tables jars" in message
