"""What a joiner makes of a record of its input topic: the one rule both joiners apply, step by step.

1. **Skip** a record whose key names a series no join needs (`skips`), without reading its value: the topic
   carries other series too, and the stages that read them judge them (the DB connector reads every record
   and dead-letters what is none). A key that names nothing (none, not UTF-8, no record key by
   `pipeline_core.record_keys.split_key`) is not skipped: the record cannot say it is someone else's, so the
   joiner reads it and says what is wrong with it.
2. **Dead-letter** a value that is no record, a tombstone included (`pipeline_core.records.decode_record`'s
   reason).
3. **Dead-letter** a record under a key other than its own (`wrong_key`): its partition and its place in its
   series' order were chosen for another series.
4. **Dead-letter** a record outside its thing's partition (`misplaced`) where a joiner joins each partition as
   it lies (the standalone joiner told its input is partitioned by thing). A joiner that groups records by
   thing itself (the Spark joiner; the standalone joiner by default) takes any partitioning and skips this step.
   Its thing's partition is the one of the partition count the record says it was placed with (its writer's
   `pipeline_core.partitioning.PLACEMENT_HEADER`): a topic that grew holds records placed by the count before
   and the count after, each where its writer put it. A record that says nothing is judged by every count the
   joiner knows the topic to have had.
5. Admit the rest; the join engine then accepts it, or dead-letters it as late.

The standalone joiner applies the steps record by record; the Spark joiner column by column, with these
functions for each distinct key and for the rows a column check picked out, so the reasons are these.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from .partitioning import thing_partition
from .record_keys import record_key, split_key
from .records import MachineRecord

# From a record key's text: the thing a join needs it for, or None (`SpecResolver.joinable_thing`, which takes the
# key apart with `pipeline_core.record_keys.split_key`).
JoinableThing = Callable[[str], "str | None"]


def key_text(key: bytes | None) -> str | None:
    """A key's text if it can name a series (UTF-8, a thing and a quantity by `split_key`); None if it names
    nothing."""
    if key is None:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if split_key(text) is not None else None


def skips(key: bytes | None, joinable_thing: JoinableThing) -> bool:
    """Step 1: whether a joiner leaves the record under `key` to others, unread."""
    text = key_text(key)
    return text is not None and joinable_thing(text) is None


def wrong_key(key: bytes | None, record: MachineRecord) -> str | None:
    """Step 3: why `record` may not be joined under `key`, or None when it is the record's own key."""
    expected = record_key(record["thing"], record["quantity"])
    if key is not None and key == expected.encode():
        return None
    return f"key {key!r} does not match {expected!r}"


def misplaced(thing: str, partition: int, partitions: int | Sequence[int], placed_with: int | None = None
              ) -> str | None:
    """Step 4: why a record of `thing` may not be joined in `partition` of a topic joined as it lies, or None when
    that is its thing's partition (`pipeline_core.partitioning`): by the count the record was `placed_with`, else by
    any of `partitions` (the topic's partition count, or every count the joiner knows it to have had)."""
    counts = (placed_with,) if placed_with is not None else (
        (partitions,) if isinstance(partitions, int) else tuple(partitions))
    if any(thing_partition(thing, count) == partition for count in counts):
        return None
    count = counts[-1]
    return (f"misrouted: thing {thing!r} belongs in partition {thing_partition(thing, count)} of {count}, not "
            f"{partition}; the input is not partitioned by thing (see pipeline_core.partitioning), so run the joiner "
            "without --input-partitioned-by-thing")


def refusal(key: bytes | None, record: MachineRecord, partition: int, partitions: int | Sequence[int] | None,
            placed_with: int | None = None) -> str | None:
    """Steps 3 and 4 for a decoded record: why it is dead-lettered, or None when it is admitted.
    `partitions` is None where the joiner groups records by thing itself (step 4 does not apply); `placed_with`
    the partition count the record says it was placed by (None: it says none)."""
    reason = wrong_key(key, record)
    if reason is None and partitions is not None:
        reason = misplaced(record["thing"], partition, partitions, placed_with)
    return reason
