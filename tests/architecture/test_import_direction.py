"""The layering of DESIGN.md section 1, enforced on the source: imports only point the allowed way.

Read statically (``ast``), so a forbidden import fails here even on a path no other test runs,
including imports inside functions.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "mongocdc_core"


def _package(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])


def _imports(source: str, package: str) -> Iterator[tuple[int, str]]:
    """Every module name ``source`` imports (relative ones resolved against ``package``), with its line."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def _forbidden_lines(source: str, package: str, forbidden: tuple[str, ...]) -> dict[int, str]:
    """Line -> the first forbidden module imported on it."""
    found: dict[int, str] = {}
    for line, module in _imports(source, package):
        if any(module == f or module.startswith(f + ".") for f in forbidden):
            found.setdefault(line, module)
    return found


def _violations(files: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in files:
        lines = _forbidden_lines(path.read_text(encoding="utf-8"), _package(path), forbidden)
        found += [f"{path.relative_to(REPO)}:{line} imports {module}" for line, module in sorted(lines.items())]
    return found


def _py(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def test_the_engine_imports_neither_dagster_nor_the_development_stand_ins() -> None:
    assert _py(CORE), "mongocdc_core not found"
    assert _violations(_py(CORE), ("dagster", "dagster_pyspark", "mongocdc_dagster", "mongocdc_devstack")) == []


# Event conversion is pure: no client, socket, file or broker library, and nothing of the engine's edges.
IO_MODULES = (
    "pymongo",
    "confluent_kafka",
    "pyspark",
    "delta",
    "socket",
    "subprocess",
    "shutil",
    "tempfile",
    "pathlib",
    "requests",
    "urllib.request",
    "mongocdc_core.source",
    "mongocdc_core.sinks",
    "mongocdc_core.offsets",
    "mongocdc_core.dispatcher",
    "mongocdc_core.pipeline",
    "mongocdc_core.engine",
    "mongocdc_core.tables",
)


def test_event_conversion_imports_nothing_that_does_io() -> None:
    assert _violations(_py(CORE / "events"), IO_MODULES) == []


def test_sources_emit_into_an_interface_and_never_import_the_dispatcher() -> None:
    forbidden = ("mongocdc_core.dispatcher", "mongocdc_core.pipeline", "mongocdc_core.engine", "mongocdc_core.sinks")
    assert _violations(_py(CORE / "source"), forbidden) == []


def test_the_dispatcher_never_imports_sources() -> None:
    assert _violations([CORE / "dispatcher.py"], ("mongocdc_core.source",)) == []


@pytest.mark.parametrize(
    ("source", "forbidden", "expected"),
    [
        ("import dagster\n", ("dagster",), 1),
        ("from dagster import asset\n", ("dagster",), 1),
        ("def f():\n    from mongocdc_devstack.fixture import x\n", ("mongocdc_devstack",), 1),
        ("from ..dispatcher import Dispatcher\n", ("mongocdc_core.dispatcher",), 1),
        ("import dagsterish\n", ("dagster",), 0),
    ],
)
def test_the_check_itself_finds_what_it_must(source: str, forbidden: tuple[str, ...], expected: int) -> None:
    assert len(_forbidden_lines(source, "mongocdc_core.source", forbidden)) == expected


# -- I/O stays at the edges ----------------------------------------------------------------------------

#: The coordinator, the functions orchestrators call, the dispatcher, the metrics model and the table
#: reconciliation go through source/, sinks/, offsets/ or an exporter: they open no client and write no file.
NO_IO_MODULES = ("engine.py", "api.py", "pipeline.py", "dispatcher.py", "metrics/model.py", "tables/reconcile.py")
CLIENT_CLASSES = frozenset({"MongoClient", "Producer", "Consumer", "AdminClient"})
FILE_CALLS = frozenset({"write_text", "write_bytes", "mkstemp", "NamedTemporaryFile", "fsync", "unlink", "mkdir"})


def _io_calls(source: str) -> list[str]:
    """Calls that open a client or write to the file system, as ``line: name``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
        if (
            name in CLIENT_CLASSES
            or name in FILE_CALLS
            or (isinstance(func, ast.Name) and name == "open")
            or (owner == "os" and name in ("replace", "rename", "remove"))
        ):
            found.append(f"{node.lineno}: {owner + '.' if owner else ''}{name}")
    return found


@pytest.mark.parametrize("module", NO_IO_MODULES)
def test_the_core_opens_no_client_and_writes_no_file_itself(module: str) -> None:
    assert _io_calls((CORE / module).read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("c = MongoClient(uri)\n", 1),
        ("p = confluent_kafka.Producer({})\n", 1),
        ("with open(path, 'wb') as fh: pass\n", 1),
        ("os.replace(a, b)\npath.write_bytes(b'x')\n", 2),
        ("text.replace('a', 'b')\nclient.close()\n", 0),
    ],
)
def test_the_io_check_itself_finds_what_it_must(source: str, expected: int) -> None:
    assert len(_io_calls(source)) == expected
