"""Helpers for the Kafka joiner tests: the real rows as machine.data records, the offline join, and the
joiner as a real subprocess."""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.status import IngestStatus
from pipeline_core.kafka_clients import admin_client
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import record_key
from pipeline_core.topics import MACHINE_DATA
from fault_support import end_process, kill_process, terminate_process
from join_reference import POWER, reference_join
from join_state_reference import Arrival, Verdict, clocks_kept, held_records, released_join
from support import Message, produce_records, read_topic, unique, wait_for

ROW_FIELDS = ("Thing", "Timestamp", "id")


def rows_as_records(path: Path, *, time_order: bool) -> list[dict[str, Any]]:
    """One record per quantity of each row, as the stream connector writes them to machine.data."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if time_order:
        rows.sort(key=lambda row: row["Timestamp"])  # stable: rows with equal times keep file order
    return [
        {"thing": row["Thing"], "quantity": quantity, "phenomenonTime": row["Timestamp"], "result": value,
         "id": row["id"]}
        for row in rows for quantity, value in row.items() if quantity not in ROW_FIELDS
    ]


def machine_records(thing: str, first_tick: int, ticks: int, tick_ms: int = 100) -> list[dict[str, Any]]:
    """Speed and torque of one axis of a synthetic machine, in time order (torque half a tick after speed),
    from tick `first_tick` on: the records of later ticks continue the same two streams."""
    start_ms = 1_700_000_000_000
    return [
        {"thing": thing, "quantity": quantity, "phenomenonTime": start_ms + tick * tick_ms + shift,
         "result": value}
        for tick in range(first_tick, first_tick + ticks)
        for quantity, shift, value in (("actSpeed_C11", 0, 1000.0 + tick % 97), ("vaTorque_C11", tick_ms // 2,
                                                                                   2.5 + tick % 13))
    ]


def machines_of_one_key(machines: int, ticks: int = 3) -> tuple[list[dict[str, Any]], int]:
    """`machines` synthetic machines of one join key each, machine after machine, and how many of its records
    each key still holds once its records are in (what an eviction gives up per key, by the join's contract:
    join_state_reference.held_records)."""
    per_machine = [machine_records(f"m{index}", 0, ticks) for index in range(machines)]
    held = [len(held_records([r for r in records if r["quantity"] == "actSpeed_C11"],
                             [r for r in records if r["quantity"] == "vaTorque_C11"])) for records in per_machine]
    assert len(set(held)) == 1 and held[0] > 0, held
    return [record for records in per_machine for record in records], held[0]


def key_of(record: dict[str, Any]) -> str:
    return record_key(record["thing"], record["quantity"])


def offline_join(records: list[dict[str, Any]], against_reference: bool = True
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The engine's outputs on the records in this order (each stream in its order; the shipped join spec), and the
    records it rejected: the standalone joiner's KeyedJoiner, checked here against the join's reference, which
    shares no code with it, before a test takes them as expected (`against_reference`). The outputs must be
    join_reference's, record for record, and where every clock keeps to itself (join_state_reference.clocks_kept)
    the records rejected must be those the order rule turns away."""
    joiner = KeyedJoiner()
    outputs: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for record in records:
        outcome = joiner.ingest(record)
        outputs.extend(outcome.outputs)
        if outcome.status is IngestStatus.REJECTED:
            rejected.append(record)
    counters = joiner.counters
    assert counters.evicted_keys == 0 and counters.forced == 0, \
        f"the offline join evicted keys or forced pairs ({counters}): beyond what the reference covers"
    if against_reference:
        _check_against_the_reference(records, outputs, rejected)
    return outputs, rejected


# The inputs (with the engine's answers) this process checked already: several tests expect the same join, and the
# reference's clock rule costs time quadratic in a stream's length (6 s for the shipped events' 20,000 records).
_CHECKED: set[str] = set()


def _check_against_the_reference(records: list[dict[str, Any]], outputs: list[dict[str, Any]],
                                 rejected: list[dict[str, Any]]) -> None:
    digest = hashlib.sha1(json.dumps([records, outputs, rejected], sort_keys=True).encode()).hexdigest()
    if digest in _CHECKED:
        return
    assert as_multiset(outputs) == as_multiset(reference_join(records)), \
        "the engine's join of the expected records differs from join_reference's"
    if clocks_kept(records, [POWER], bound_ms=0.0):
        verdicts = released_join([Arrival(0, record) for record in records], [POWER], 0.0, pairs=False).verdicts
        turned_away = [record for record, verdict in zip(records, verdicts)
                       if verdict in (Verdict.BEHIND, Verdict.CONFLICT)]
        assert as_multiset(rejected) == as_multiset(turned_away), \
            "the engine rejected other records than the join's order rule turns away"
    _CHECKED.add(digest)


