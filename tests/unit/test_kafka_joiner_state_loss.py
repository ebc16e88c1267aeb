"""When the standalone joiner takes its changelog for lost, and what a partition rebuilding it commits."""
from __future__ import annotations

from kafka_joiner.changelog import StateRecord, coverage_value
from kafka_joiner.partition_join import PartitionJoin
from local_stream_buffer.keyed import KeyedJoiner

HELD = [StateRecord(7, (7).to_bytes(8, "big"), 0, b'{"thing": "R0815"}')]


def partition(committed: int | None, metadata: str | None = None) -> PartitionJoin:
    return PartitionJoin("machine.data", 2, lambda release, evict, drop: KeyedJoiner(
        on_release=release, on_evict=evict, on_dead_letter=drop), committed, metadata)


def test_a_changelog_short_of_the_committed_offset_is_lost() -> None:
    assert partition(500).state_lost(None, [])  # the state topic deleted: nothing, not even a coverage record
    assert partition(500).state_lost(300, HELD)  # covers less than the commit
    assert not partition(500).state_lost(500, HELD)
    assert not partition(500).state_lost(500, [])  # nothing held, and it says so
    assert not partition(500).state_lost(None, HELD)  # from before coverage records, with its held records
    assert not partition(None).state_lost(None, [])  # nothing committed: nothing to lose
    assert not partition(120, "lsb1:processed=500").state_lost(None, [])  # the earlier format rebuilds by itself


def test_a_rebuilding_partition_keeps_its_commit_and_writes_no_coverage_until_through() -> None:
    join = partition(500)
    join.rebuild(HELD)
    assert join.changes.deletes == [7]  # what the changelog still held goes
    join.position = 100  # past the frame at offset 99
    assert join.replaying and join.coverage() is None
    assert join.commit_position().offset == 500 and not join.commit_position().metadata
    join.position = 510
    assert not join.replaying
    assert join.commit_position().offset == 510
    assert join.coverage() == 510 and join.coverage() is None  # written once per move
    assert coverage_value(510) == b"510"


def test_a_rebuild_through_to_the_committed_offset_writes_its_coverage() -> None:
    # A partition with no record after the commit (one whose input all came before a switch of joiners): without
    # its coverage, every restart took the changelog for lost again and read the partition from its beginning.
    join = partition(500)
    join.rebuild([])
    join.position = 500
    assert not join.replaying
    assert join.coverage() == 500 and join.coverage() is None
