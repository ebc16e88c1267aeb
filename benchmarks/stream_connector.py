"""`python -m benchmarks.stream_connector`: MQTT -> Kafka throughput, the seed's method beside ours.

Sustained throughput is measured on a backlog: real rows are queued in the broker for a persistent
session, then the connector under test drains them into a fresh copy of machine.data while the
broker and Kafka share the two cores with it. The rate runs from the first record in Kafka to the
last, so process start-up is not counted. The seed's method (Kafka `flush()` after every message,
MQTT auto-ack) and ours take turns in alternating rounds, since the machine is shared. A last run
has the simulator and the connector work at the same time: rows/s end to end.

`--instances N` measures sharding instead: one connector against N, each with its own client id and
the machines dealt out to them as disjoint topic filters, on the same backlog of synthetic rows of
`--machines` machines, each machine on a topic of its own (`<base>/<thing>`, as the simulator
publishes); alternating rounds, from the first record in Kafka to the last (`sharded_backlog`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from paho.mqtt.enums import CallbackAPIVersion

from simulator.events import in_order, read_events, repeat
from simulator.publisher import Publisher
from simulator.settings import DEFAULT_EVENTS_FILE
from simulator.synthetic import synthetic_rows
from simulator.topics import row_topic
from pipeline_core.kafka_clients import admin_client, consumer_config
from pipeline_core.logs import READY_MARKER
from pipeline_core.records import encode_record, record_key
from pipeline_core.settings import ConnectionSettings, load_settings
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, ensure_topics
from stream_connector.redelivery import FENCE_OFFSETS_PER_PARTITION

from pipeline_core.mqtt import drop_session, open_session
from pipeline_core.validation import ROW_FIELDS

from benchmarks.results import Results, at_least

# The synthetic rows of the sharding runs: the same for every run; an axis gives a row six quantities.
SHARDING_SEED = 7
SYNTHETIC_QUANTITIES_PER_AXIS = 6
SPEED_UP_TARGET = 5.0  # ours against the seed's method, rows/s
RATE_TARGET = 5_000  # rows/s of ours


@dataclass(frozen=True)
class Result:
    method: str
    rows: int
    records: int
    seconds: float
    cpu_seconds: float = 0.0  # of the connector process, start-up included (ours only)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds


def _real_rows(count: int) -> list[dict]:
    return list(itertools.islice(repeat(in_order(read_events(DEFAULT_EVENTS_FILE), "time")), count))


def _environment(settings: ConnectionSettings) -> dict[str, str]:
    """The connection settings of this run, for the subprocesses it starts."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MQTT_HOST": settings.mqtt_host,
           "MQTT_PORT": str(settings.mqtt_port), "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers}
    if settings.mqtt_username:
        env.update(MQTT_USERNAME=settings.mqtt_username, MQTT_PASSWORD=settings.mqtt_password or "")
    return env


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _records_of(rows: list[dict]) -> int:
    return sum(1 for row in rows for key in row if key not in ROW_FIELDS)


class Topics:
    """Fresh copies of machine.data and machine.dlq, deleted afterwards."""

    def __init__(self, bootstrap: str) -> None:
        self.admin = admin_client(bootstrap)
        suffix = uuid.uuid4().hex[:10]
        self.data = f"{MACHINE_DATA.name}.bench.{suffix}"
        self.dlq = f"{MACHINE_DLQ.name}.bench.{suffix}"
        ensure_topics(self.admin, (dataclasses.replace(MACHINE_DATA, name=self.data),
                                   dataclasses.replace(MACHINE_DLQ, name=self.dlq)))
        self.consumer = Consumer(consumer_config(bootstrap, f"bench-{suffix}"))
        # Just created, the topic may show no partitions yet (its size would stay 0), or no leader of one.
        end = time.monotonic() + 60
        while True:
            partitions = self.consumer.list_topics(self.data, timeout=10).topics[self.data].partitions
            self.partitions = [TopicPartition(self.data, p) for p in partitions]
            try:
                if self.partitions and self.data_size() == 0:
                    break
            except KafkaException:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"{self.data} has no leader for every partition 60 s after its creation")
            time.sleep(0.1)

    def data_size(self) -> int:
        """The data topic's offsets (records, and the connector's fences: FENCE_OFFSETS_PER_PARTITION each)."""
        return sum(self.consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in self.partitions)

    def delete(self) -> None:
        self.consumer.close()
        for future in self.admin.delete_topics([self.data, self.dlq], operation_timeout=30).values():
            future.result(30)


