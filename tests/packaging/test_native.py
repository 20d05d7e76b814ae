"""The compiled conversion is a dependency of mongocdc; without it the Python path runs and says so once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
