"""``python -m benchmarks.join_peers``: this project's joiners beside the joins their users would reach for
instead, on the same input, in one run, on one machine.

The input is the shipped real events (``01_simulator/data/test_events.json``) as the stream connector writes
them to machine.data, replayed by a fleet of ``--copies`` machines per real one; the engine's batch join over
each series is the reference every peer is held to. The peers:

  (a) this project's Spark job (``spark_joiner``), exactly once;
  (b) Spark's own stream-stream join: an event-time interval join within delta_time, watermarks on both
      inputs, Spark's Kafka sink (at-least-once), as Spark's guide recommends (``peers.spark_interval``);
  (c) the standalone joiner (``kafka_joiner``), exactly once, one process, input joined where it lies;
  (d) Quix Streams' ``join_asof`` (speed as of torque), exactly once (``peers.quix_asof``);
  (e) PyFlink SQL: an event-time interval join and an event-time temporal (as-of) join over the Kafka SQL
      connector, with watermarks, exactly once (``peers.flink_sql``);
  (f) Pathway's ``asof_join``: backward, and in both directions from both sides (``peers.pathway_asof``).

(d), (e) and (f) run in virtualenvs of their own under ``.cache/peers/``, made on first use
(``peers.venvs``), as subprocesses the bench talks to through files and Kafka topics
(``peers.subprocess_peer``): their packages are no part of this project's environment.

Each peer runs four times on fresh topics (the other interleaving first, so that the measured backlog run is
never a process's or a JVM's first), and the time-order backlog again in each further ``--rounds`` (at least
two; each round takes the peers in the reverse order of the one before). Every backlog run starts the peer,
feeds it a warm-up (a machine of its own per partition, a day earlier) and waits for its first output, then
appends the backlog at once:

1. backlog, time order: records/s from the moment the backlog's first record is handed to Kafka to the moment
   its last output is visible to a read_committed reader, the same two moments for every peer; the median of
   the rounds is shown with each round's figure; CPU per record of the first round (its process tree: driver,
   JVM and Python workers for Spark; the peer's process otherwise; the broker's excluded);
2. backlog, another interleaving (``--interleaving``): the same records, each series still in its order,
   appended in another order across things and quantities; by the join's contract the pairs do not change;
3. backlog, bounded disorder (``--disorder-s``, ``--seed``): time order with each machine's rows
   displaced in arrival by up to that much event time; this project's joiners run with
   ``max_out_of_orderness`` set to the bound (where the engine has it), Flink's watermarks trail by it;
4. live: a steady ``--rate`` records/s in time order after a warm-up; per output, the time from the append
   of the later of its two inputs to the moment a read_committed reader sees it: p50/p99.

Each row states the peer's parallelism and delivery guarantee as run.

For every run the output is compared with the reference: pairs found, missing, extra (pairs that are not a
record's neighbour within delta_time), and duplicates. Topics are unique per run and deleted afterwards.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import datetime
import json
import logging
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from pipeline_core.kafka_clients import admin_client
from pipeline_core.logs import configure_logging
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import MachineRecord
from pipeline_core.settings import KafkaSettings
from pipeline_core.topics import MACHINE_DATA
from simulator.settings import DEFAULT_EVENTS_FILE

from local_stream_buffer.specs import JoinSpec, SpecResolver
from kafka_joiner.settings import KafkaJoinerSettings
from spark_joiner.job import start_query
from spark_joiner.session import spark_session
from spark_joiner.settings import SparkJoinerSettings
from spark_joiner.sink import TransactionalBatchSink

from benchmarks.kafka_joiner import InstanceResult, joiner_settings, run_instances
from benchmarks.peers import workload
from benchmarks.peers.harness import OutputReader, end_offsets, preload, produce_paced
from benchmarks.peers import venvs
from benchmarks.peers.pairs import (PairComparison, PairKey, asof_pairs, compare_pairs, interval_pairs,
                                    neighbour_pairs, output_difference, same_output, series_of, written_pairs)
from benchmarks.peers.spark_interval import start_interval_join
from benchmarks.peers.subprocess_peer import RunInput, SubprocessPeer, end_offsets_of
from benchmarks.results import Results
from benchmarks.spark_joiner import (Topics, cpu_seconds_by_kind, delete_topics, make_topics, settings_for,
                                     stop_between_batches)

log = logging.getLogger("benchmarks.join_peers")

WARM_UP_THING = "warm-up"
WARM_UP_PAIRS = 10
DAY_MS = 86_400_000


DISORDERED = "disordered"


def out_of_orderness_field() -> str | None:
    """The engine's JoinSpec field for bounded disorder, if this engine has one."""
    return next((field.name for field in dataclasses.fields(JoinSpec)
                 if field.name.startswith("max_out_of_orderness")), None)