@contextlib.contextmanager
def fresh_topics(settings: ConnectionSettings) -> Iterator[Topics]:
    topics = Topics(settings.kafka_bootstrap_servers)
    try:
        yield topics
    finally:
        topics.delete()


def _queue_backlog(settings: ConnectionSettings, sessions: dict[str, list[str]], topic_template: str,
                   rows: list[dict]) -> None:
    """Open a persistent session per client id, subscribed to its filters, then publish `rows` to
    `topic_template` ({thing}: the row's machine) and wait for the broker's acknowledgements."""
    for client_id, filters in sessions.items():
        for topic_filter in filters:  # each subscription adds to the session
            open_session(settings, client_id, topic_filter)
    topic_of = row_topic(topic_template)
    publisher = Publisher(settings, f"{next(iter(sessions))}-publisher")
    publisher.connect()
    for row in rows:
        publisher.publish(topic_of(row), json.dumps(row))
    if publisher.drain(120) or publisher.failed:
        raise RuntimeError(f"{publisher.failed} backlog rows were not acknowledged by the broker")
    publisher.close()


def _watch(topics: Topics, start_size: int, records: int, deadline_s: float, alive=lambda: True) -> float:
    """Seconds from the first new record in Kafka to the last expected one."""
    end = time.monotonic() + deadline_s
    first: float | None = None
    while time.monotonic() < end and alive():
        size = topics.data_size() - start_size
        if size > 0 and first is None:
            first = time.perf_counter()
        if size >= records:
            return time.perf_counter() - first
        time.sleep(0.02)
    raise RuntimeError(f"only {topics.data_size() - start_size} of {records} records within {deadline_s:.0f} s")


def ours_on_backlog(settings: ConnectionSettings, rows: list[dict], log_path: str) -> Result:
    """Drain a backlog of `rows` into topics of this run only: the connector finds the records of an earlier
    run's same rows in the topic's tail and, taking them for rows sent again, would not write them."""
    with fresh_topics(settings) as topics:
        return _ours_on_backlog(settings, topics, rows, log_path)


def _ours_on_backlog(settings: ConnectionSettings, topics: Topics, rows: list[dict], log_path: str) -> Result:
    run = uuid.uuid4().hex[:10]
    client_id, base = f"bench-connector-{run}", f"bench/{run}/states"
    _queue_backlog(settings, {client_id: [f"{base}/#"]}, base + "/{thing}", rows)
    # The connector's start-up fence takes offsets of every partition before its first record.
    records = _records_of(rows)
    start_size = topics.data_size() + FENCE_OFFSETS_PER_PARTITION * len(topics.partitions)
    cpu_before = _children_cpu_seconds()
    with open(log_path, "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "stream_connector", "--topic-filters", f"{base}/#",
                                    "--mqtt-client-id", client_id, "--data-topic", topics.data,
                                    "--dlq-topic", topics.dlq], stdout=log, stderr=subprocess.STDOUT,
                                   env=_environment(settings))
    try:
        seconds = _watch(topics, start_size, records, 180, alive=lambda: process.poll() is None)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        drop_session(settings, client_id)
    return Result("ours: batched produce, MQTT ack after Kafka delivery", len(rows), records, seconds,
                  _children_cpu_seconds() - cpu_before)


