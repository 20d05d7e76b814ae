"""Spark's driver JVM starts from an ahead-of-time cache on Java 25 and newer (JEP 483, 514, 515).

Every Dagster run of the tables starts a fresh JVM, and a fresh JVM spends much of a small refresh loading,
linking and profiling Spark's classes again. Measured on 20 collections × 1 change, a first cycle in a fresh
JVM took 60–63 s on Java 25 starting from the cache, against 75 s on Java 17 (both with the throughput
collector; 83–88 s on Java 17 with G1), with a quarter less of the JVM's CPU. The cache (about 165–220 MB)
holds the classes of the JDK's and Spark's class path a JVM loaded and linked (not those of ``spark.jars``,
which Spark's own class loader loads) and the profiles of the methods it ran.

Nothing is configured. While a cache is missing, one driver at a time records it (``-XX:AOTCacheOutput``: the
JVM writes it as it exits, with a second JVM that assembles it); the next session start finds it finished and
renames it into place, and from then on every driver maps it (``-XX:AOTCache``). One cache per Java build,
Spark installation and set of JVM options, so an upgrade records anew; caches unused for 30 days are removed.
A recording that fails (its log is ``<key>.log`` beside it) is not tried again for a day, and a JVM that cannot
use a cache says so on its log and runs without. The caches live under ``$XDG_CACHE_HOME/mongocdc/spark-aot``;
``MONGOCDC_SPARK_AOT_CACHE`` names another directory, or ``off``. Deleting the directory starts over.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import pyspark

from mongocdc_core.java import AOT_CACHE_JAVA, JavaRuntime, java_executable, java_runtime
from mongocdc_core.maven import user_cache_dir

log = logging.getLogger(__name__)

ENV_AOT_CACHE = "MONGOCDC_SPARK_AOT_CACHE"
#: How long a failed recording keeps the next from being tried.
RETRY_S = 86_400.0
#: Caches of another Java, Spark or options unused this long are removed.
UNUSED_S = 30 * 86_400.0
#: What the cache's key is made of besides the JVM options: what puts classes on the driver's class path.
CLASS_PATH_ENV = ("SPARK_HOME", "SPARK_CONF_DIR", "HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH",
                  "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")
CLASS_PATH_CONF = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath", "spark.driver.defaultJavaOptions")
#: pyspark's own Spark installation (its launcher and jars).
PYSPARK_HOME = Path(pyspark.__file__).resolve().parent


def with_start_cache(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the driver option that starts its JVM from the cache, or records one while there is none:
    call it where the session starts (:func:`.session.spark_session`, the Dagster resource), not before, as it
    may claim the recording. Unchanged below Java 25, with the cache off, or when anything is in the way (an
    optional speed-up never stops a session)."""
    try:
        option = _option(conf)
    except Exception as exc:  # noqa: BLE001  # e.g. no home directory, a cache on a full disk
        log.debug(f"no ahead-of-time cache for Spark's driver: {type(exc).__name__}: {exc}")
        return conf
    if option is None:
        return conf
    options = conf.get("spark.driver.extraJavaOptions", "")
    return conf | {"spark.driver.extraJavaOptions": f"{options} {option}".strip()}


def _spark_runtime() -> JavaRuntime | None:
    """The Java pyspark's own launcher runs: None when another Spark installation or its ``spark-env.sh`` (which
    may set another JAVA_HOME) decides it, as the guess could then name options that Java refuses."""
    spark_home = os.environ.get("SPARK_HOME")
    if spark_home and Path(spark_home).resolve() != PYSPARK_HOME:
        return None
    conf_dir = Path(os.environ.get("SPARK_CONF_DIR") or PYSPARK_HOME / "conf")
    if (conf_dir / "spark-env.sh").exists():
        return None
    java = java_executable(fallback_to_path=False)
    return java_runtime(java) if java is not None else None