def as_multiset(values: list[bytes | dict[str, Any]]) -> Counter[str]:
    """Records compared by content (canonical JSON), duplicates counted."""
    decoded = (json.loads(value) if isinstance(value, bytes) else value for value in values)
    return Counter(json.dumps(record, sort_keys=True) for record in decoded)


def read_outputs(bootstrap: str, topic: str, expected: int, deadline_s: float = 90) -> list[Message]:
    """Wait for `expected` committed outputs, then read on briefly to catch any surplus (duplicates)."""
    return read_topic(bootstrap, topic, expected=expected, then_idle_s=1.0, deadline_s=deadline_s)


class JoinerProcess:
    """`python -m kafka_joiner` as a real subprocess, logging to a file."""

    def __init__(self, bootstrap: str, topics: Any, group_id: str, log_dir: Path, instance_id: str | None = None,
                 *extra: str) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.group_id = group_id
        self.instance_id = instance_id
        self.extra = list(extra)
        self.log_dir = log_dir
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.runs = 0  # starts
        self.kills = 0  # confirmed kills (`kill`)
        self.name = unique(instance_id or "joiner")
        self.stopped_by_test = False

    def start(self, wait_ready: bool = True) -> JoinerProcess:
        self.runs += 1
        self.stopped_by_test = False
        self.log_path = self.log_dir / f"{self.name}-{self.runs}.log"
        command = [sys.executable, "-m", "kafka_joiner",
                   "--kafka-bootstrap-servers", self.bootstrap,
                   "--input-topic", self.topics.data, "--output-topic", self.topics.out,
                   "--dlq-topic", self.topics.dlq, "--group-id", self.group_id,
                   "--transactional-id-prefix", self.group_id,
                   "--session-timeout-ms", "6000", "--progress-interval-s", "1", *self.extra]
        if self.instance_id:
            command += ["--instance-id", self.instance_id]
        with open(self.log_path, "wb") as log_file:
            # Health metrics off unless a test asks for them (--health-metrics): they would go to the shared
            # stack's database, which the dashboards show.
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1", "HEALTH_METRICS": "false"})
        if wait_ready:
            wait_for(lambda: self._ready(), 60, f"joiner {self.instance_id} to announce READY")
        return self

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"joiner exited with {self.process.returncode}:\n{self.log()}")
        return "READY" in self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def failed(self) -> bool:
        """True if the process exited with an error that no kill() or terminate() asked for."""
        return (self.process is not None and not self.stopped_by_test
                and self.process.poll() not in (None, 0))

    def kill(self) -> None:
        """kill -9, a fault: confirmed that the joiner ran and that the SIGKILL ended it (`fault_support`)."""
        assert self.process is not None, f"joiner {self.name} never started: nothing to kill"
        self.stopped_by_test = True
        kill_process(self.process, f"joiner {self.name} (run {self.runs})")
        self.kills += 1

    def terminate(self, deadline_s: float = 60) -> int:
        """SIGTERM to the running joiner, and its exit status once it stopped gracefully."""
        assert self.process is not None, f"joiner {self.name} never started: nothing to stop"
        self.stopped_by_test = True
        return terminate_process(self.process, f"joiner {self.name} (run {self.runs})", deadline_s)

    def close(self) -> None:
        """Clean-up after the test, no fault: whatever still runs is killed."""
        self.stopped_by_test = True
        end_process(self.process)


def records_in(log: str) -> int:
    """Input records the instance reported in its last progress line."""
    counts = re.findall(r"records in ([\d,]+) \(", log)
    return int(counts[-1].replace(",", "")) if counts else 0


def caught_up(log: str) -> bool:
    """True once the last two progress lines after the instance's last assignment report the same records
    in and no lag beyond a transaction marker per partition (frames of the repartition topic are
    committed by transactions, whose markers take an offset after the last frame)."""
    assigned = log.rfind("assigned ")
    lines = [line for line in log[assigned:].splitlines() if "records in" in line] if assigned >= 0 else []
    if len(lines) < 2:
        return False
    lag = re.search(r", lag ([\d,]+)", lines[-1])
    return (lag is not None and int(lag[1].replace(",", "")) <= MACHINE_DATA.partitions
            and records_in(lines[-1]) == records_in(lines[-2]))