def shard_filters(base: str, things: list[str], instances: int) -> list[list[str]]:
    """The topic filters of each instance: all of `base/#` for one; else the machines dealt out in turn."""
    if instances == 1:
        return [[f"{base}/#"]]
    if len(things) < instances:
        raise ValueError(f"{len(things)} machines cannot be shared by {instances} instances")
    return [[f"{base}/{thing}" for thing in sorted(things)[index::instances]] for index in range(instances)]


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a running process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sharded_backlog(settings: ConnectionSettings, rows: int, machines: int, instances: int, log_path: str) -> Result:
    """`instances` connectors on disjoint filters drain one backlog of `rows` synthetic rows of `machines` machines,
    each machine on its own topic. They start and subscribe first and are then held (SIGSTOP) while the simulator
    queues the backlog in their sessions, and go on together (SIGCONT): the rate, from the first record in Kafka to
    the last, measures draining, not one instance starting later than another."""
    with fresh_topics(settings) as topics:
        run = uuid.uuid4().hex[:10]
        base = f"bench/{run}/states"
        things = [row["Thing"] for row in itertools.islice(synthetic_rows(machines, 1, SHARDING_SEED), machines)]
        sessions = {f"bench-connector-{run}-{index}": filters
                    for index, filters in enumerate(shard_filters(base, things, instances))}
        log = Path(log_path)
        log_start = log.stat().st_size if log.exists() else 0
        records = rows * SYNTHETIC_QUANTITIES_PER_AXIS
        processes = []
        with open(log_path, "ab") as log_file:
            for client_id, filters in sessions.items():
                processes.append(subprocess.Popen(
                    [sys.executable, "-m", "stream_connector", "--topic-filters", ",".join(filters),
                     "--mqtt-client-id", client_id, "--data-topic", topics.data, "--dlq-topic", topics.dlq],
                    stdout=log_file, stderr=subprocess.STDOUT, env=_environment(settings)))
        try:
            end = time.monotonic() + 60
            while log.read_bytes()[log_start:].count(READY_MARKER.encode()) < instances:
                if time.monotonic() > end or any(process.poll() is not None for process in processes):
                    raise RuntimeError(f"the connectors did not all announce READY; see {log_path}")
                time.sleep(0.05)
            for process in processes:
                process.send_signal(signal.SIGSTOP)
            published = subprocess.run(
                [sys.executable, "-m", "simulator", "--synthetic", "--machines", str(machines), "--axes", "1",
                 "--seed", str(SHARDING_SEED), "--limit", str(rows), "--mqtt-topic", base + "/{thing}",
                 "--no-progress"], capture_output=True, text=True, env=_environment(settings), timeout=300)
            if published.returncode != 0:
                raise RuntimeError(f"the simulator failed: {published.stdout}{published.stderr}")
            start_size = topics.data_size()
            cpu_before = sum(_cpu_seconds(process.pid) for process in processes)
            for process in processes:
                process.send_signal(signal.SIGCONT)
            seconds = _watch(topics, start_size, records, 180,
                             alive=lambda: all(process.poll() is None for process in processes))
            cpu_seconds = sum(_cpu_seconds(process.pid) for process in processes) - cpu_before
        finally:
            for process in processes:
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGTERM)
            for process, client_id in zip(processes, sessions):
                process.wait(60)
                drop_session(settings, client_id)
    method = "1 connector, machine/states/#" if instances == 1 else f"{instances} connectors, disjoint topic filters"
    return Result(method, rows, records, seconds, cpu_seconds)


def seed_on_backlog(settings: ConnectionSettings, topics: Topics, rows: list[dict]) -> Result:
    """The seed's loop: parse, produce each quantity, `flush()` per message, paho acks on return."""
    client_id, topic = f"bench-seed-{uuid.uuid4().hex[:8]}", f"bench/{uuid.uuid4().hex[:10]}/states"
    _queue_backlog(settings, {client_id: [topic]}, topic, rows)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    done: list[float] = []

    def on_message(_client, _userdata, message) -> None:
        row = json.loads(message.payload)
        for quantity, value in row.items():
            if quantity not in ROW_FIELDS:
                record = {"thing": row["Thing"], "quantity": quantity, "phenomenonTime": row["Timestamp"],
                          "result": value, "id": row["id"]}
                producer.produce(topics.data, encode_record(record), record_key(row["Thing"], quantity))
        producer.flush()
        done.append(time.perf_counter())

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
    client.on_message = on_message
    client.connect(settings.mqtt_host, settings.mqtt_port)
    end = time.monotonic() + 180
    while len(done) < len(rows) and time.monotonic() < end:
        client.loop(0.1)
    client.disconnect()
    drop_session(settings, client_id)
    if len(done) < len(rows):
        raise RuntimeError(f"the seed's method took {len(done)} of {len(rows)} rows within 180 s")
    # From the first row's flush to the last: comparable with "first record to last" for ours.
    return Result("seed: flush() after every message, auto-ack", len(rows) - 1, _records_of(rows[1:]),
                  done[-1] - done[0])