def _option(conf: dict[str, str]) -> str | None:
    setting = os.environ.get(ENV_AOT_CACHE, "")
    if setting.lower() in {"off", "false", "0", "no"}:
        return None
    runtime = _spark_runtime()
    if runtime is None or runtime.major < AOT_CACHE_JAVA:
        return None
    folder = (Path(setting).expanduser() if setting else user_cache_dir() / "spark-aot").resolve()
    if any(c.isspace() or c in "\"'" for c in str(folder)):  # Spark's launcher splits the options at spaces
        return None
    folder.mkdir(parents=True, exist_ok=True)
    if not os.access(folder, os.W_OK):
        return None
    cache = folder / f"{_key(conf, runtime)}.aot"
    _tidy(cache)
    if cache.is_file():
        os.utime(cache)  # in use: kept
        return f"-XX:AOTCache={cache}"
    failed = cache.with_suffix(".failed")
    if failed.exists() and time.time() - failed.stat().st_mtime < RETRY_S:
        return None
    if not _claim(cache.with_suffix(".recording")):
        return None  # another driver records it
    recording = cache.with_name(f"{cache.stem}.rec-{os.getpid()}-{time.time_ns()}.aot")
    # the recording JVM warns of every class it leaves out and of module options it cannot keep (Spark's
    # --add-opens): to a file beside it, not the run's output
    return f"-XX:AOTCacheOutput={recording} -Xlog:aot*=warning,cds*=warning:file={cache.with_suffix('.log')}::filecount=0"


def driver_started(conf: dict[str, str], jvm_pid: int) -> None:
    """The recording's lock names the driver JVM that records (it had this process's pid until the JVM ran): the
    JVM outlives this process while it writes and assembles the recording, and only its end tells that it is
    done or failed."""
    option = next((o for o in conf.get("spark.driver.extraJavaOptions", "").split() if o.startswith("-XX:AOTCacheOutput=")), None)
    if option is None:
        return
    recording = Path(option.split("=", 1)[1])
    lock = recording.with_name(recording.name.split(".rec-")[0] + ".recording")
    try:
        if lock.read_text().strip() == str(os.getpid()):
            lock.write_text(str(jvm_pid))
    except OSError as exc:  # gone: another process judged this one dead; the recording still finishes
        log.debug(f"the ahead-of-time cache's lock {lock}: {exc}")


def _key(conf: dict[str, str], runtime: JavaRuntime) -> str:
    """What the JVM's cached classes and flags depend on (not, say, the log file a ``-D`` property names)."""
    options = [o for o in conf.get("spark.driver.extraJavaOptions", "").split() if o.startswith("-XX:")]
    identity = "\n".join([runtime.java, runtime.build, str(PYSPARK_HOME), *options,
                          *(f"{k}={conf.get(k, '')}" for k in CLASS_PATH_CONF),
                          *(f"{k}={os.environ.get(k, '')}" for k in CLASS_PATH_ENV)])
    return f"java{runtime.major}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"


def _claim(lock: Path) -> bool:
    """Whether this process is now the one that records (the lock holds its pid); a lock whose process is gone
    is taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _holder_alive(lock):
                return False
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def _holder_alive(lock: Path) -> bool:
    try:
        pid = int(lock.read_text().strip() or 0)
    except (OSError, ValueError):
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _tidy(cache: Path) -> None:
    """Promote a finished recording, remove what is left over. The JVM creates ``<recording>.config`` when it
    starts, fills it as it exits, assembles the recording from it in a second JVM, waits for that and removes
    the ``.config`` last: a recording without its ``.config`` is whole. Once the recording JVM (the lock's pid)
    is gone, an empty ``.config`` is a JVM killed before it exited (tried again), a filled one a failed assembly."""
    folder, now = cache.parent, time.time()
    lock = cache.with_suffix(".recording")
    for recording in sorted(folder.glob(f"{cache.stem}.rec-*.aot")):
        if recording.with_name(recording.name + ".config").exists():
            continue
        try:
            if cache.is_file():  # another driver's recording finished first
                recording.unlink()
            else:
                os.replace(recording, cache)
                lock.unlink(missing_ok=True)
        except FileNotFoundError:  # another process got there first
            continue
    if lock.exists() and _holder_alive(lock):
        return
    for config in folder.glob(f"{cache.stem}.rec-*.aot.config"):
        try:
            if config.stat().st_size:
                cache.with_suffix(".failed").touch()
                log.warning(f"Spark's driver could not record its ahead-of-time cache (see {cache.with_suffix('.log')}); "
                            "drivers run without one, and it is tried again in a day")
            config.with_name(config.name.removesuffix(".config")).unlink(missing_ok=True)
            config.unlink()
        except FileNotFoundError:
            continue
    lock.unlink(missing_ok=True)
    for other in folder.glob("java*-*.aot"):
        if ".rec-" in other.name or other == cache:
            continue
        try:
            if now - other.stat().st_mtime > UNUSED_S:
                for leftover in (other, other.with_suffix(".failed"), other.with_suffix(".log")):
                    leftover.unlink(missing_ok=True)
        except FileNotFoundError:
            continue