def restored(log: str) -> tuple[int, int]:
    """(held records restored, changelog records read) of the instance's last assignment."""
    lines = [line for line in log.splitlines() if "changelog records" in line]
    words = lines[-1].split("restored ")[1].split()
    return int(words[0]), int(words[4])


@dataclass(frozen=True)
class RestartRun:
    """What a joiner restarted after a quiet machine's long silence read again, and how long it took."""

    busy_records: int  # records of the other machines, all in the quiet machine's partition
    re_read: int  # input records the restarted joiner read before it caught up
    restored: int  # held records restored from the changelog
    changelog_read: int  # changelog records read to restore them
    restart_s: float  # from starting the process to caught up
    rebuild_from_oldest_held: int  # what a restart re-reading from the oldest held record would read


def restart_after_a_quiet_machine(bootstrap: str, topics: Any, joiners: list[JoinerProcess], log_dir: Path,
                                  by_thing: bool, busy_ticks: int, against_reference: bool = True) -> RestartRun:
    """One machine sends a few records and goes quiet, the others of its partition send `busy_ticks` ticks;
    the joiner joins it all, is killed (-9) and restarted; then every machine sends more. Asserts that the
    output equals the offline join of all records (checked against the reference unless `against_reference` is
    False); returns what the restart re-read."""
    partitions = MACHINE_DATA.partitions
    home = thing_partition("quiet-1", partitions)
    busy_things = [thing for thing in (f"busy-{index}" for index in range(1_000))
                   if thing_partition(thing, partitions) == home][:3]
    by_time = lambda records: sorted(records, key=lambda record: record["phenomenonTime"])  # noqa: E731
    before = machine_records("quiet-1", 0, 3) + by_time(
        record for thing in busy_things for record in machine_records(thing, 0, busy_ticks))
    after = machine_records("quiet-1", 3, 3) + by_time(
        record for thing in busy_things for record in machine_records(thing, busy_ticks, 10))
    deadline_s = 90 + len(before) / 5_000
    joiner = JoinerProcess(bootstrap, topics, new_group(), log_dir, "restarting",
                           *(("--input-partitioned-by-thing",) if by_thing else ()))
    joiners.append(joiner)
    produce_records(bootstrap, topics.data, before, key=key_of, by_thing=by_thing)
    joiner.start()
    expected_before, _ = offline_join(before, against_reference=False)  # a count to wait for
    read_topic(bootstrap, topics.out, expected=len(expected_before), deadline_s=deadline_s)
    wait_for(lambda: caught_up(joiner.log()), deadline_s, "the joiner to catch up")
    joiner.kill()

    started = time.monotonic()
    joiner.start()
    wait_for(lambda: caught_up(joiner.log()), deadline_s, "the restarted joiner to catch up")
    restart_s = time.monotonic() - started
    log = joiner.log()
    held, changelog_read = restored(log)
    re_read = records_in(log)

    produce_records(bootstrap, topics.data, after, key=key_of, by_thing=by_thing)
    expected, _ = offline_join(before + after, against_reference)
    outputs = read_outputs(bootstrap, topics.out, len(expected), deadline_s)
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert joiner.terminate() == 0
    return RestartRun(len(before) - 6, re_read, held, changelog_read, restart_s, len(before))


def delete_internal_topics(bootstrap: str, group_ids: list[str]) -> None:
    """Delete the joiner's co-partitioned topics of these groups (the test topics go with new_topics)."""
    admin = admin_client(bootstrap)
    names = [name for name in admin.list_topics(timeout=10).topics
             if any(name.startswith(f"{group}.") for group in group_ids)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(30)


def new_group() -> str:
    return unique("test-joiner")


@pytest.fixture
def joiners(bootstrap: str) -> Iterator[list[JoinerProcess]]:
    """The joiner processes a test starts; every one is killed at its end, and their internal topics deleted."""
    started: list[JoinerProcess] = []
    yield started
    for joiner in started:
        joiner.close()
    delete_internal_topics(bootstrap, sorted({joiner.group_id for joiner in started}))