def live(settings: ConnectionSettings, rows: int, log_path: str) -> Result:
    """Simulator and connector at the same time, rows/s from the first record in Kafka to the last."""
    with fresh_topics(settings) as topics:
        return _live(settings, topics, rows, log_path)


def _live(settings: ConnectionSettings, topics: Topics, rows: int, log_path: str) -> Result:
    client_id, topic = f"bench-live-{uuid.uuid4().hex[:8]}", f"bench/{uuid.uuid4().hex[:10]}/states"
    records = _records_of(_real_rows(rows))
    log = Path(log_path)
    log_start = log.stat().st_size if log.exists() else 0  # earlier runs logged READY too
    with open(log_path, "ab") as log_file:
        connector = subprocess.Popen([sys.executable, "-m", "stream_connector", "--topic-filters", topic,
                                      "--mqtt-client-id", client_id, "--data-topic", topics.data,
                                      "--dlq-topic", topics.dlq], stdout=log_file, stderr=subprocess.STDOUT,
                                     env=_environment(settings))
    simulator = None
    try:
        end = time.monotonic() + 30
        while READY_MARKER.encode() not in log.read_bytes()[log_start:] and time.monotonic() < end:
            time.sleep(0.05)
        start_size = topics.data_size()  # after the connector's start-up fence
        simulator = subprocess.Popen([sys.executable, "-m", "simulator", "--mqtt-topic", topic, "--loop",
                                      "--limit", str(rows), "--no-progress"], stdout=subprocess.DEVNULL,
                                     env=_environment(settings))
        seconds = _watch(topics, start_size, records, 180, alive=lambda: connector.poll() is None)
    finally:
        if simulator is not None:
            simulator.wait(60)
        connector.send_signal(signal.SIGTERM)
        connector.wait(60)
        drop_session(settings, client_id)
    return Result("live: simulator and connector at once, end to end", rows, records, seconds)


