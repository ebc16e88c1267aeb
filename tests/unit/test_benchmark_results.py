"""The measured figures the docs show are the recorded results of `make bench`, as they were last rendered.

`make bench` records each benchmark's figures in benchmarks/results/ and renders the tables of the docs from them
(`python -m benchmarks.render`). A table that differs from what the committed results give is older than the
results it came from (or was edited by hand): this fails until `python -m benchmarks.render` is run. Every results
file is whole, each of its figures a finite number (a measure positive, a count of outcomes at least 0), and every
benchmark whose results are committed has its table in docs/benchmarks.md.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.render import (BLOCK, RenderError, Request, number, render_text, requested, stale_pages,
                               target_cell)
from benchmarks.results import (DEFAULT_RESULTS_DIR, REPO_ROOT, Figure, Recorded, Results, at_least, at_most,
                                problems, read_results)

COMMITTED = read_results(DEFAULT_RESULTS_DIR)


def test_every_rendered_table_is_what_the_committed_results_give() -> None:
    stale = stale_pages(REPO_ROOT, COMMITTED)
    assert not stale, (f"tables older than benchmarks/results/ (run `python -m benchmarks.render`): "
                       f"{sorted(str(page.relative_to(REPO_ROOT)) for page in stale)}")


@pytest.mark.parametrize("benchmark", sorted(COMMITTED))
def test_every_results_file_is_whole_and_its_figures_finite(benchmark: str) -> None:
    assert problems(COMMITTED[benchmark]) == []


def recording_benchmarks() -> set[str]:
    """The names the benchmarks record under, read from their source: `Results("name"` (or a name beside it on
    that line, where a benchmark records under one of two)."""
    names = set()
    for module in (REPO_ROOT / "benchmarks").glob("*.py"):
        for line in module.read_text().splitlines():
            if "Results(" in line and not line.lstrip().startswith("#"):
                names.update(re.findall(r'"([a-z][a-z0-9_]*)"', line))
    return names


def test_every_recorded_benchmark_has_its_table_in_the_benchmarks_page() -> None:
    page = (REPO_ROOT / "docs" / "benchmarks.md").read_text()
    shown = {Request.parse(match["spec"]).benchmark for match in BLOCK.finditer(page)}
    assert set(COMMITTED) - shown == set()
    assert requested(REPO_ROOT) - recording_benchmarks() == set(), "a table asks for a benchmark no module records"


def recorded(tmp_path: Path, value: float, *figures: Figure) -> dict[str, Recorded]:
    results = Results("stage", argv=["--rows", "10"])
    results.add("stage's rate", value, "rows/s", at_least(5_000))
    for figure in figures:
        results.add(figure.name, figure.value, figure.unit, figure.target, figure.count)
    results.write(tmp_path)
    return read_results(tmp_path)


def test_a_table_older_than_its_results_is_found(tmp_path: Path) -> None:
    """The check itself can fail: a page rendered from one run differs from the next run's results, and from a
    page whose table was edited by hand."""
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text("# Figures\n<!-- results: stage -->\n<!-- end of results -->\nafter\n")
    first = recorded(tmp_path / "first", 6_000)
    page.write_text(render_text(page.read_text(), first))
    text = page.read_text()
    assert "| stage's rate | 6,000 | rows/s | ≥ 5,000, met |" in text
    assert "`python -m " in text and "--rows 10" in text and text.endswith("<!-- end of results -->\nafter\n")
    assert stale_pages(tmp_path, first) == {}
    assert set(stale_pages(tmp_path, recorded(tmp_path / "second", 4_000))) == {page}
    page.write_text(text.replace("6,000", "6,500"))
    assert set(stale_pages(tmp_path, first)) == {page}


def test_a_marker_takes_the_figures_its_patterns_name(tmp_path: Path) -> None:
    results = recorded(tmp_path, 6_000, Figure("latency, p99", 120, "ms", at_most(100)),
                       Figure("rows lost", 0, "rows", count=True))
    text = render_text("<!-- results: stage: latency* ; rows * -->\n<!-- end of results -->", results)
    assert "| latency, p99 | 120 | ms | ≤ 100, **not met** |" in text
    assert "| rows lost | 0 | rows | – |" in text
    assert "stage's rate" not in text
    with pytest.raises(RenderError, match="no figure of stage matches"):
        render_text("<!-- results: stage: nothing* -->\n<!-- end of results -->", results)
    unrecorded = render_text("<!-- results: other -->\n<!-- end of results -->", results)
    assert "No recorded run of `other` yet" in unrecorded and "|" not in unrecorded


def test_a_file_with_a_figure_that_was_not_measured_is_refused(tmp_path: Path) -> None:
    """A smoke run's check: what a run recorded is a finite number, a measure above 0."""
    for value in (float("nan"), float("inf"), 0.0, -1.0):
        results = Results("stage", argv=[])
        results.add("stage's rate", value, "rows/s")
        results.add("rows lost", 0, "rows", count=True)
        results.write(tmp_path)
        assert [problem.split(" = ")[0] for problem in problems(read_results(tmp_path)["stage"])] == [
            "stage: stage's rate"]


def test_a_run_records_where_it_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_RESULTS_DIR", str(tmp_path))
    results = Results("stage", argv=[])
    results.add("stage's rate", 1.5, "rows/s")
    path = results.write()
    assert path == tmp_path / "stage.json"
    document = json.loads(path.read_text())
    assert {"commit", "modified", "machine", "load_average", "ended", "steal"} <= set(document)
    assert document["figures"] == [{"name": "stage's rate", "value": 1.5, "unit": "rows/s"}]
    with pytest.raises(ValueError, match="added twice"):
        results.add("stage's rate", 2, "rows/s")


@pytest.mark.parametrize(("value", "shown"), [(1_234_567.8, "1,234,568"), (123.4, "123"), (12.34, "12.3"),
                                              (20.0, "20"), (1.234, "1.23"), (0.01234, "0.0123")])
def test_numbers_are_shown_to_the_places_they_carry(value: float, shown: str) -> None:
    assert number(value) == shown


def test_a_target_says_whether_it_is_met() -> None:
    assert target_cell(Figure("rate", 6, "x", at_least(5))) == "≥ 5, met"
    assert target_cell(Figure("rate", 0.56, "x", at_least(0.7))) == "≥ 0.7, **not met**"
    assert target_cell(Figure("rate", 4, "x")) == "–"
