"""The import graph follows the pipeline: stages import the shared core, never each other.

The joiners are adapters of the join engine, so they (and only they) import it; the engine imports
nothing of the project but the core's pure time normalisation; the core imports no stage, and the native stack's operator
(`stack`) imports no stage either: it runs them as processes.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
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
    "live_dashboards": "08_influxdb_grafana/live_dashboards",
    "join_reference": "ops/join_reference",
    "soak": "ops/soak",
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
    # The live pages draw the report's panels: its dashboard model, macros and queries, one source for both.
    "live_dashboards": {"pipeline_core", "grafana_report"},
    # The oracle of the join: nothing of the project, the joiners' engine least of all.
    "join_reference": set(),
    # The soak runs the stack (`stack`), publishes through the simulator's publisher and checks against the
    # reference join: never the joiners' code.
    "soak": {"pipeline_core", "stack", "simulator", "join_reference"},
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
        # Pure modules of core only: times, and record keys (what a key names).
        pure = {"pipeline_core.timestamps", "pipeline_core.record_keys"}
        if names & third_party or core_modules - pure:
            offending[source.name] = sorted(names & third_party | core_modules - pure)
    assert offending == {}


def module_imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, anywhere in it (inside functions too: an import
    moved into a function to break a circle still closes it)."""
    root = REPO_ROOT / PACKAGES[package]
    modules = {".".join(source.relative_to(root).with_suffix("").parts): source for source in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, source in modules.items():
        here = name.split(".")[:-1]  # the module's own sub-package, for relative imports
        targets: set[str] = set()
        for node in ast.walk(ast.parse(source.read_text(), filename=str(source))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = here[:len(here) - (node.level - 1)]
                stem = [*base, *(node.module.split(".") if node.module else [])]
                candidates = [".".join([*stem, alias.name]) for alias in node.names] + [".".join(stem)]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
                stem = node.module.split(".")[1:]
                candidates = [".".join([*stem, alias.name]) for alias in node.names] + [".".join(stem)]
            elif isinstance(node, ast.Import):
                candidates = [".".join(alias.name.split(".")[1:]) for alias in node.names
                              if alias.name.split(".")[0] == package]
            else:
                continue
            targets.update(candidate for candidate in candidates if candidate in modules)
        graph[name] = targets - {name, "__init__"}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`, each as the path that closes it."""
    found, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            found.append(path[path.index(module):] + [module])
            return
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_package_has_an_import_circle(package: str) -> None:
    assert circles(module_imports(package)) == []


def test_the_circle_check_finds_a_circle_closed_inside_a_function() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_compose_scripts_import_only_the_core() -> None:
    """ops/compose: scripts the Makefile runs by path, beside the `stack` package, under the same rule."""
    for source in (REPO_ROOT / "ops" / "compose").glob("*.py"):
        tree = ast.parse(source.read_text())
        names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
        names |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
        assert names & PACKAGES.keys() <= {"pipeline_core"}, source.name


def test_only_the_core_s_influx_module_imports_the_influxdb_library() -> None:
    """pipeline_core.influx keeps pandas out of every process that talks to InfluxDB (see its docstring): an
    `influxdb` import anywhere else could run before it and bring pandas back."""
    offending = []
    for package, folder in PACKAGES.items():
        for source in (REPO_ROOT / folder).rglob("*.py"):
            tree = ast.parse(source.read_text())
            names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            names |= {node.module for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module}
            if any(name.split(".")[0] == "influxdb" for name in names):
                offending.append(str(source.relative_to(REPO_ROOT)))
    assert offending == ["core/pipeline_core/influx.py"]


STAGE_ENTRY_POINTS = ("stack.__main__", "simulator.__main__", "stream_connector.__main__", "kafka_joiner.__main__",
                      "db_connector.__main__", "live_dashboards.__main__")


def test_the_stages_and_the_operator_start_without_pandas() -> None:
    """Every stage writes health metrics through the InfluxDB client: importing it must not import pandas (about
    0.8 s and 80 MB per process). Only the Spark joiner's processes need pandas, and load it themselves."""
    check = f"""
import importlib, json, sys
for name in {STAGE_ENTRY_POINTS!r}:
    importlib.import_module(name)
import influxdb
try:
    influxdb.DataFrameClient()
    refused = False
except ImportError:
    refused = True
print(json.dumps({{"pandas": "pandas" in sys.modules, "client": influxdb.InfluxDBClient.__name__, "refused": refused}}))
"""
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, check=True, timeout=120, text=True)
    assert json.loads(done.stdout) == {"pandas": False, "client": "InfluxDBClient", "refused": True}