def join_specs_for(run: RunInput, workdir: Path) -> Path | None:
    """A join-spec file of the default specs with ``max_out_of_orderness`` set to the run's disorder bound; None
    (the default specs) for an input in order or an engine without the setting."""
    if not run.max_out_of_orderness_s or out_of_orderness_field() is None:
        return None
    path = workdir / f"join-specs-{run.max_out_of_orderness_s:g}s.toml"
    entries = []
    for spec in SpecResolver().specs:
        lines = ["[[join]]", *(f"{key} = {json.dumps(getattr(spec, key))}"
                               for key in ("name", "left", "right", "output", "formula")),
                 f"axis = {json.dumps(spec.axis_pattern)}",
                 f"max_out_of_orderness_s = {run.max_out_of_orderness_s}"]
        if spec.delta_time_s is not None:
            lines.append(f"delta_time_s = {spec.delta_time_s}")
        entries.append("\n".join(lines))
    path.write_text("\n\n".join(entries) + "\n")
    return path


class Peer(Protocol):
    name: str

    def start(self, topics: Topics, run: RunInput, live: bool) -> None: ...

    def done(self, run: RunInput) -> bool:
        """Whether the peer has processed all of the run's input."""

    def first_input_at(self) -> float | None:
        """Wall-clock time the peer began reading the run's input."""

    def stop(self) -> float:
        """Stop the peer; the CPU seconds it used since it started."""


class SparkPeer:
    """A streaming query in the bench's Spark session; CPU of this process tree (driver, JVM, Python workers),
    less the output reader's thread."""

    name = ""

    def __init__(self, spark, bootstrap: str, workdir: Path, batch: int, trigger_s: float) -> None:
        self.spark, self.bootstrap, self.workdir = spark, bootstrap, workdir
        self.batch, self.trigger_s = batch, trigger_s
        self.query = None
        self.cpu_before = 0.0

    def settings(self, topics: Topics, run: RunInput, live: bool) -> SparkJoinerSettings:
        checkpoint = self.workdir / f"checkpoint-{uuid.uuid4().hex[:8]}"
        # A backlog in batches of --batch records back to back; live, a batch per trigger of what arrived.
        return settings_for(self.bootstrap, topics, checkpoint,
                            trigger_s=self.trigger_s if live else 0.0,
                            max_offsets_per_trigger=0 if live else self.batch,
                            join_specs=join_specs_for(run, self.workdir))

    def start(self, topics: Topics, run: RunInput, live: bool) -> None:
        self.input_topic, self.input_end = topics.data, None
        self.cpu_before = sum(cpu_seconds_by_kind().values())
        self.query = self.start_query(self.settings(topics, run, live))

    def start_query(self, settings: SparkJoinerSettings):
        raise NotImplementedError

    def done(self, run: RunInput) -> bool:
        if self.query.exception() is not None:
            raise RuntimeError(f"{self.name}: query failed: {self.query.exception()}")
        # By offsets, not Spark's row counts: a query reading its source twice (a self-join) counts rows twice.
        # Asked once the input is complete, so its end offsets are taken then.
        self.input_end = self.input_end or end_offsets(self.bootstrap, self.input_topic)
        progress = self.query.lastProgress
        if progress is None or self.query.status["isTriggerActive"]:
            return False
        return all(source["endOffset"] == self.input_end for source in json.loads(progress.json)["sources"])

    def first_input_at(self) -> float | None:
        for progress in self.query.recentProgress:
            if progress["numInputRows"]:
                return datetime.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()
        return None

    def stop(self) -> float:
        stop_between_batches(self.query)
        cpu = sum(cpu_seconds_by_kind().values()) - self.cpu_before
        batches = [json.loads(progress.json) for progress in self.query.recentProgress if progress["numInputRows"]]
        states = [operator for batch in batches for operator in batch.get("stateOperators", ())]
        log.info("%s: %d batches of %.1f s on average; state rows at the end %s; input rows dropped as late %s",
                 self.name, len(batches),
                 np.mean([batch["durationMs"]["triggerExecution"] for batch in batches]) / 1000 if batches else 0,
                 [operator["numRowsTotal"] for operator in batches[-1].get("stateOperators", ())] if batches else [],
                 sum(operator.get("numRowsDroppedByWatermark", 0) for operator in states))
        return cpu


