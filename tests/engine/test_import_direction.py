"""Control flows one way: sources never import the dispatcher or the pipeline that drives them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "mongocdc_core"
FORBIDDEN_IN_SOURCE = ("mongocdc_core.dispatcher", "mongocdc_core.pipeline", "mongocdc_core.engine")
FORBIDDEN_IN_DISPATCHER = ("mongocdc_core.source",)


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (``import x``, ``from x import y``, also inside functions)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def violations(path: Path, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        name for name in imported_modules(path) if any(name == f or name.startswith(f + ".") for f in forbidden)
    )


@pytest.mark.parametrize("path", sorted((CORE / "source").glob("*.py")), ids=lambda p: p.name)
def test_sources_do_not_import_the_dispatcher_or_the_pipeline(path: Path) -> None:
    assert violations(path, FORBIDDEN_IN_SOURCE) == []


def test_the_dispatcher_does_not_import_sources() -> None:
    assert violations(CORE / "dispatcher.py", FORBIDDEN_IN_DISPATCHER) == []


def test_the_check_sees_imports(tmp_path: Path) -> None:
    """The checker itself finds both import forms, including a late import inside a function."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from mongocdc_core.dispatcher import Dispatcher\n"
        "def f():\n    import mongocdc_core.pipeline\n"
        "from mongocdc_core import engine\n"
    )
    assert violations(sample, FORBIDDEN_IN_SOURCE) == [
        "mongocdc_core.dispatcher",
        "mongocdc_core.dispatcher.Dispatcher",
        "mongocdc_core.engine",
        "mongocdc_core.pipeline",
    ]
