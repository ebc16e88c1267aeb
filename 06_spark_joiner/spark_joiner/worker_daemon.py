"""Spark's Python worker daemon (``pyspark.daemon``) without Spark's zip archives on the import path.

Spark puts ``pyspark.zip``, ``py4j-*.zip`` and its own core jar on every Python worker's path. Before
each task the worker calls ``importlib.invalidate_caches()``, and a zip importer answers that by reading
its archive's whole directory again: for these archives that was the largest single cost of a short
task here. Where pyspark and py4j are installed in the environment anyway (as in this project), the archives
are dropped from the path and the daemon runs as usual. Set as ``spark.python.daemon.module``.

The daemon forks every worker. It imports what the job's workers need (pandas, pyarrow, the engine, this
package) once before forking, so a new worker does not, and it keeps the garbage collector's young
collections rare (``pipeline_core.runtime.tune_gc_for_streaming``, as the pipeline's other record loops): the
workers allocate in proportion to their input, and CPython's default threshold would collect every few
hundred allocations. What the daemon imported is frozen before the fork, and the higher threshold is
inherited by every worker.
"""
from __future__ import annotations

import importlib
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


# Modules every worker of the job imports; imported once in the daemon, before it forks the workers.
_WORKER_MODULES = ("spark_joiner.parse", "spark_joiner.processor", "spark_joiner.bucket_join")


def prepare_workers() -> None:
    """Import the workers' modules, then freeze them and raise the collection threshold for every worker."""
    for module in _WORKER_MODULES:
        importlib.import_module(module)
    # Imported here, after the archives are dropped: stack is this project's package, not Spark's.
    from pipeline_core.runtime import tune_gc_for_streaming
    tune_gc_for_streaming()


if __name__ == "__main__":
    drop_spark_archives()
    prepare_workers()
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
