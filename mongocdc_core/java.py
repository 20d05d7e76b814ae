"""The Java runtimes mongocdc starts (Spark's driver, the local Kafka broker): which ``java``, and what version.

Standard library only, so that the devstack and the tables ask the same questions the same way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

#: The Java versions the pinned Spark (4.2) runs on.
SPARK_JAVAS = (17, 21, 25)
#: The first Java that records an ahead-of-time cache in one run (JEP 514), with method profiles (JEP 515).
AOT_CACHE_JAVA = 25


class JavaRuntime(NamedTuple):
    """A ``java`` executable (its real path), the JDK's version (``25.0.3``), its build (``25.0.3+9-LTS``, which
    tells apart two builds of one version) and its major number."""

    java: str
    version: str
    build: str
    major: int


def java_executable(*, fallback_to_path: bool = True) -> str | None:
    """``$JAVA_HOME/bin/java`` when JAVA_HOME is set (Spark's ``spark-class`` then takes it, runnable or not;
    with ``fallback_to_path`` one that is not runnable gives way), else ``java`` on PATH; None when neither."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = str(Path(java_home) / "bin" / "java")
        if os.access(candidate, os.X_OK) or not fallback_to_path:
            return candidate
    return shutil.which("java")


@lru_cache(maxsize=16)
def java_runtime(java: str) -> JavaRuntime | None:
    """What ``java`` is: from its JDK's ``release`` file when it has one (no JVM started), else by asking the
    executable; None when it cannot be run or told."""
    real = Path(java).resolve()
    if not os.access(real, os.X_OK):
        return None
    fields: dict[str, str] = {}
    release = real.parent.parent / "release"
    try:
        if release.is_file():
            fields = dict(re.findall(r'^(JAVA_VERSION|JAVA_RUNTIME_VERSION)="([^"]*)"', release.read_text(errors="replace"),
                                     re.MULTILINE))
        if "JAVA_VERSION" not in fields:
            shown = subprocess.run([str(real), "-XshowSettings:properties", "-version"], capture_output=True, text=True,
                                   timeout=60, check=False).stderr
            fields = {name: value for key, name in (("java.version", "JAVA_VERSION"),
                                                    ("java.runtime.version", "JAVA_RUNTIME_VERSION"))
                      if (value := _property(shown, key))}
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = fields.get("JAVA_VERSION")
    if not version:
        return None
    parts = version.split(".")
    major = parts[1] if parts[0] == "1" and len(parts) > 1 else re.split(r"[^0-9]", parts[0])[0]
    if not major.isdigit():
        return None
    return JavaRuntime(str(real), version, fields.get("JAVA_RUNTIME_VERSION") or version, int(major))


def _property(shown: str, key: str) -> str | None:
    found = re.search(rf"^\s*{re.escape(key)} = (\S+)", shown, re.MULTILINE)
    return found.group(1) if found else None


def version_key(runtime: JavaRuntime) -> tuple[int, ...]:
    """A runtime's version as numbers, to order two JDKs of one major version (``25.0.10`` after ``25.0.3``)."""
    return tuple(int(n) for n in re.findall(r"\d+", runtime.version))


def installed_jdks(root: Path) -> list[tuple[Path, JavaRuntime]]:
    """The JDKs in ``root`` (``/usr/lib/jvm`` on Debian), each once: symbolic links to another are left out, as are
    directories without ``bin/java``."""
    found = []
    for home in sorted(root.glob("*")):
        if home.is_symlink() or not (home / "bin" / "java").is_file():
            continue
        runtime = java_runtime(str(home / "bin" / "java"))
        if runtime is not None:
            found.append((home, runtime))
    return found
