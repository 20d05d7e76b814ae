"""The benchmark figures in the documentation, made from ``benchmarks/results.json`` (an mkdocs hook).

The same hook renders ``{{ property_reference }}``, every connector property from the specs the config is
validated by (:func:`mongocdc_core.config.reference.property_reference`).

The docs never type a measured figure by hand: a page writes ``{{ ratio("sinks", "parquet sink") }}``
(also ``value`` and ``baseline``) for one row of the last ``make bench``, and ``{{ benchmark_tables }}``
for every row. A marker naming no row fails the build, so a renamed benchmark cannot leave a stale figure.
The hook also checks that the README's relative links lead to files of the checkout, since the README is
not a page of the site.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mongocdc_core.config.reference import property_reference

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results.json"
MARKER = re.compile(r'\{\{\s*(ratio|value|baseline)\("([^"]+)",\s*"([^"]+)"\)\s*\}\}')
TABLES = "{{ benchmark_tables }}"
PROPERTIES = "{{ property_reference }}"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


class FigureError(Exception):
    """A page names a figure ``results.json`` does not hold, or the README links to nothing."""


@dataclass(frozen=True)
class Results:
    """One ``make bench`` run as ``benchmarks/run.py`` wrote it."""

    data: dict[str, Any]

    @classmethod
    def load(cls, path: Path = RESULTS) -> Results:
        return cls(json.loads(path.read_text()))

    def row(self, benchmark: str, name: str) -> dict[str, Any]:
        """The row of exactly that name (a row's ``note`` of its run is no part of it)."""
        for row in self.data["rows"]:
            if row["benchmark"] == benchmark and row["name"] == name:
                return dict(row)
        raise FigureError(f"benchmarks/results.json has no row {name!r} in benchmark {benchmark!r}")

    def benchmarks(self) -> list[str]:
        return list(dict.fromkeys(row["benchmark"] for row in self.data["rows"]))


def number(value: float, unit: str = "") -> str:
    """A measured value as a reader takes it in: thousands separated, three significant digits below 100."""
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def figure(results: Results, kind: str, benchmark: str, name: str) -> str:
    row = results.row(benchmark, name)
    if kind == "ratio":
        return f"{row['ratio']:.2f}×"
    return number(row["value" if kind == "value" else "baseline_value"], row["unit"])


def tables(results: Results) -> str:
    """Every row of the run, one table per benchmark, with the run's date, size and baselines."""
    data = results.data
    size = "CI size (MONGOCDC_BENCH_SMALL=1)" if data.get("small") else "full size"
    out = [f"Written {data['time']} on {data['cpus']} cores, {size}.", ""]
    measured = data.get("measured") or {}
    for benchmark in results.benchmarks():
        rows = [r for r in data["rows"] if r["benchmark"] == benchmark]
        out += [f"## {benchmark}", "", f"Measured {measured.get(benchmark, data['time'])}. "
                f"Baseline: {data['baselines'].get(benchmark, rows[0]['baseline'])}", "",
                "| row | value | baseline | ratio | goal |", "| --- | ---: | ---: | ---: | --- |"]
        for r in rows:
            goal = "" if r["target"] is None else f"{r['op']} {r['target']} ({'met' if r['met'] else 'NOT met'})"
            name = (f"{r['name']}; {r['note']}" if r.get("note") else r["name"]).replace("|", "\\|")
            out.append(f"| {name} | {number(r['value'], r['unit'])} | {number(r['baseline_value'], r['unit'])} "
                       f"| {r['ratio']:.2f}× | {goal} |")
        out.append("")
    return "\n".join(out)


def render(markdown: str, results: Results) -> str:
    markdown = markdown.replace(TABLES, tables(results)) if TABLES in markdown else markdown
    markdown = markdown.replace(PROPERTIES, property_reference()) if PROPERTIES in markdown else markdown
    return MARKER.sub(lambda m: figure(results, m.group(1), m.group(2), m.group(3)), markdown)


def broken_links(readme: Path = ROOT / "README.md") -> Iterator[str]:
    """The README's relative links whose file is not in the checkout."""
    for target in LINK.findall(readme.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        if not (readme.parent / target.split("#", 1)[0]).exists():
            yield target


# -- mkdocs hooks (mkdocs.yml: hooks) -------------------------------------------------------------------


_build: dict[str, Results] = {}  # the results one build renders every page from (read once, in on_pre_build)


def on_pre_build(config: Any) -> None:
    broken = list(broken_links())
    if broken:
        raise FigureError(f"README.md links to files that do not exist: {', '.join(broken)}")
    _build["results"] = Results.load()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown, _build["results"])
