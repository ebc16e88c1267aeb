"""The executors' Python workers, started while the query plans its first micro-batch rather than inside it.

An executor starts its Python worker daemon with its first Python task, and the daemon imports pandas, pyarrow
and the engine (`worker_daemon`) before it forks a worker. In a cold first micro-batch that import came after
the Kafka offsets and the query's planning, which each keep one core of a small machine busy and leave the other
waiting. A job of one trivial Python task per core, started in the background as the session comes up, does it
meanwhile: the first batch's tasks find the daemon, and idle workers to reuse, ready.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


def _unchanged(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def start_python_workers(spark: SparkSession) -> None:
    """Run a trivial Python step of one task per core (`defaultParallelism`) in a background thread named
    `python-workers`. It is a `mapInArrow` step, as the router is, so its workers come from the daemon the job's
    steps use."""
    tasks = spark.sparkContext.defaultParallelism

    def run() -> None:
        try:
            spark.range(0, tasks, 1, tasks).mapInArrow(_unchanged, "id long").collect()
        except Exception as error:
            # The session stopped meanwhile: nothing left to start. Otherwise the query's Python steps will meet
            # the same failure, with its full story; this says it early.
            stopped = spark.sparkContext._jsc is None
            log.log(logging.DEBUG if stopped else logging.WARNING,
                    "starting the Python workers ahead of the first micro-batch failed: %s", error)

    threading.Thread(target=run, name="python-workers", daemon=True).start()