class SparkJoinerPeer(SparkPeer):
    name = "(a) this project's Spark job"

    def start_query(self, settings: SparkJoinerSettings):
        self.sink = TransactionalBatchSink(self.bootstrap, settings.output_topic, settings.dlq_topic,
                                           f"join-peers.{uuid.uuid4().hex[:8]}")
        return start_query(self.spark, settings, self.sink)

    def stop(self) -> float:
        cpu = super().stop()
        self.sink.close()
        self.sink = None  # its clients go before the run's topics do
        return cpu


class SparkIntervalPeer(SparkPeer):
    name = "(b) Spark interval join"

    def __init__(self, *args, watermark_s: float, resolver: SpecResolver, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.watermark_s, self.resolver = watermark_s, resolver

    def start_query(self, settings: SparkJoinerSettings):
        return start_interval_join(self.spark, settings, self.resolver.specs, self.watermark_s)


class KafkaJoinerPeer:
    """The standalone joiner in a process of its own, as ``benchmarks.kafka_joiner`` runs it: it stops once it
    has committed the run's reference pairs, or read the run's records and committed nothing more for a second (a
    disorder bound holds the last pairs), or ``max_s`` after its first record."""

    name = "(c) standalone joiner"

    def __init__(self, connection: KafkaSettings, max_s: float, workdir: Path) -> None:
        self.connection, self.max_s, self.workdir = connection, max_s, workdir
        self.results: list[InstanceResult] = []

    def start(self, topics: Topics, run: RunInput, live: bool) -> None:
        group = f"join-peers.{topics.data}"
        settings = joiner_settings(self.connection, {"data": topics.data, "out": topics.out, "dlq": topics.dlq,
                                                     "group": group},
                                   KafkaJoinerSettings.commit_interval_ms, True, "peer-0")
        settings = dataclasses.replace(settings, join_specs=join_specs_for(run, self.workdir))
        self.results = []
        self.thread = threading.Thread(target=lambda: self.results.extend(
            run_instances([settings], run.pairs, self.max_s, records=run.records)), daemon=True)
        self.thread.start()

    def done(self, run: RunInput) -> bool:
        return not self.thread.is_alive()

    def first_input_at(self) -> float | None:
        started = [result.first_record_at for result in self.results if result.first_record_at is not None]
        # The instances' times are time.monotonic(), the same clock in every process of this machine.
        return min(started) + time.time() - time.monotonic() if started else None

    def stop(self) -> float:
        self.thread.join()
        return sum(result.cpu_s for result in self.results)


@dataclasses.dataclass
class RunResult:
    comparison: PairComparison
    written: list[PairKey]
    records_per_s: float = float("nan")
    cpu_us_per_record: float = float("nan")
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    retractions: int = 0  # records that withdrew an earlier one (Pathway's diff -1)
    rounds: list[float] = dataclasses.field(default_factory=list)  # records/s of each round (time order)


def wait_until(condition: Callable[[], bool], deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {deadline_s:.0f} s")
        time.sleep(0.1)


def cleanup(bootstrap: str, topics: Topics) -> None:
    """Delete every topic of a run: its own, and those a peer made for itself (named after its group, which
    holds the input topic's name)."""
    run_id = topics.data.removeprefix(f"{MACHINE_DATA.name}.")
    existing = admin_client(bootstrap).list_topics(timeout=10).topics
    delete_topics(bootstrap, [name for name in existing if run_id in name])


def backlog_run(peer: Peer, bootstrap: str, warm_up: Sequence[workload.Message], messages: Sequence[workload.Message],
                run: RunInput, reference: set[PairKey], settle_s: float, deadline_s: float) -> RunResult:
    """The peer, once running and past a warm-up (its first output seen), on ``messages`` appended at once into
    fresh topics, until it read them all and its output settled. Every peer is timed alike: from the moment the
    backlog's first record is handed to Kafka to the moment its last output is visible to a read_committed
    reader (``run`` covers the warm-up and the backlog)."""
    topics = make_topics(bootstrap, "peers")
    try:
        reader = OutputReader(bootstrap, topics.out)
        reader.start()
        peer.start(topics, run, live=False)
        try:
            preload(bootstrap, topics.data, warm_up)
            wait_until(lambda: len(reader.values) > 0, 300, f"{peer.name}'s first output")
            first = time.time()
            preload(bootstrap, topics.data, messages)
            wait_until(lambda: peer.done(run), deadline_s, f"{peer.name} to read {run.records:,} records")
            # Settled: no new output for settle_s since the peer read its input (a peer may count its input
            # before it writes what that input joins).
            done_at = time.time()
            wait_until(lambda: reader.idle_seconds(done_at) > settle_s, deadline_s, f"{peer.name}'s output to settle")
        finally:
            cpu_seconds = peer.stop()
        time.sleep(settle_s)  # a last commit on stop becomes visible
        reader.stop()
    finally:
        cleanup(bootstrap, topics)
    if isinstance(peer, SparkPeer):
        cpu_seconds -= reader.cpu_seconds  # the reader shares the driver's process
    outputs = [json.loads(value) for value in reader.values]
    written, retractions = written_pairs(output for output in outputs if not is_warm_up(output))
    visible = [moment for output, moment in zip(outputs, reader.visible_at) if not is_warm_up(output)]
    records = run.records - len(warm_up)
    return RunResult(compare_pairs(reference, written), written,
                     records_per_s=records / (visible[-1] - first) if visible else float("nan"),
                     cpu_us_per_record=cpu_seconds / records * 1e6, retractions=retractions)


def live_run(peer: Peer, bootstrap: str, warm_up: Sequence[workload.Message], steady: Sequence[workload.Message],
             steady_records: Sequence[MachineRecord], run: RunInput, reference: set[PairKey], rate: float,
             settle_s: float) -> RunResult:
    """The peer on a steady input after a warm-up; latency of each output from the append of its later input."""
    topics = make_topics(bootstrap, "peers-live")
    context = multiprocessing.get_context("spawn")
    appended: multiprocessing.Queue = context.Queue()
    try:
        reader = OutputReader(bootstrap, topics.out)
        reader.start()
        peer.start(topics, run, live=True)
        try:
            # Warm-up: the peer has joined its group, planned its query, started its workers.
            preload(bootstrap, topics.data, warm_up)
            wait_until(lambda: len(reader.values) > 0, 180, f"{peer.name}'s first output")
            producer = context.Process(target=produce_paced, args=(bootstrap, topics.data, steady, rate, appended))
            producer.start()
            append_times = appended.get(timeout=len(steady) / rate + 120)
            producer.join(30)
            wait_until(lambda: peer.done(run), 600, f"{peer.name} to read the steady input")
            done_at = time.time()
            wait_until(lambda: reader.idle_seconds(done_at) > settle_s, 120, f"{peer.name}'s output to settle")
        finally:
            peer.stop()
        reader.stop()
    finally:
        cleanup(bootstrap, topics)
    appended_at = {(record["thing"], record["quantity"], record["phenomenonTime"]): moment
                   for record, moment in zip(steady_records, append_times)}
    outputs = [json.loads(value) for value in reader.values]
    written, retractions = written_pairs(output for output in outputs if not is_warm_up(output))
    latencies = []
    for output, visible in zip(outputs, reader.visible_at):
        if is_warm_up(output) or output.get("diff", 1) < 0:
            continue
        inputs = [appended_at.get((output["thing"], output[side]["quantity"], output[side]["phenomenonTime"]))
                  for side in ("left", "right")]
        if None not in inputs:
            latencies.append(visible - max(inputs))
    p50, p99 = np.percentile(latencies, [50, 99]) * 1000 if latencies else (float("nan"), float("nan"))
    return RunResult(compare_pairs(reference, written), written, p50_ms=p50, p99_ms=p99, retractions=retractions)


def warm_up_things(partitions: int) -> list[str]:
    """One machine of its own per partition of machine.data: a peer whose event time is the least over its
    partitions (Flink's watermark) moves on only once every partition has records."""
    things: dict[int, str] = {}
    index = 0
    while len(things) < partitions:
        name = f"{WARM_UP_THING}-{index}"
        things.setdefault(thing_partition(name, partitions), name)
        index += 1
    return sorted(things.values())


def is_warm_up(output: dict) -> bool:
    return output["thing"].startswith(WARM_UP_THING)


def warm_up_records(before_ms: int) -> list[MachineRecord]:
    """A few speed and torque records of a machine of its own in each partition, a day before the input, in
    time order."""
    start = before_ms - DAY_MS
    records: list[MachineRecord] = []
    for index in range(WARM_UP_PAIRS):
        for thing in warm_up_things(MACHINE_DATA.partitions):
            records.append({"thing": thing, "quantity": "actSpeed_C11", "phenomenonTime": start + index * 1000,
                            "result": 100.0})
            records.append({"thing": thing, "quantity": "vaTorque_C11",
                            "phenomenonTime": start + index * 1000 + 300, "result": 1.0})
    return records


def run_input(records: Sequence[MachineRecord], resolver: SpecResolver, reference: set[PairKey],
              messages: Sequence[workload.Message], max_out_of_orderness_s: float = 0.0) -> RunInput:
    return RunInput(len(records), sum(len(resolver.routes(record["quantity"])) for record in records),
                    len(reference), max_out_of_orderness_s, end_offsets_of(messages, MACHINE_DATA.partitions))


def disorder_cell(result: RunResult) -> str:
    check = result.comparison
    if check.exact:
        return "exact"
    return f"{check.missing:,} missing, {check.extra:,} extra, {check.duplicates:,} dup"


def print_table(results: dict[str, dict[str, RunResult]], interleaving: str, args: argparse.Namespace,
                references: dict[str, int]) -> None:
    print()
    print(f"Peers on the real events replayed by {args.copies} copies of each machine "
          f"({references['records']:,} records): the engine's join gives {references['neighbour']:,} pairs; "
          f"an interval join within delta {references['interval']:,}; a backward as-of join "
          f"{references['asof']:,}")
    header = (f"{'':<31} {'parallelism':<19} {'guarantee':<13} {'records/s median (rounds)':>27} "
              f"{'CPU µs/rec':>10} {'p50 ms':>7} {'p99 ms':>7} | {'pairs out':>9} "
              f"{'found':>7} {'missing':>7} {'extra':>7} {'dup':>5} | {interleaving}: same output? "
              f"| disordered ≤ {args.disorder_s:g} s")
    print(header)
    print("-" * len(header))
    for name, runs in results.items():
        backlog, other, live = runs["time order"], runs[interleaving], runs["live"]
        check = backlog.comparison
        if same_output(backlog.written, other.written):
            changed = "same"
        else:
            only_first, only_other = output_difference(backlog.written, other.written)
            changed = f"CHANGED: {only_first:,} lost, {only_other:,} new"
        parallelism, guarantee = peer_facts(name)
        rounds = backlog.rounds or [backlog.records_per_s]
        speed = f"{float(np.median(rounds)):,.0f} ({', '.join(f'{value:,.0f}' for value in rounds)})"
        print(f"{name:<31} {parallelism:<19} {guarantee:<13} {speed:>27} {backlog.cpu_us_per_record:10.1f} {live.p50_ms:7.0f} "
              f"{live.p99_ms:7.0f} | {check.outputs:9,} {check.found:7,} {check.missing:7,} {check.extra:7,} "
              f"{check.duplicates:5,} | {changed:<{len(interleaving) + 14}} | {disorder_cell(runs[DISORDERED])}")
    spark_job = next((runs["time order"] for name, runs in results.items() if name.startswith("(a)")), None)
    interval = next((runs["time order"] for name, runs in results.items() if name.startswith("(b)")), None)
    if spark_job and interval:
        print(f"(a) / (b): {np.median(spark_job.rounds) / np.median(interval.rounds):.2f}x the records/s of Spark's interval "
              f"join, {interval.cpu_us_per_record / spark_job.cpu_us_per_record:.2f}x less CPU per record, on the "
              f"same input in the same run, computing the neighbour join")
    print()
    print(f"{'each run against the engine':<31} {'pairs out':>9} {'found':>7} {'missing':>7} {'extra':>7} {'dup':>5}"
          f" {'withdrawn':>9}")
    for name, runs in results.items():
        for label, result in runs.items():
            check = result.comparison
            print(f"  {name[:4]:<4} {label:<24} {check.outputs:9,} {check.found:7,} {check.missing:7,} "
                  f"{check.extra:7,} {check.duplicates:5,} {result.retractions:9,}")
    field = out_of_orderness_field()
    print(f"records/s: backlog in time order, every peer timed alike: started and past a warm-up (its first output "
          f"seen), from the moment the backlog's first record is handed to Kafka to the moment its last output is "
          f"visible to a read_committed reader; the median of {args.rounds} rounds, the peers in alternating order "
          f"(each round reverses the previous one's), each round's figure in brackets. CPU per record: of the "
          f"first round, its start-up and warm-up included, of the peer's processes (Spark: driver, JVM, Python "
          f"workers; Flink: Python and its JVM), not the broker's. Latency: live at {args.rate:,.0f} records/s for "
          f"{args.live_s:.0f} s, from the append of a pair's later input to a read_committed reader seeing "
          f"it. Pairs out: records written less those withdrawn (Pathway). Spark: batches of {args.batch:,} "
          f"records on a backlog, trigger {args.trigger_s} s live; (b) watermark {args.watermark_s:g} "
          f"s. Disordered: each machine's rows displaced in arrival by up to {args.disorder_s:g} s (seed "
          f"{args.seed}); (a), (c) " + (f"with {field} = {args.disorder_s:g}" if field else
                                         "without a disorder bound (this engine has none)") +
          f"; (e)'s watermarks trail by {args.disorder_s:g} s and 1 ms there, by 1 ms in order. Load average at "
          f"the end: {os.getloadavg()[0]:.1f}")


def record_figures(recorded: Results, results: dict[str, dict[str, RunResult]], interleaving: str,
                   references: dict[str, int]) -> None:
    """What `print_table` shows, recorded: per peer its speed, CPU and latency, and its output against the
    engine's join on each input (pairs missing, extra and twice: counts, 0 where the peer is exact)."""
    recorded.add("reference: pairs of the engine's join", references["neighbour"], "pairs")
    for name, runs in results.items():
        backlog = runs["time order"]
        recorded.add(f"{name}: backlog in time order, median of the rounds",
                     float(np.median(backlog.rounds or [backlog.records_per_s])), "records/s")
        recorded.add(f"{name}: CPU per record", backlog.cpu_us_per_record, "µs")
        recorded.add(f"{name}: live, p50", runs["live"].p50_ms, "ms")
        recorded.add(f"{name}: live, p99", runs["live"].p99_ms, "ms")
        for label in ("time order", interleaving, DISORDERED):
            check = runs[label].comparison
            for outcome in ("missing", "extra", "duplicates"):
                recorded.add(f"{name}: {label}, pairs {outcome}", getattr(check, outcome), "pairs", count=True)


PEERS = ("a", "b", "c", "d", "e", "f")


def peer_facts(name: str) -> tuple[str, str]:
    """(parallelism, delivery guarantee) of a peer, by its letter: how each row was run."""
    cores = os.cpu_count() or 1
    return {"a": (f"local[*] {cores} cores", "exactly once"), "b": (f"local[*] {cores} cores", "at least once"),
            "c": ("1 process", "exactly once"), "d": ("1 process", "exactly once"),
            "e": (f"parallelism {cores}", "exactly once"), "f": ("1 worker", "at least once")}[name[1]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.join_peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kafka-bootstrap-servers",
                        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", KafkaSettings.kafka_bootstrap_servers))
    parser.add_argument("--copies", type=int, default=6, help="machines replaying each real machine's history")
    # A smoke run's size (tests/integration/test_benchmark_smoke.py): Spark's interval join takes minutes a run on
    # the whole file, even for one copy.
    parser.add_argument("--records", type=int, default=0,
                        help="only the fleet's first this many records in time order, each series cut at the same "
                             "moment (0: all)")
    parser.add_argument("--interleaving", default="thing after thing",
                        choices=[name for name in workload.INTERLEAVINGS if name != "time order"],
                        help="the other interleaving the backlog is appended in")
    parser.add_argument("--disorder-s", type=float, default=2.0,
                        help="the disordered input: each machine's rows displaced in arrival by up to this much "
                             "event time")
    parser.add_argument("--seed", type=int, default=7, help="the disordered input's random displacements")
    parser.add_argument("--batch", type=int, default=5_000,
                        help="Spark's maxOffsetsPerTrigger on a backlog (the interval join's cost grows with it)")
    parser.add_argument("--trigger-s", type=float, default=SparkJoinerSettings.trigger_s,
                        help="Spark's trigger in the live run")
    parser.add_argument("--watermark-s", type=float, default=10.0,
                        help="(b): the watermark delay of both inputs, how late a record may arrive")
    parser.add_argument("--flink-checkpoint-ms", type=int, default=1_000,
                        help="(e): the checkpoint interval, which commits its exactly-once output")
    parser.add_argument("--rate", type=float, default=2_000, help="records/s of the live run")
    parser.add_argument("--live-s", type=float, default=10.0, help="length of the live run")
    parser.add_argument("--settle-s", type=float, default=2.0,
                        help="no new output for this long: the peer's output is complete")
    parser.add_argument("--peers", nargs="*", choices=PEERS, default=list(PEERS))
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of the time-order backlog (at least 2), the peers' order reversed each round")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds: at least 2, so that no figure is one run's")
    configure_logging()
    logging.getLogger("py4j").setLevel(logging.WARNING)
    bootstrap = args.kafka_bootstrap_servers
    recorded = Results("join_peers", argv)

    resolver = SpecResolver()
    records = workload.fleet(workload.joined_records(DEFAULT_EVENTS_FILE, resolver), args.copies)
    if args.records:
        records = records[:args.records]
    series = series_of(records, resolver)
    reference = neighbour_pairs(series)
    references = {"records": len(records), "neighbour": len(reference), "interval": len(interval_pairs(series)),
                  "asof": len(asof_pairs(series))}
    encoded = workload.messages(records, MACHINE_DATA.partitions)
    orders = {name: workload.INTERLEAVINGS[name](records) for name in ("time order", args.interleaving)}
    orders[DISORDERED] = workload.bounded_disorder(records, args.disorder_s, args.seed)
    late = [ms for ms in workload.lateness_ms(records, orders[DISORDERED]) if ms > 0]
    log.info("disordered input: %d of %d records arrive behind a newer record of their series, by up to %.0f ms",
             len(late), len(records), max(late, default=0))
    backlog = {name: [encoded[index] for index in order] for name, order in orders.items()}

    steady_records = [records[index] for index in orders["time order"][:int(args.rate * args.live_s)]]
    warm = warm_up_records(int(min(record["phenomenonTime"] for record in records)))
    warm_messages = workload.messages(warm, MACHINE_DATA.partitions)
    warm_pairs = neighbour_pairs(series_of(warm, resolver))
    # Each backlog run reads the warm-up first; its pairs are left out of the comparison and the figures.
    inputs = {name: run_input([*warm, *records], resolver, reference | warm_pairs, [*warm_messages, *encoded],
                              args.disorder_s if name == DISORDERED else 0.0) for name in orders}
    live_reference = neighbour_pairs(series_of(steady_records, resolver))
    steady_messages = workload.messages(steady_records, MACHINE_DATA.partitions)
    live_input = run_input([*warm, *steady_records], resolver, live_reference | warm_pairs,
                           [*warm_messages, *steady_messages])

    workdir = Path(tempfile.mkdtemp(prefix="join-peers-"))
    results: dict[str, dict[str, RunResult]] = {}

    failures: dict[str, str] = {}

    def measure(peer: Peer, first_round: bool) -> None:
        """The first round: every run of the peer; later rounds: the time-order backlog again."""
        try:
            if not first_round:
                if peer.name in results:
                    again = backlog_run(peer, bootstrap, warm_messages, backlog["time order"], inputs["time order"],
                                        reference, args.settle_s, 900)
                    log.info("%s, time order again: %s", peer.name, again.comparison)
                    results[peer.name]["time order"].rounds.append(again.records_per_s)
                return
            runs: dict[str, RunResult] = {}
            # The other interleaving first: the figures of the time-order run are then of a peer whose process (for
            # Spark, the session's JVM) has run a query before.
            for name in (args.interleaving, "time order", DISORDERED):
                runs[name] = backlog_run(peer, bootstrap, warm_messages, backlog[name], inputs[name], reference,
                                         args.settle_s, 900)
                log.info("%s, %s: %s", peer.name, name, runs[name].comparison)
            runs["time order"].rounds.append(runs["time order"].records_per_s)
            runs["live"] = live_run(peer, bootstrap, warm_messages, steady_messages, steady_records, live_input,
                                    live_reference, args.rate, args.settle_s)
            log.info("%s, live: %s", peer.name, runs["live"].comparison)
            results[peer.name] = runs
        except Exception as error:  # noqa: BLE001 - one peer's failure is its result; the others still run
            log.exception("%s failed", peer.name)
            failures[peer.name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            results.pop(peer.name, None)

    specs = resolver.specs
    subprocess_peer = functools.partial(SubprocessPeer, bootstrap=bootstrap, workdir=workdir, specs=specs,
                                        commit_interval_s=KafkaJoinerSettings.commit_interval_ms / 1000)
    flink = {"connector_jar": str(venvs.flink_connector_jar()) if "e" in args.peers else "",
             "checkpoint_interval_ms": args.flink_checkpoint_ms, "parallelism": os.cpu_count() or 1}
    # (letter, the peer made with the Spark session, or None for the others)
    makers: list[tuple[str, Callable]] = []
    if "a" in args.peers:
        makers.append(("a", lambda spark: SparkJoinerPeer(spark, bootstrap, workdir, args.batch, args.trigger_s)))
    if "b" in args.peers:
        makers.append(("b", lambda spark: SparkIntervalPeer(spark, bootstrap, workdir, args.batch, args.trigger_s,
                                                            watermark_s=args.watermark_s,
                                                            resolver=resolver)))
    if "c" in args.peers:
        makers.append(("c", lambda _: KafkaJoinerPeer(KafkaSettings(kafka_bootstrap_servers=bootstrap), max_s=60,
                                                      workdir=workdir)))
    if "d" in args.peers:
        makers.append(("d", lambda _: subprocess_peer("(d) Quix Streams join_asof", "quix",
                                                      "benchmarks.peers.quix_asof", count_joinable=True)))
    if "e" in args.peers:
        for mode in ("interval", "temporal"):
            makers.append(("e", lambda _, mode=mode: subprocess_peer(
                f"(e) Flink SQL {mode} join", "flink", "benchmarks.peers.flink_sql",
                options={**flink, "mode": mode}, runs_to_end=True)))
    if "f" in args.peers:
        for mode, label in (("backward", "backward"), ("both", "both ways")):
            makers.append(("f", lambda _, mode=mode, label=label: subprocess_peer(
                f"(f) Pathway asof_join {label}", "pathway", "benchmarks.peers.pathway_asof", options={"mode": mode})))
    spark = None
    try:
        for round_index in range(args.rounds):
            for letter, make in (makers if round_index % 2 == 0 else list(reversed(makers))):
                if letter in "ab" and spark is None:
                    spark = spark_session("local[*]", driver_memory="2g")
                elif letter not in "ab" and spark is not None:
                    spark.stop()  # its JVM would share the cores with the peers below
                    spark = None
                measure(make(spark), first_round=round_index == 0)
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print_table(results, args.interleaving, args, references)
    for name, failure in failures.items():
        print(f"{name}: FAILED, {failure}")
    if failures:  # a table without a peer would read as the whole comparison
        return 1
    record_figures(recorded, results, args.interleaving, references)
    recorded.write()
    return 0

if __name__ == "__main__":
    sys.exit(main())
