"""The docs' measured figures come from ``benchmarks/results.json``, never typed by hand, and the README's
links lead somewhere (``make docs`` builds the site itself, strictly, in ``make lint``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.figures import ROOT, FigureError, Results, broken_links, render

RESULTS = {
    "time": "2026-12-01T00:00:00+0000", "cpus": 2, "small": False, "baselines": {"sinks": "a bare loop"},
    "rows": [{"benchmark": "sinks", "name": "parquet sink", "baseline": "a bare loop", "value": 146468.7,
              "baseline_value": 362629.5, "unit": "records/s", "ratio": 0.40391, "target": 0.8, "op": ">=",
              "met": False}],
}
HAND_TYPED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:–\d+(?:\.\d+)?)?(?:×|x\b)|\b(?:two|three|four|five|ten) times\b")


def test_markers_render_the_row_and_a_missing_row_fails_the_build() -> None:
    results = Results(RESULTS)
    page = 'at {{ ratio("sinks", "parquet sink") }} of {{ baseline("sinks", "parquet sink") }}\n{{ benchmark_tables }}'
    text = render(page, results)
    assert text.startswith("at 0.40× of 362,630 records/s\nWritten 2026-12-01")
    assert "Measured 2026-12-01T00:00:00+0000. Baseline: a bare loop" in text
    assert "| parquet sink | 146,469 records/s | 362,630 records/s | 0.40× | >= 0.8 (NOT met) |" in text
    with pytest.raises(FigureError, match="no row 'parquet sinks' in benchmark 'sinks'"):
        render('{{ value("sinks", "parquet sinks") }}', results)


def test_a_marker_names_a_row_by_its_whole_name_and_its_note_of_the_run_is_shown_beside_it() -> None:
    """A row's name holds what it guarantees ("(0 docs read twice)"), so a run that reads documents twice
    renames it and fails the page that names it; what varies from run to run is its note, shown in the
    table and no part of the name (an earlier version matched a name without its parenthesised note)."""
    row = {**RESULTS["rows"][0], "benchmark": "snapshot", "name": "time lost (0 docs read twice)",
           "ratio": 0.1, "note": "median of 7 rounds, 0.05–0.21"}
    results = Results({**RESULTS, "rows": [row]})
    assert render('{{ ratio("snapshot", "time lost (0 docs read twice)") }}', results) == "0.10×"
    assert "| time lost (0 docs read twice); median of 7 rounds, 0.05–0.21 |" in render("{{ benchmark_tables }}", results)
    for other in ("time lost", "time lost (3 docs read twice)", "time lost (0 docs read twice); median of 7 rounds"):
        with pytest.raises(FigureError, match="no row"):
            render(f'{{{{ ratio("snapshot", "{other}") }}}}', results)


def test_every_marker_of_the_docs_names_a_row_of_results_json() -> None:
    results = Results.load()
    pages = sorted((ROOT / "docs").glob("*.md"))
    rendered = [render(page.read_text(), results) for page in pages]
    left = re.compile(r"\{\{\s*(ratio|value|baseline|benchmark_tables)")  # a marker written so that it does not match
    assert not [p.name for p, text in zip(pages, rendered, strict=True) if left.search(text)]


def test_no_measured_ratio_is_typed_by_hand() -> None:
    """A ratio in the README or a page is a marker; only a goal ("goal 0.8", "goal at most 1.5×") is typed."""
    typed = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in HAND_TYPED.finditer(line):
                if "goal" not in line[max(0, match.start() - 20):match.start()]:
                    typed.append(f"{path.relative_to(ROOT)}:{number}: {match.group()}")
    assert not typed, "measured figures typed by hand (use {{ ratio(...) }}):\n" + "\n".join(typed)


def test_the_readme_links_only_to_files_that_exist(tmp_path: Path) -> None:
    assert list(broken_links()) == []
    readme = tmp_path / "README.md"
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "tables.md").write_text("# Tables")
    readme.write_text("[tables](docs/tables.md#types) [gone](docs/gone.md) [site](https://example.org) [top](#x)")
    assert list(broken_links(readme)) == ["docs/gone.md"]


def test_the_property_reference_lists_every_property_with_its_default() -> None:
    from mongocdc_core.config import PROPERTY_SPECS

    page = render((ROOT / "docs" / "properties.md").read_text(), Results.load())
    for spec in PROPERTY_SPECS:
        row = next((line for line in page.splitlines() if line.startswith(f"| `{spec.name}` |")), None)
        assert row is not None, spec.name
        assert spec.default in (None, "") or f"`{spec.default.replace('|', chr(92) + '|')}`" in row, (spec.name, row)
