"""Each class of the stages is readable in one sitting: at most 250 lines from its `class` line to its end,
docstrings and comments included. A class that grows past it has a concept to give a module of its own."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STAGES = ("01_simulator", "03_stream_connector", "05_local_stream_buffer", "06_spark_joiner", "07_db_connector",
          "08_influxdb_grafana", "core")
MAX_CLASS_LINES = 250


def classes(stage: str) -> list[tuple[str, int]]:
    found = []
    for path in sorted((REPO_ROOT / stage).rglob("*.py")):
        if ".venv" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found.append((f"{path.relative_to(REPO_ROOT)}:{node.name}", node.end_lineno - node.lineno + 1))
    return found


@pytest.mark.parametrize("stage", STAGES)
def test_no_class_of_a_stage_is_longer_than_a_sitting(stage: str) -> None:
    found = classes(stage)
    assert found, f"no class found in {stage}: the walk is looking in the wrong place"
    assert [(name, lines) for name, lines in found if lines > MAX_CLASS_LINES] == []
