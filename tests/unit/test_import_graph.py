"""The import graph follows the pipeline: stages import the shared core, never each other.

The joiners are adapters of the join engine, so they (and only they) import it; the engine imports
nothing of the project but the core's pure time normalisation; the core imports no stage, and the native stack's operator
(`stack`) imports no stage either: it runs them as processes.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# package -> its folder
PACKAGES = {
    "pipeline_core": "core/pipeline_core",
    "stack": "ops/stack",
    "simulator": "01_simulator/simulator",
    "stream_connector": "03_stream_connector/stream_connector",
    "local_stream_buffer": "05_local_stream_buffer/local_stream_buffer",
    "kafka_joiner": "05_local_stream_buffer/kafka_joiner",
    "spark_joiner": "06_spark_joiner/spark_joiner",
    "db_connector": "07_db_connector/db_connector",
    "grafana_report": "08_influxdb_grafana/grafana_report",
}

# What each package may import of the project besides itself.
ALLOWED = {
    "pipeline_core": set(),
    "stack": {"pipeline_core"},
    "simulator": {"pipeline_core"},
    "stream_connector": {"pipeline_core"},
    # The engine's own API reads event times through the core's one normalisation.
    "local_stream_buffer": {"pipeline_core"},
    "kafka_joiner": {"pipeline_core", "local_stream_buffer"},
    "spark_joiner": {"pipeline_core", "local_stream_buffer"},
    "db_connector": {"pipeline_core"},
    "grafana_report": {"pipeline_core"},
}


def project_imports(package: str) -> dict[str, set[str]]:
    """Project packages imported by each module of `package`, module path -> package names."""
    found: dict[str, set[str]] = {}
    for source in sorted((REPO_ROOT / PACKAGES[package]).rglob("*.py")):
        tree = ast.parse(source.read_text(), filename=str(source))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(source.relative_to(REPO_ROOT))] = (names & PACKAGES.keys()) - {package}
    return found


def test_every_package_is_listed() -> None:
    on_disk = {path.parent.name for path in REPO_ROOT.glob("*/*/__init__.py")
               if not path.parent.parent.name.startswith((".", "tests", "benchmarks"))}
    assert on_disk == set(PACKAGES)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_imports_only_what_the_pipeline_allows(package: str) -> None:
    offending = {module: sorted(imported - ALLOWED[package])
                 for module, imported in project_imports(package).items() if imported - ALLOWED[package]}
    assert offending == {}, f"{package} imports packages it must not: {offending}"


def test_the_join_engine_is_pure() -> None:
    """No I/O clients, no Spark: adapters live at the edges."""
    third_party = {"confluent_kafka", "pyspark", "paho", "influxdb", "py4j"}
    offending = {}
    for source in (REPO_ROOT / PACKAGES["local_stream_buffer"]).rglob("*.py"):
        tree = ast.parse(source.read_text())
        names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
        core_modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        and node.module and node.module.startswith("pipeline_core")}
        if names & third_party or core_modules - {"pipeline_core.timestamps"}:
            offending[source.name] = sorted(names & third_party | core_modules - {"pipeline_core.timestamps"})
    assert offending == {}
