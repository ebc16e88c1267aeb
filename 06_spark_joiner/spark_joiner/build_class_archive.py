"""`python -m spark_joiner.build_class_archive`: builds Spark's class archive (`class_archive`) once per Python
environment, as `make setup` does: a short local streaming query of the kinds the job runs (a stateful Pandas
operator on RocksDB, Arrow both ways), after which the JVM exits and writes the archive
(`-XX:ArchiveClassesAtExit`: only a JVM that exits by itself writes one). A failed build leaves none: Spark starts
as it would without it."""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
from pathlib import Path

from .class_archive import ARCHIVE_DIR, archive_file

log = logging.getLogger(__name__)

WARM_UP_ROWS = 2_000
BUILD_TIMEOUT_S = 300


def build(target: Path) -> None:
    """Run the warm-up query in a JVM that writes `target` as it exits, and wait until it has."""
    from pyspark.sql import functions as f

    from .session import spark_session  # here: every `make` runs this module, and most find the archive built
    spark = spark_session("local[2]", app_name="class-archive", extra={"spark.sql.shuffle.partitions": "2"},
                          archive_at_exit=target)
    _warm_up(spark, f)
    log.info("warm-up done: the JVM exits and writes %s", target)
    jvm = spark.sparkContext._gateway.proc
    temp_dir = spark.conf.get("spark.local.dir")  # the session's folder, which its exit handler would remove
    # Only a JVM that exits by itself writes the archive. The call does not return: its connection, and the
    # accumulator server's, close with the JVM, which py4j logs and PySpark's threads print as errors.
    logging.disable(logging.CRITICAL)
    with open(os.devnull, "w") as nowhere, contextlib.redirect_stderr(nowhere):
        try:
            spark.sparkContext._jvm.java.lang.System.exit(0)
        except Exception:  # noqa: BLE001 (py4j reports the closed connection in several ways)
            pass
        jvm.wait(timeout=BUILD_TIMEOUT_S)
    shutil.rmtree(temp_dir, ignore_errors=True)  # this process ends with os._exit: no exit handler runs


def _warm_up(spark, f) -> None:
    """The job's kinds of work: a stream through a stateful Pandas operator on RocksDB into foreachBatch, Arrow
    into and out of Python workers."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor

    class Count(StatefulProcessor):
        def init(self, handle) -> None:
            self.seen = handle.getValueState("seen", "n long")

        def handleInputRows(self, key, rows, timerValues):
            total = (self.seen.get()[0] if self.seen.exists() else 0) + sum(len(batch) for batch in rows)
            self.seen.update((total,))
            yield pd.DataFrame({"key": [key[0]], "n": [total]})

        def close(self) -> None:
            pass

    source = (spark.readStream.format("rate").option("rowsPerSecond", WARM_UP_ROWS).load()
              .select((f.col("value") % 8).alias("key"), f.col("value")))
    counted = source.groupBy("key").transformWithStateInPandas(
        statefulProcessor=Count(), outputStructType="key long, n long", outputMode="Update", timeMode="None")
    batches: list[int] = []
    query = (counted.writeStream.foreachBatch(lambda frame, batch_id: batches.append(len(frame.toPandas())))
             .trigger(processingTime="200 milliseconds").start())
    try:
        while len(batches) < 3:
            query.awaitTermination(0.2)
            if query.exception() is not None:
                raise RuntimeError(f"the warm-up query failed: {query.exception()}")
    finally:
        query.stop()
    spark.range(WARM_UP_ROWS).toPandas()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per call otherwise
    target = archive_file()
    if target.is_file():
        return 0
    ARCHIVE_DIR.mkdir(parents=True, exist_ok=True)
    print(f"building Spark's class archive into {target} (once; makes every Spark start faster) ...", flush=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    try:
        build(partial)
    except Exception as error:  # noqa: BLE001 (an optimisation: Spark works without it)
        log.warning("the warm-up failed: %s", error)
    if not partial.is_file():
        print("Spark's class archive was not written: Spark starts without it, as before", file=sys.stderr)
    else:
        partial.replace(target)
    sys.stdout.flush()
    # The JVM is gone: PySpark's exit handlers would only report its closed connection.
    os._exit(0)

if __name__ == "__main__":
    sys.exit(main())
