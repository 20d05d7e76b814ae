"""The compiled conversion is a dependency of mongocdc; without it the Python path runs and says so once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_WITHOUT_NATIVE = textwrap.dedent("""
    import sys
    sys.modules["mongocdc_native"] = None  # as on a platform with no wheel of it: the import fails
    from mongocdc_core.events import raw
    assert raw.native is None
    for _ in range(3):  # every run of a process (a Dagster run worker runs several) starts with this
        raw.say_if_python_path()
""")


def test_without_the_compiled_module_one_line_says_so() -> None:
    run = subprocess.run([sys.executable, "-c", _WITHOUT_NATIVE], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("mongocdc_native (the compiled conversion) is not available")
    assert "converting in Python" in lines[0]


def test_with_the_compiled_module_nothing_is_said() -> None:
    run = subprocess.run([sys.executable, "-c", "from mongocdc_core.events import raw; assert raw.native; "
                          "raw.say_if_python_path()"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr


def test_the_sdist_builds_the_compiled_module_where_rust_is_present(tmp_path: Path) -> None:
    """``make wheels``' sdist of mongocdc-native, installed from source as pip does on a platform with no
    wheel: the Rust crate compiles (maturin, from the package index) and the installed module converts."""
    if shutil.which("cargo") is None:
        pytest.skip("no Rust toolchain (cargo) on this machine: the sdist has nothing to build with")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path / "dist"), str(REPO / "native")],
                   check=True, capture_output=True, timeout=600)
    (sdist,) = (tmp_path / "dist").glob("mongocdc_native-*.tar.gz")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(sdist)],
                   check=True, capture_output=True, timeout=1200)
    probe = ("import mongocdc_native, sys; print(mongocdc_native.__file__); "
             "print(mongocdc_native.document_bounds(bytes.fromhex('0500000000') * 2))")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    where, bounds = run.stdout.splitlines()
    assert Path(where).is_relative_to(target), where
    assert bounds == "[0, 5, 10]", bounds
