"""The layering of docs/architecture.md (section 1, Layers), enforced on the source: imports only point
the allowed way, and no module imports itself back through others.

Read statically (``ast``), so a forbidden import fails here even on a path no other test runs,
including imports inside functions. Imports under ``if TYPE_CHECKING:`` are left out of the circle
check: they never run, so they cannot close a circle at import time (they still count for direction).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator, Mapping
from itertools import pairwise
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE = REPO / "mongocdc_core"
#: The product's packages, then the code that exercises them.
PACKAGES = ("mongocdc_core", "mongocdc_dagster", "mongocdc_devstack")
ROOTS = (*PACKAGES, "benchmarks", "tests")


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


#: What each product package must never import: the engine is below everything; Dagster and the
#: development stand-ins both build on the engine and not on each other (the Dagster package starts the
#: emulator as a separate process); no product code imports the tests or the benchmarks.
FORBIDDEN_BY_PACKAGE = {
    "mongocdc_core": ("mongocdc_dagster", "mongocdc_devstack", "tests", "benchmarks"),
    "mongocdc_dagster": ("mongocdc_devstack", "tests", "benchmarks"),
    "mongocdc_devstack": ("mongocdc_dagster", "dagster", "tests", "benchmarks"),
}


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_only_what_is_below_it(package: str) -> None:
    assert _py(REPO / package), f"{package} not found"
    assert _violations(_py(REPO / package), FORBIDDEN_BY_PACKAGE[package]) == []


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
    "mongocdc_core.coordinator",
    "mongocdc_core.tables",
)


def test_event_conversion_imports_nothing_that_does_io() -> None:
    assert _violations(_py(CORE / "events"), IO_MODULES) == []


def test_sources_emit_into_an_interface_and_never_import_the_dispatcher() -> None:
    forbidden = ("mongocdc_core.dispatcher", "mongocdc_core.pipeline", "mongocdc_core.coordinator", "mongocdc_core.sinks")
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
NO_IO_MODULES = ("coordinator.py", "api.py", "pipeline.py", "dispatcher.py", "metrics/model.py", "tables/reconcile.py")
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


# -- no circles --------------------------------------------------------------------------------------


def _module_name(path: Path) -> tuple[str, bool]:
    """The dotted name of a source file, and whether it is a package's ``__init__``."""
    parts = path.relative_to(REPO).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _type_checking_only(tree: ast.AST) -> set[int]:
    """``id`` of every node under an ``if TYPE_CHECKING:`` (plain or ``typing.``)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                skipped.update(id(child) for statement in node.body for child in ast.walk(statement))
    return skipped


def _known(name: str, modules: Mapping[str, object]) -> str | None:
    """The longest prefix of ``name`` that is one of ``modules`` (``a.b.f`` -> module ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _module_imports(source: str, module: str, is_package: bool, modules: Mapping[str, object]) -> dict[str, int]:
    """The modules of ``modules`` that ``module`` imports at run time (any depth), each with its first line.

    ``from package import submodule`` is an import of the submodule; ``from package import name``
    (a name the package's ``__init__`` defines) is an import of the package.
    """
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    skipped = _type_checking_only(tree)
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_known(alias.name, modules) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                targets.append(submodule if submodule in modules else _known(origin, modules))
        for target in targets:
            if target is not None and target != module:
                found.setdefault(target, node.lineno)
    return found


def _import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, dict[str, int]]:
    """Module -> {imported module: line}, for ``sources`` = module -> (source text, is a package)."""
    return {name: _module_imports(text, name, is_package, sources) for name, (text, is_package) in sources.items()}


def _circles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """Every group of modules that import each other round (strongly connected, Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a long chain of imports cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(groups)


def _one_round(graph: Mapping[str, Mapping[str, int]], group: list[str]) -> str:
    """The shortest way round from the group's first module back to it, with the line of each import."""
    members = set(group)
    start = group[0]
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node]):
            if target not in members or target in came_from:
                continue
            came_from[target] = node
            if target == start:
                queue.clear()
                break
            queue.append(target)
    path = [start]
    while True:
        path.append(came_from[path[-1]])
        if path[-1] == start:
            break
    path.reverse()
    return " -> ".join(f"{a}:{graph[a][b]}" for a, b in pairwise(path)) + f" -> {start}"


def _report(graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    return [f"{len(group)} modules {group}: {_one_round(graph, group)}" for group in _circles(graph)]


def _sources(root: str) -> dict[str, tuple[str, bool]]:
    sources = {}
    for path in _py(REPO / root):
        name, is_package = _module_name(path)
        sources[name] = (path.read_text(encoding="utf-8"), is_package)
    return sources


@pytest.mark.parametrize("root", ROOTS)
def test_no_module_imports_itself_back(root: str) -> None:
    """A circle makes the import order decide what works, and hides which module is below which."""
    sources = _sources(root)
    graph = _import_graph(sources)
    assert any(graph.values()), f"{root}: no imports between its modules found"
    circles = _report(graph)
    assert not circles, "\n".join(circles)


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        # a plain circle, through an import inside a function
        ({"p.a": ("from p.b import f\n", False), "p.b": ("def g():\n    from p import a\n", False)}, [["p.a", "p.b"]]),
        # three modules round, relative imports
        ({"p.a": ("from .b import x\n", False), "p.b": ("from . import c\n", False), "p.c": ("import p.a\n", False)},
         [["p.a", "p.b", "p.c"]]),
        # a package registering its children, which import names its __init__ defines
        ({"p": ("def load():\n    from . import a\n", True), "p.a": ("from . import register\n", False)}, [["p", "p.a"]]),
        # importing a submodule through its package is not importing the package's __init__ back
        ({"p": ("from p.a import x\n", True), "p.a": ("from p import b\n", False), "p.b": ("y = 1\n", False)}, []),
        # imports only a type checker reads do not count
        ({"p.a": ("from p.b import f\n", False),
          "p.b": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.a import g\n", False)}, []),
    ],
)
def test_the_circle_check_itself_finds_what_it_must(
    sources: dict[str, tuple[str, bool]], expected: list[list[str]]
) -> None:
    graph = _import_graph(sources)
    assert _circles(graph) == expected
    assert all(group[0] in line for group, line in zip(expected, _report(graph), strict=True))
