"""The checkpoint's layout: the bucket and state partition counts its join state was made with, and how the
processor lays its state out.

A checkpoint's state is partitioned by both counts: resumed with other counts, Spark would keep the old
state partitions (it takes ``spark.sql.shuffle.partitions`` from the checkpoint) and the keys would meet
their state in other buckets; and state of another layout cannot be read. The layout is recorded beside the
state; a start with another sets the checkpoint aside and begins a new one, which rebuilds the state from
the input and writes only what the old one had not committed (see `sink`). The sink reads where each batch's
input ends from the checkpoint's offset log (`offset_log_entry`).
"""
from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

log = logging.getLogger(__name__)

LAYOUT_FILE = "joiner-layout.json"
# hdfs://, s3a://, file:/ ...: a path made of one keeps its scheme, with its double slash folded.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


def checkpoint_query_id(directory: Path | str) -> str | None:
    """The id of the query a checkpoint belongs to (its ``metadata`` file, written when the query first starts; a
    restart keeps it, a new checkpoint gets another); None before that."""
    try:
        query_id = json.loads((Path(directory) / "metadata").read_text()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return query_id if isinstance(query_id, str) else None


def prepare_checkpoint(directory: Path, buckets: int, shuffle_partitions: int, state_layout: str) -> Path | None:
    """Make ``directory`` ready for a query with these counts and state layout; returns where a checkpoint made
    with another layout was moved to (None when there was none)."""
    if _URI.match(str(directory)):
        # The layout file and the move aside are local file operations, done before Spark starts.
        raise SystemExit(f"--checkpoint-dir {directory}: the checkpoint must be a filesystem path; for storage every "
                         "driver restart reaches, mount it there (a Kubernetes PersistentVolumeClaim, NFS, a "
                         "FUSE/CSI mount of S3 or HDFS): a URI such as hdfs:// or s3a:// is not supported")
    layout = {"buckets": buckets, "shuffle_partitions": shuffle_partitions, "state": state_layout}
    recorded = directory / LAYOUT_FILE
    moved = None
    if has_checkpoint(directory):
        # None: a checkpoint from before layouts were recorded, whose state has another layout too.
        previous = json.loads(recorded.read_text()) if recorded.is_file() else None
        if previous != layout:
            moved = directory.with_name(f"{directory.name}.replaced-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            directory.rename(moved)
            log.warning("the checkpoint was made with %s, this start asks for %s: it is moved to %s (delete it at will) "
                        "and a new one rebuilds the join state from the input", previous, layout, moved)
    directory.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(layout))
    return moved


def has_checkpoint(directory: Path) -> bool:
    """A query has run on ``directory``: its offset log has an entry."""
    offsets = directory / "offsets"
    return offsets.is_dir() and any(offsets.iterdir())


def offset_log_entry(spark, offset_log: str, batch_id: int) -> str:
    """Batch ``batch_id``'s entry in the checkpoint's offset log (written before the batch runs: where its input
    ends), read through Hadoop's file system as Spark writes it (``spark``: the query's SparkSession)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(f"{offset_log}/{batch_id}")
    stream = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).open(path)
    try:
        return jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
