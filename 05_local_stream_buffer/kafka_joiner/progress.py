"""Join state and progress of one partition of the co-partitioned topic, and how it is committed.

Per partition the joiner commits, in the transaction of its outputs, two positions:

* the committed offset: the oldest frame (see `repartition`) with a record still held in a join buffer
  (or the processed position when none is held), so a restart re-reads every record the state still needs;
* the processed position (next offset to process), in the committed offset's metadata, so a restart
  knows which of the re-read records already produced their outputs and dead letters.

Frames between the two rebuild the state silently. This is exact because, without forcing, the join is
a deterministic function of each key's two ordered streams: the state after re-reading holds the same
records (every record a key still needs is at or after the committed offset), and pairs of released
records cannot recur. See the package README for the argument in full.
"""
from __future__ import annotations

from confluent_kafka import TopicPartition

from local_stream_buffer.keyed import KeyedJoiner

METADATA_PREFIX = "lsb1:processed="


def encode_metadata(processed: int) -> str:
    return f"{METADATA_PREFIX}{processed}"


def decode_metadata(metadata: str | None) -> int | None:
    """The processed position stored with a committed offset; None when absent or not ours."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return None
    try:
        return int(metadata[len(METADATA_PREFIX):])
    except ValueError:
        return None


class PartitionJoin:
    """The keyed join of one co-partitioned partition, rebuilt from its committed offset on assignment.

    :param committed: the committed offset (None: nothing committed, start at the beginning).
    :param processed: the processed position from the commit's metadata; frames below it rebuild silently.
    """

    __slots__ = ("topic", "partition", "joiner", "committed", "processed", "position")

    def __init__(self, topic: str, partition: int, joiner: KeyedJoiner, committed: int | None,
                 processed: int | None) -> None:
        self.topic = topic
        self.partition = partition
        self.joiner = joiner
        self.committed = committed
        # Without metadata (first run, or offsets committed by something else) nothing is replayed silently.
        self.processed = processed if processed is not None and committed is not None else committed
        self.position: int | None = None  # next offset to ingest, once a record arrived

    def is_replay(self, offset: int) -> bool:
        """True for a frame that was processed before: it rebuilds state, its outputs are already out."""
        return self.processed is not None and offset < self.processed

    def advance(self, offset: int) -> None:
        self.position = offset + 1
        if self.processed is None or self.position > self.processed:
            self.processed = self.position

    @property
    def rebuilding(self) -> bool:
        return self.processed is not None and (self.position or self.committed or 0) < self.processed

    def commit_position(self) -> TopicPartition | None:
        """The offset (oldest held frame) and metadata (processed position) to commit, if anything moved."""
        if self.position is None:
            return None
        if self.rebuilding:
            # Mid-rebuild the held set is incomplete: keep the offset the rebuild started from.
            offset = self.committed
        else:
            oldest = next(iter(self.joiner.held_sources()), None)
            offset = self.processed if oldest is None else oldest
        return TopicPartition(self.topic, self.partition, offset, metadata=encode_metadata(self.processed))
