"""Every module table lists what exists.

Each folder's README has a table of the modules of its package(s): a markdown table of two columns headed
`module` or `file`, one row per module, its backticked name in the first column (`name.py`, `package.name`,
`package/name.py` or `name`; a row may name several). A module added without a row leaves readers with a
map that stops short of the code, and a row left behind by a module that was removed or renamed sends them
looking for code that is not there. So for each README the modules of its packages (their `*.py` files but
`__init__.py`; `__main__.py` is listed as the entry point) must equal the names its tables list, package by
package; `ops/compose` holds shell scripts and an ACL beside its Python, and its table lists those too.

Only files are read, relative to this file: nothing is imported from the packages.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each folder README and the package directories its module tables describe.
PACKAGES: dict[str, tuple[str, ...]] = {
    "01_simulator/README.md": ("01_simulator/simulator",),
    "03_stream_connector/README.md": ("03_stream_connector/stream_connector",),
    "05_local_stream_buffer/README.md": ("05_local_stream_buffer/local_stream_buffer",
                                         "05_local_stream_buffer/kafka_joiner"),
    "06_spark_joiner/README.md": ("06_spark_joiner/spark_joiner",),
    "07_db_connector/README.md": ("07_db_connector/db_connector",),
    "08_influxdb_grafana/README.md": ("08_influxdb_grafana/grafana_report", "08_influxdb_grafana/live_dashboards"),
    "core/README.md": ("core/pipeline_core",),
    "ops/README.md": ("ops/stack", "ops/compose"),
}
# Directories whose every file is listed, not only their Python modules.
EVERY_FILE = {"ops/compose", "06_spark_joiner/spark_joiner"}
TABLE_HEADINGS = {"module", "file"}
CELL_SEPARATOR = re.compile(r"(?<!\\)\|")  # `a\|b` inside a cell is no separator
BACKTICKED = re.compile(r"`([^`]+)`")


@dataclass
class ModuleTable:
    line: int  # of its header, 1-based
    names: set[str]  # as listed, e.g. `render.py`, `stack.disk`


def package_modules(directory: Path, every_file: bool = False) -> set[str]:
    """The modules of a package by name (`connector`, `__main__`), and with `every_file` its other files as
    they are named (`kafka-start.sh`)."""
    names = {path.stem for path in directory.glob("*.py") if path.name != "__init__.py"}
    if every_file:
        names |= {path.name for path in directory.iterdir() if path.is_file() and path.suffix != ".py"}
    return names


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in CELL_SEPARATOR.split(row.strip().strip("|"))]


def module_tables(readme: Path) -> list[ModuleTable]:
    """The README's module tables: two columns, the first headed `module` or `file`."""
    tables: list[ModuleTable] = []
    rows: list[tuple[int, str]] = []
    for number, line in enumerate([*readme.read_text().splitlines(), ""], start=1):
        if line.startswith("|"):
            rows.append((number, line))
            continue
        if len(rows) > 2:
            header = _cells(rows[0][1])
            if len(header) == 2 and header[0].lower() in TABLE_HEADINGS:
                names = {name for _, row in rows[2:] for name in BACKTICKED.findall(_cells(row)[0])}
                tables.append(ModuleTable(rows[0][0], names))
        rows = []
    return tables


def module_name(listed: str, packages: list[str]) -> str:
    """`render.py`, `grafana_report/render.py`, `grafana_report.render` -> `render`; other files as they are."""
    name = listed.rsplit("/", 1)[-1].removesuffix(".py")
    for package in packages:
        name = name.removeprefix(f"{package}.")
    return name


def table_problems(root: Path, readme: str, directories: tuple[str, ...],
                   every_file: set[str] = EVERY_FILE) -> list[str]:
    """What the README's module tables miss or list in vain, per package; empty when they list what exists.

    With several packages, a table documents the one it shares the most names with."""
    packages = [Path(directory).name for directory in directories]
    modules: dict[str, set[str]] = {}
    for directory in directories:
        assert (root / directory).is_dir(), f"{directory} is no directory: the test looks in the wrong place"
        modules[directory] = package_modules(root / directory, directory in every_file)
    listed: dict[str, set[str]] = {directory: set() for directory in directories}
    problems = []
    for table in module_tables(root / readme):
        names = {module_name(name, packages) for name in table.names}
        overlap = {directory: len(names & modules[directory]) for directory in directories}
        best = max(overlap.values())
        owners = [directory for directory, count in overlap.items() if count == best]
        if best == 0 or len(owners) > 1:
            problems.append(f"{readme}:{table.line}: the table lists no module of exactly one of "
                            f"{', '.join(directories)}: {sorted(names)}")
            continue
        listed[owners[0]] |= names
    for directory in directories:
        if missing := modules[directory] - listed[directory]:
            problems.append(f"{readme}: modules of {directory} missing from its table: {sorted(missing)}")
        if stale := listed[directory] - modules[directory]:
            problems.append(f"{readme}: listed for {directory} but no such module: {sorted(stale)}")
    return problems


@pytest.mark.parametrize("readme", sorted(PACKAGES))
def test_module_table_lists_every_module_and_nothing_else(readme: str) -> None:
    assert table_problems(ROOT, readme, PACKAGES[readme]) == []


def test_a_missing_row_and_a_stale_row_are_named(tmp_path: Path) -> None:
    """The check itself can fail: a module without a row, and a row without a module, are both named; a
    table of another kind (three columns, or another heading) lists no module."""
    package = tmp_path / "stage" / "things"
    package.mkdir(parents=True)
    for name in ("__init__.py", "__main__.py", "listed.py", "unlisted.py"):
        (package / name).write_text("")
    (tmp_path / "stage" / "README.md").write_text(
        "| module | what it is |\n|---|---|\n"
        "| `__main__.py` | the entry point |\n| `things.listed`, `gone.py` | two rows in one |\n\n"
        "| file | for | what it is |\n|---|---|---|\n| `unlisted.py` | a package file | not a module table |\n\n"
        "| field | what it is |\n|---|---|\n| `unlisted` | a field |\n")
    assert table_problems(tmp_path, "stage/README.md", ("stage/things",)) == [
        "stage/README.md: modules of stage/things missing from its table: ['unlisted']",
        "stage/README.md: listed for stage/things but no such module: ['gone']",
    ]
