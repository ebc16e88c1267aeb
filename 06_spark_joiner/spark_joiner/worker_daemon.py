"""Spark's Python worker daemon (``pyspark.daemon``) without Spark's zip archives on the import path.

Spark puts ``pyspark.zip``, ``py4j-*.zip`` and its own core jar on every Python worker's path. Before
each task the worker calls ``importlib.invalidate_caches()``, and a zip importer answers that by reading
its archive's whole directory again: for these archives that was the largest single cost of a short
task here. Where pyspark and py4j are installed in the environment anyway (as in this project), the archives
are dropped from the path and the daemon runs as usual. Set as ``spark.python.daemon.module``.
"""
from __future__ import annotations

import importlib.util
import os
import runpy
import sys

_ARCHIVE_PREFIXES = ("pyspark", "py4j", "spark-core")
_ARCHIVE_SUFFIXES = (".zip", ".jar")


def drop_spark_archives() -> None:
    """Remove Spark's zip archives from ``sys.path`` if pyspark and py4j import without them."""
    archives = [entry for entry in sys.path
                if entry.endswith(_ARCHIVE_SUFFIXES) and os.path.basename(entry).startswith(_ARCHIVE_PREFIXES)]
    if not archives:
        return
    kept = [entry for entry in sys.path if entry not in archives]
    original = sys.path[:]
    sys.path[:] = kept
    for archive in archives:
        sys.path_importer_cache.pop(archive, None)
    if importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("py4j") is None:
        sys.path[:] = original  # a cluster whose Python has no pyspark of its own: keep Spark's


if __name__ == "__main__":
    drop_spark_archives()
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
