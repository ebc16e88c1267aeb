"""The peers' input: the shipped real events as the stream connector writes them, for a fleet of machines.

Each row of the events file becomes one record per quantity (``stream_connector.rows.split_row``, the
connector's default limits); only the quantities a join spec reads are kept. ``copies`` machines replay each real machine's history, under their own
names and at the same times, as a fleet sharing a wall clock would. Every record goes to the partition of
its thing, keyed and encoded as the connector writes it (``stream_connector.rows.kafka_messages``).

An interleaving is the order the records are appended in, which decides what each partition holds in which
order. Each keeps every series (a thing's quantity) in time order; by the join's contract the pairs are the
same for all of them. ``bounded_disorder`` is another order: each row arrives up to a bound of event time
late, as from gateways that buffer and resend; a join that absorbs that bound gives the same pairs again.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from pipeline_core.disorder import arrival_order
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


def bounded_disorder(records: Sequence[MachineRecord], bound_s: float, seed: int) -> list[int]:
    """Time order with each row (a thing's records of one time, which the connector appends together) displaced
    in arrival by a seeded random delay of 0 to ``bound_s`` of event time: a row arrives after rows of its
    machine up to ``bound_s`` newer than it, never after a newer one, so no record is later than the bound. The
    displacement is the simulator's (`pipeline_core.disorder`), over the rows in time order as it replays them,
    in whole milliseconds (the bound rounded down)."""
    first_seen = dict.fromkeys((record["thing"], record["phenomenonTime"]) for record in records)
    rows = sorted(first_seen, key=lambda row: row[1])
    arrival = {rows[index]: at for at, index in enumerate(
        arrival_order([time_ms for _thing, time_ms in rows], int(bound_s * 1000), seed))}
    return sorted(range(len(records)), key=lambda index: arrival[(records[index]["thing"],
                                                                  records[index]["phenomenonTime"])])


def lateness_ms(records: Sequence[MachineRecord], order: Sequence[int]) -> list[float]:
    """Per record in ``order``, how far its series' newest record so far is ahead of it in event time (0 for
    a record that is its series' newest)."""
    newest: dict[tuple[str, str], float] = {}
    late = []
    for index in order:
        record = records[index]
        series = (record["thing"], record["quantity"])
        ahead = newest.get(series, record["phenomenonTime"])
        late.append(max(0.0, ahead - record["phenomenonTime"]))
        newest[series] = max(ahead, record["phenomenonTime"])
    return late


# Each gives the order (indices into the records) to append them in.
INTERLEAVINGS: dict[str, Callable[[Sequence[MachineRecord]], list[int]]] = {
    "time order": time_order,
    "thing after thing": thing_after_thing,
    "series after series": series_after_series,
}


def messages(records: Sequence[MachineRecord], partitions: int) -> list[Message]:
    """The records as the stream connector appends them (``stream_connector.rows.kafka_messages``)."""
    return [Message(partition, key, value) for value, key, partition in kafka_messages(list(records), partitions)]
