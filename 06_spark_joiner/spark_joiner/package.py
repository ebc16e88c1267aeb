"""``python -m spark_joiner.package DIR`` (``make spark-package``): the job as spark-submit takes it, in one directory.

- ``spark_joiner_job.py``: the entry script (spark-submit runs a file, not a module);
- ``spark-joiner.zip``: the ``--py-files`` archive, the project's packages the driver and the executors import
  (the job, the join engine, the shared core), with their data files (the engine's ``join_specs.toml``);
- ``jars/``: Spark's Kafka connector and what it needs beyond Spark's own jars, for ``--jars``.

The archive is reproducible (sorted entries, fixed times), so the same sources give the same bytes. What the
executors' Python needs besides it is third-party only: see the README, "Submit to a cluster".
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import zipfile
from pathlib import Path

from .session import connector_jars

# The job and what it imports of the project (tests/unit/test_import_graph.py: spark_joiner may import these two).
PACKAGES = ("spark_joiner", "local_stream_buffer", "pipeline_core")
ENTRY_SCRIPT = Path(__file__).resolve().parents[1] / "spark_joiner_job.py"
ARCHIVE_NAME = "spark-joiner.zip"
# Files of a package that belong in the archive: its code and the data it reads (pyproject's package-data).
PACKAGE_FILE_SUFFIXES = (".py", ".toml", ".json", ".properties", ".conf")
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry holds: no build time in the archive


def package_directory(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {package} not found: run `make setup`")
    return Path(next(iter(spec.submodule_search_locations)))


def archive_entries() -> dict[str, Path]:
    """Name in the archive -> source file, for every file of `PACKAGES` the archive holds."""
    entries = {}
    for package in PACKAGES:
        directory = package_directory(package)
        for source in sorted(directory.rglob("*")):
            if source.is_file() and source.suffix in PACKAGE_FILE_SUFFIXES and "__pycache__" not in source.parts:
                entries[f"{package}/{source.relative_to(directory).as_posix()}"] = source
    return entries


def write_archive(path: Path) -> list[str]:
    """The ``--py-files`` archive at `path`; returns its entry names."""
    entries = archive_entries()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, entries[name].read_bytes())
    return sorted(entries)


def build(directory: Path) -> Path:
    """Entry script, archive and connector jars into `directory`, replacing an earlier build's (and nothing else)."""
    shutil.rmtree(directory / "jars", ignore_errors=True)
    (directory / "jars").mkdir(parents=True)
    shutil.copy2(ENTRY_SCRIPT, directory / ENTRY_SCRIPT.name)
    write_archive(directory / ARCHIVE_NAME)
    for jar in connector_jars():
        shutil.copy2(jar, directory / "jars" / jar.name)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_joiner.package", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where to build it")
    directory = build(parser.parse_args(argv).directory)
    jars = ",".join(str(jar) for jar in sorted((directory / "jars").iterdir()))
    print(f"built {directory}: spark-submit --jars {jars} --py-files {directory / ARCHIVE_NAME} "
          f"{directory / ENTRY_SCRIPT.name} [job flags]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