def compare_instances(settings: ConnectionSettings, instances: int, rows: int, machines: int, rounds: int,
                      recorded: Results) -> int:
    """One connector against `instances`, on the same rows, alternating rounds; prints a table."""
    per_run = rows // rounds
    print(f"MQTT -> Kafka, sharded: a backlog of {per_run:,} synthetic rows of {machines} machines a run (one axis, "
          f"{SYNTHETIC_QUANTITIES_PER_AXIS} quantities a row), each machine on a topic of its own, drained by 1 or "
          f"{instances} connectors at once into a fresh copy of {MACHINE_DATA.name}; {rounds} alternating rounds; "
          f"{os.cpu_count()} cores shared with the broker and Kafka")
    log_path = os.path.join(tempfile.gettempdir(), f"stream_connector_bench_{os.getpid()}.log")
    per_round = [(sharded_backlog(settings, per_run, machines, 1, log_path),
                  sharded_backlog(settings, per_run, machines, instances, log_path)) for _ in range(rounds)]
    results = [Result(runs[0].method, sum(r.rows for r in runs), sum(r.records for r in runs),
                      sum(r.seconds for r in runs), sum(r.cpu_seconds for r in runs)) for runs in zip(*per_round)]
    print(f"{'connectors':<54} {'rows':>7} {'records':>8} {'rows/s':>8} {'records/s':>10} {'CPU µs/row':>10}")
    for result in results:
        print(f"{result.method:<54} {result.rows:>7,} {result.records:>8,} {result.rows_per_s:>8,.0f} "
              f"{result.records_per_s:>10,.0f} {result.cpu_seconds / result.rows * 1e6:>10,.0f}")
    one, many = results
    print(f"{instances} instances / 1: {many.rows_per_s / one.rows_per_s:.2f}x rows/s; connector log: {log_path}")
    for result, label in ((one, "1 connector"), (many, f"{instances} connectors, disjoint topic filters")):
        recorded.add(label, result.rows_per_s, "rows/s")
        recorded.add(f"{label}, CPU per row of all instances", result.cpu_seconds / result.rows * 1e6, "µs")
    recorded.add(f"{instances} instances / 1", many.rows_per_s / one.rows_per_s, "x")
    recorded.write()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream_connector", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40_000, help="backlog rows for ours, over all rounds")
    parser.add_argument("--seed-rows", type=int, default=1_000, help="backlog rows for the seed's method")
    parser.add_argument("--live-rows", type=int, default=20_000, help="rows for the live run (0 = skip)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    parser.add_argument("--instances", type=int, default=1,
                        help="above 1: one connector against this many on disjoint topic filters, on --rows "
                             "synthetic rows published while they run (instead of the runs above)")
    parser.add_argument("--machines", type=int, default=20, help="machines of the synthetic rows of --instances")
    args, rest = parser.parse_known_args(argv)
    settings = load_settings(ConnectionSettings, rest, prog="python -m benchmarks.stream_connector")
    if args.instances > 1:
        return compare_instances(settings, args.instances, args.rows, args.machines, args.rounds,
                                 Results("stream_connector_instances", argv))
    recorded = Results("stream_connector", argv)
    ours_rows = _real_rows(args.rows // args.rounds)
    # The same mix of rows for both: quantities per row vary along the file.
    seed_count = args.seed_rows // args.rounds
    seed_rows = ours_rows[::max(1, len(ours_rows) // seed_count)][:seed_count]

    print(f"MQTT -> Kafka: a backlog of real rows queued in Mosquitto, drained into a fresh copy of "
          f"{MACHINE_DATA.name} ({MACHINE_DATA.partitions} partitions), {args.rounds} alternating rounds; "
          f"{os.cpu_count()} cores shared with the broker and Kafka")
    log_path = os.path.join(tempfile.gettempdir(), f"stream_connector_bench_{os.getpid()}.log")
    with fresh_topics(settings) as seed_topics:  # the seed's method writes every row, sent before or not
        rounds = [(seed_on_backlog(settings, seed_topics, seed_rows), ours_on_backlog(settings, ours_rows, log_path))
                  for _ in range(args.rounds)]
    results = [Result(per_round[0].method, sum(r.rows for r in per_round), sum(r.records for r in per_round),
                      sum(r.seconds for r in per_round), sum(r.cpu_seconds for r in per_round))
               for per_round in zip(*rounds)]
    if args.live_rows:
        results.append(live(settings, args.live_rows, log_path))
    print(f"{'method':<54} {'rows':>7} {'records':>8} {'rows/s':>8} {'records/s':>10}")
    for result in results:
        print(f"{result.method:<54} {result.rows:>7,} {result.records:>8,} {result.rows_per_s:>8,.0f} "
              f"{result.records_per_s:>10,.0f}")
    seed, ours = results[0], results[1]
    print(f"ours / seed: {ours.rows_per_s / seed.rows_per_s:.1f}x rows/s, {ours.records_per_s / seed.records_per_s:.1f}x "
          f"records/s (target >= {SPEED_UP_TARGET:g}x); "
          f"ours {ours.rows_per_s:,.0f} rows/s (target >= {RATE_TARGET:,})")
    cpu_per_row = ours.cpu_seconds / ours.rows
    print(f"what bounds ours: CPU, {cpu_per_row * 1e6:,.0f} µs per row in the connector process (start-up "
          f"included), i.e. {1 / cpu_per_row:,.0f} rows/s on a core of its own; connector log: {log_path}")
    recorded.add("ours, a backlog drained", ours.rows_per_s, "rows/s", at_least(RATE_TARGET))
    recorded.add("ours, a backlog drained, in records", ours.records_per_s, "records/s")
    recorded.add("seed's method, a backlog drained", seed.rows_per_s, "rows/s")
    recorded.add("ours / seed's method", ours.rows_per_s / seed.rows_per_s, "x", at_least(SPEED_UP_TARGET))
    recorded.add("ours: CPU per row in the connector process, start-up included", cpu_per_row * 1e6, "µs")
    if args.live_rows:
        recorded.add("live: simulator and connector at once, end to end", results[2].rows_per_s, "rows/s")
    recorded.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
