"""The peers' input: the shipped real events as the stream connector writes them, for a fleet of machines.

Each row of the events file becomes one record per quantity (``stream_connector.rows.split_row``, the
connector's default limits); only the quantities a join spec reads are kept. ``copies`` machines replay each real machine's history, under their own
names and at the same times, as a fleet sharing a wall clock would. Every record goes to the partition of
its thing, keyed and encoded as the connector writes it (``stream_connector.rows.kafka_messages``).

An interleaving is the order the records are appended in, which decides what each partition holds in which
order. Each keeps every series (a thing's quantity) in time order; by the join's contract the pairs are the
same for all of them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from pipeline_core.records import MachineRecord
from pipeline_core.validation import DEFAULT_MAX_ROW_BYTES
from stream_connector.rows import kafka_messages, split_row

from local_stream_buffer.specs import SpecResolver

class Message(NamedTuple):
    """One record as it is appended to machine.data."""

    partition: int
    key: bytes
    value: bytes


def joined_records(events_file: Path, resolver: SpecResolver) -> list[MachineRecord]:
    """The records of the file's rows (file order) that some join spec reads."""
    records: list[MachineRecord] = []
    for line in events_file.read_bytes().splitlines():
        if line.strip():
            records.extend(record for record in split_row(line, DEFAULT_MAX_ROW_BYTES).records
                           if resolver.routes(record["quantity"]))
    return records


def fleet(records: Sequence[MachineRecord], copies: int) -> list[MachineRecord]:
    """``copies`` machines per real one (named ``<thing>-<n>``), each with the same records in time order."""
    in_time = sorted(records, key=lambda record: record["phenomenonTime"])  # stable: file order within a time
    return [dict(record, thing=f"{record['thing']}-{copy:03d}") for record in in_time for copy in range(copies)]


def time_order(records: Sequence[MachineRecord]) -> list[int]:
    """All records by time, as the simulator replays the file and the connector appends it live."""
    return sorted(range(len(records)), key=lambda index: records[index]["phenomenonTime"])


def thing_after_thing(records: Sequence[MachineRecord]) -> list[int]:
    """Each machine's whole history, one machine after another: a backlog that machines upload in turn
    (gateways reconnecting after an outage), or a partition's things read one after the other."""
    return sorted(range(len(records)), key=lambda index: (records[index]["thing"], records[index]["phenomenonTime"]))


def series_after_series(records: Sequence[MachineRecord]) -> list[int]:
    """Per machine, each quantity's whole series before the next one's: one sensor's buffer arriving late."""
    return sorted(range(len(records)), key=lambda index: (records[index]["thing"], records[index]["quantity"],
                                                          records[index]["phenomenonTime"]))


# Each gives the order (indices into the records) to append them in.
INTERLEAVINGS: dict[str, Callable[[Sequence[MachineRecord]], list[int]]] = {
    "time order": time_order,
    "thing after thing": thing_after_thing,
    "series after series": series_after_series,
}


def messages(records: Sequence[MachineRecord], partitions: int) -> list[Message]:
    """The records as the stream connector appends them (``stream_connector.rows.kafka_messages``)."""
    return [Message(partition, key, value) for value, key, partition in kafka_messages(list(records), partitions)]
