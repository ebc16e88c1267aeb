"""``python -m benchmarks.spark_joiner``: the Spark joiner's throughput and latency, against the previous code,
the standalone joiner beside it.

1. Throughput: pre-load N synthetic records (speed and torque of axis C11, per machine) into a fresh
   topic, then run the join query with large micro-batches; records/s and joins/s from Spark's own
   batch durations (the sink's Kafka transaction included), for 100 and for 10,000 machines. Each
   machine count runs three times on the same topic, each run in a fresh process (its own JVM, cold as a job
   starts): the previous code (``benchmarks.spark_joiner_baseline``: the router and the output records
   in Python per record), the job, and the job's ceiling, a pass-through (the job's Kafka source and
   transactional sink, same settings and session, no join: each record written unchanged); the ratios of
   the job to each are printed.
2. Latency, in the JVM the job's first run has warmed up (as a job that has run for a while): a steady
   input rate (default 10k records/s) with a sub-second trigger; for every join, the time from the Kafka
   append of the later of its two inputs to the moment a read_committed consumer sees it; p50/p99.
3. The standalone joiner (``kafka_joiner``) on the same pre-loaded topics.
4. Spark's Kafka source alone on the first pre-loaded topic, in that warmed-up JVM too: into Spark's
   no-op sink, directly and through a Python step that only counts rows. The share of the job's cost that
   is reading Kafka and crossing into Python; the rest is the join, its output records and the sink.

Topics are unique per run and deleted afterwards; checkpoints go to a temporary folder.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, Producer
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import LongType, StructField, StructType

from pipeline_core.kafka_clients import admin_client, consumer_config, produce, producer_config
from pipeline_core.logs import configure_logging
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import encode_record, record_key
from pipeline_core.runtime import tune_gc_for_streaming
from pipeline_core.settings import KafkaSettings
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics, partition_count

from spark_joiner.job import CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_CHECKPOINTS, is_local_path, kafka_source, start_query
from spark_joiner.bucket_join import EMITTED_ARROW_SCHEMA, OUT
from spark_joiner.processor import OUTPUT_SCHEMA
from spark_joiner.session import spark_session
from spark_joiner.settings import SparkJoinerSettings
from spark_joiner.sink import TransactionalBatchSink

from benchmarks.ceiling import SPARK_TARGET, Run, ratio, ratio_line, verdict
from benchmarks.results import Results, at_least, at_most
from benchmarks.spark_joiner_baseline import start_baseline_query

log = logging.getLogger("benchmarks.spark_joiner")

START_MS = 1_700_000_000_000
STEP_MS = 10  # per machine and stream: 100 samples/s
SPEED, TORQUE = "actSpeed_C11", "vaTorque_C11"


@dataclasses.dataclass(frozen=True)
class Topics:
    data: str
    out: str
    dlq: str


def make_topics(bootstrap: str, label: str) -> Topics:
    suffix = f"bench.{label}.{uuid.uuid4().hex[:8]}"
    specs = [dataclasses.replace(spec, name=f"{spec.name}.{suffix}") for spec in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)]
    ensure_topics(admin_client(bootstrap), tuple(specs))
    return Topics(*(spec.name for spec in specs))


def delete_topics(bootstrap: str, names: list[str]) -> None:
    if names:
        admin = admin_client(bootstrap)  # kept alive until every deletion answered
        for future in admin.delete_topics(names, operation_timeout=30).values():
            try:
                future.result(30)
            except Exception as error:  # cleanup must not hide the figures
                log.warning("could not delete a bench topic: %s", error)


def synthetic_records(machines: int, total: int, seed: int = 1) -> list[bytes]:
    """`total` records: per machine, speed and torque samples every 10 ms, torque 3 ms after speed."""
    rng = np.random.default_rng(seed)
    per_stream = max(1, total // (2 * machines))
    speeds = rng.uniform(100, 3000, (machines, per_stream)).round(1)
    torques = rng.uniform(-20, 20, (machines, per_stream)).round(2)
    payloads: list[bytes] = []
    for step in range(per_stream):
        t = START_MS + step * STEP_MS
        for machine in range(machines):
            thing = f"M{machine:05d}"
            payloads.append(encode_record({"thing": thing, "quantity": SPEED, "phenomenonTime": t,
                                           "result": float(speeds[machine, step])}))
            payloads.append(encode_record({"thing": thing, "quantity": TORQUE, "phenomenonTime": t + 3,
                                           "result": float(torques[machine, step])}))
    return payloads


def preload(bootstrap: str, topic: str, payloads: list[bytes], keys: list[bytes]) -> None:
    """Produce the records, each to the partition of its thing, as the stream connector writes them."""
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 50, "batch.size": 1_000_000,
                                                      "queue.buffering.max.messages": 2_000_000}))
    partitions = partition_count(admin_client(bootstrap), topic)
    for payload, key in zip(payloads, keys):
        thing = key.split(b".", 1)[0].decode()
        produce(producer, topic, payload, key, partition=thing_partition(thing, partitions))
    if producer.flush(120):
        raise RuntimeError("pre-load did not complete")


def keys_of(machines: int, count: int) -> list[bytes]:
    pair = [[record_key(f"M{m:05d}", SPEED).encode(), record_key(f"M{m:05d}", TORQUE).encode()]
            for m in range(machines)]
    flat = [key for both in pair for key in both]
    return (flat * (count // len(flat) + 1))[:count]


CPU_KINDS = ("driver", "JVM", "Python workers")
# The job's records/s after the first batch at the most machines, as a share of its rate at the fewest: a plant
# of many machines, each sending a few records per batch, should cost about what a few busy machines cost.
SCALING_TARGET = 0.6
STEADY_RATE_TARGET = 100_000  # records/s after the first batch, at the fewest machines
FIRST_BATCH_TARGET_S = 3.8  # a cold job's first batch: half of the 7.6 s it took before its start was worked on
LATENCY_P99_TARGET_S = 1.0


def cpu_seconds_by_kind(root: int | None = None) -> dict[str, float]:
    """CPU seconds used so far by this process (the driver), its JVM and the JVM's Python workers, from /proc:
    figures that other load on the machine does not inflate, unlike wall-clock rates."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        name, fields = stat.split("(", 1)[1].rsplit(")", 1)[0], stat.rsplit(")", 1)[1].split()
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        names[pid] = name
        # utime, stime, and those of its children already waited for (the workers a daemon forked)
        times[pid] = sum(int(value) for value in fields[11:15]) / tick
    root = root or os.getpid()
    by_kind = dict.fromkeys(CPU_KINDS, 0.0)
    pending = [root]
    while pending:
        pid = pending.pop()
        kind = "driver" if pid == root else "JVM" if names.get(pid) == "java" else "Python workers"
        by_kind[kind] += times.get(pid, 0.0)
        pending.extend(children.get(pid, ()))
    return by_kind


def settings_for(bootstrap: str, topics: Topics, checkpoint: Path, **overrides) -> SparkJoinerSettings:
    return SparkJoinerSettings(kafka_bootstrap_servers=bootstrap, input_topic=topics.data, output_topic=topics.out,
                               dlq_topic=topics.dlq, checkpoint_dir=checkpoint, **overrides)


def emit_unchanged(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` step that hands every input record on unchanged, for machine.out, in the form the job's
    processor emits its records (``OUTPUT_SCHEMA``: per Arrow batch one row, its records as an Arrow IPC batch
    of kind, key and value), which the sink takes. The source's rows carry no key (the job derives it), so
    the records go without one."""
    for batch in batches:
        rows = batch.num_rows
        emitted = pa.RecordBatch.from_arrays([pa.array(np.full(rows, OUT, np.int8)), pa.nulls(rows, pa.string()),
                                              batch.column("value").cast(pa.binary())], schema=EMITTED_ARROW_SCHEMA)
        yield pa.RecordBatch.from_arrays([pa.array([emitted.serialize().to_pybytes()], pa.binary())],
                                         names=["records"])


def start_passthrough_query(spark, settings: SparkJoinerSettings, sink: TransactionalBatchSink) -> StreamingQuery:
    """The job's ceiling: its Kafka source and its transactional sink with no join in between (no routing,
    no shuffle, no state), started as the job starts (same settings, checkpoint files and trigger)."""
    sink.resume(settings.input_topic, str(settings.checkpoint_dir))  # fresh topics: nothing committed to skip
    if is_local_path(str(settings.checkpoint_dir)):
        spark.conf.set(CHECKPOINT_FILE_MANAGER, FILE_SYSTEM_CHECKPOINTS)
    return (kafka_source(spark, settings).mapInArrow(emit_unchanged, OUTPUT_SCHEMA).writeStream
            .foreachBatch(sink).option("checkpointLocation", str(settings.checkpoint_dir))
            .trigger(processingTime=f"{int(settings.trigger_s * 1000)} milliseconds").start())


# The job against the code before it and against its ceiling, each started by the same settings and sink.
JOBS = {"previous": start_baseline_query, "job": start_query, "pass-through": start_passthrough_query}


def run_throughput(spark, bootstrap: str, topics: Topics, records: int, workdir: Path, batch: int,
                   job: str) -> dict:
    """One job on the pre-loaded ``topics.data``, into output topics of its own, until it has read ``records``."""
    out = make_topics(bootstrap, f"out.{job}")
    settings = dataclasses.replace(settings_for(bootstrap, topics, workdir / f"checkpoint-{job}", trigger_s=0.0,
                                                max_offsets_per_trigger=batch), output_topic=out.out, dlq_topic=out.dlq)
    sink = TransactionalBatchSink(bootstrap, out.out, out.dlq, f"bench.{uuid.uuid4().hex[:8]}")
    cpu_before = cpu_seconds_by_kind()
    query = JOBS[job](spark, settings, sink)
    try:
        figures = run_to_end(query, records, cpu_before)
    finally:
        stop_between_batches(query)
        sink.close()
    state = settings.checkpoint_dir / "state"
    figures.update(state_bytes=sum(path.stat().st_size for path in state.rglob("*") if path.is_file()),
                   joins=sink.counters.joins, joins_per_s=sink.counters.joins / figures["seconds"],
                   sink_compute_s=round(sink.counters.compute_seconds, 2),
                   sink_produce_s=round(sink.counters.produce_seconds, 2), topics=dataclasses.astuple(out))
    return figures


def preload_machines(bootstrap: str, machines: int, records: int, cleanup: list[str]) -> tuple[Topics, int]:
    """A fresh input topic with ``records`` synthetic records of ``machines`` machines; returns it and the count."""
    topics = make_topics(bootstrap, f"m{machines}")
    cleanup.extend(dataclasses.astuple(topics))
    payloads = synthetic_records(machines, records)
    began = time.monotonic()
    preload(bootstrap, topics.data, payloads, keys_of(machines, len(payloads)))
    log.info("pre-loaded %d records for %d machines in %.1f s", len(payloads), machines, time.monotonic() - began)
    return topics, len(payloads)


def run_to_end(query: StreamingQuery, records: int, cpu_before: dict[str, float]) -> dict:
    """Wait until ``query`` has read ``records`` input rows; its rates from Spark's own batch durations, and the
    CPU this process tree spent since ``cpu_before``, in all and, after the first batch, per kind of process."""
    after_first: dict[str, float] | None = None
    while sum(p["numInputRows"] for p in query.recentProgress) < records:
        if query.exception() is not None:
            raise RuntimeError(f"query failed: {query.exception()}")
        query.awaitTermination(0.5)
        if after_first is None and any(p["numInputRows"] for p in query.recentProgress):
            after_first = cpu_seconds_by_kind()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    cpu_after = cpu_seconds_by_kind()
    seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    rows = [p["numInputRows"] for p in progress]
    steady_rows, steady_seconds = (sum(rows[1:]), sum(seconds[1:])) if len(rows) > 1 else (rows[0], seconds[0])
    steady_cpu = {kind: (cpu_after[kind] - (after_first or cpu_before)[kind]) / steady_rows * 1e6 for kind in CPU_KINDS}
    return {"records": records, "batches": len(rows), "seconds": sum(seconds), "records_per_s": sum(rows) / sum(seconds),
            "steady_records_per_s": steady_rows / steady_seconds, "first_batch_s": seconds[0],
            # Of it, the planning: for the job, Spark asks the stateful processor for its state schemas in a Python
            # process of its own, started cold.
            "first_batch_planning_s": progress[0]["durationMs"].get("queryPlanning", 0) / 1000,
            "batch_seconds": [round(second, 2) for second in seconds],
            "cpu_us_per_record": (sum(cpu_after.values()) - sum(cpu_before.values())) / records * 1e6,
            "steady_cpu_us_per_record": steady_cpu, "load_average": os.getloadavg()[0]}


# What the source-only runs' Python step returns: the size of each Arrow batch it was handed.
COUNT_ARROW_SCHEMA = pa.schema([pa.field("rows", pa.int64())])
COUNT_SCHEMA = StructType([StructField("rows", LongType())])


def count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` step that does nothing but cross into Python: one row with each batch's size."""
    for batch in batches:
        yield pa.RecordBatch.from_arrays([pa.array([batch.num_rows], pa.int64())], schema=COUNT_ARROW_SCHEMA)


def run_source_floor(spark, bootstrap: str, topics: Topics, records: int, batch: int, python_step: bool,
                     workdir: Path) -> dict:
    """Spark's Kafka source on the pre-loaded input, read as the job reads it, into Spark's no-op sink with
    no join and no output; optionally through a Python step that only counts rows. What the job pays before
    its own work, on the same input and batch size; the job's figures cannot exceed it."""
    settings = settings_for(bootstrap, topics, workdir / f"floor-{python_step}", max_offsets_per_trigger=batch)
    rows = kafka_source(spark, settings)
    if python_step:
        rows = rows.mapInArrow(count_rows, COUNT_SCHEMA)
    cpu_before = cpu_seconds_by_kind()
    query = (rows.writeStream.format("noop").option("checkpointLocation", str(settings.checkpoint_dir))
             .trigger(processingTime="0 seconds").start())
    try:
        return run_to_end(query, records, cpu_before)
    finally:
        stop_between_batches(query)


def stop_between_batches(query: StreamingQuery, deadline_s: float = 30.0) -> None:
    """Stop the query while no batch runs: a batch stopped midway interrupts its sink call, which Spark and
    py4j report with long (harmless) stack traces."""
    deadline = time.monotonic() + deadline_s
    while query.status["isTriggerActive"] and time.monotonic() < deadline:
        query.awaitTermination(0.02)
    query.stop()


def run_latency(spark, bootstrap: str, machines: int, rate: int, duration_s: float, trigger_s: float,
                workdir: Path, cleanup: list[str]) -> dict:
    topics = make_topics(bootstrap, "latency")
    cleanup.extend(dataclasses.astuple(topics))
    settings = settings_for(bootstrap, topics, workdir / "checkpoint-latency", trigger_s=trigger_s,
                            max_offsets_per_trigger=0)
    sink = TransactionalBatchSink(bootstrap, topics.out, topics.dlq, f"bench.{uuid.uuid4().hex[:8]}")
    query = start_query(spark, settings, sink)
    appended: dict[tuple[str, str, int], float] = {}
    seen: list[tuple[bytes, float]] = []
    stop = threading.Event()
    consumer = Consumer(consumer_config(bootstrap, f"bench.{uuid.uuid4().hex[:8]}"))
    consumer.subscribe([topics.out])

    def consume() -> None:
        while not stop.is_set():
            for message in consumer.consume(10_000, 0.05):
                if not message.error():
                    seen.append((message.value(), time.time()))

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    try:
        # Warm-up: the first stateful batch starts the Python workers; do not count it.
        warm = synthetic_records(machines, 2 * machines, seed=3)
        preload(bootstrap, topics.data, warm, keys_of(machines, len(warm)))
        while sink.counters.batches < 1:
            query.awaitTermination(0.2)
        produce_steady(bootstrap, topics.data, machines, rate, duration_s, appended)
        expected = len(appended) - 2 * machines
        deadline = time.monotonic() + 60
        while sink.counters.joins < expected * 0.95 and time.monotonic() < deadline:
            query.awaitTermination(0.5)
        deadline = time.monotonic() + 10
        while len(seen) < sink.counters.joins and time.monotonic() < deadline:
            query.awaitTermination(0.05)  # the reader catches up with the last committed batch
    finally:
        stop.set()
        reader.join(5)
        consumer.close()
        busy = [p for p in query.recentProgress if p["numInputRows"]]
        batches = [p["durationMs"]["triggerExecution"] / 1000 for p in busy]
        phases = {phase: round(float(np.mean([p["durationMs"].get(phase, 0) for p in busy])) / 1000, 2)
                  for phase in (busy[0]["durationMs"] if busy else ())}
        log.info("latency run: %d batches, mean seconds per phase %s, mean input rows %.0f; in the sink %.2f s "
                 "computing and %.2f s producing per batch", len(busy), phases,
                 np.mean([p["numInputRows"] for p in busy]) if busy else 0,
                 sink.counters.compute_seconds / max(sink.counters.batches, 1),
                 sink.counters.produce_seconds / max(sink.counters.batches, 1))
        stop_between_batches(query)
        sink.close()
    latencies = []
    for value, received in seen:
        record = json.loads(value)
        inputs = [appended.get((record["thing"], side["quantity"], side["phenomenonTime"]))
                  for side in (record["left"], record["right"])]
        if None not in inputs:
            latencies.append(received - max(inputs))
    values = np.array(latencies)
    return {"joins": len(values), "p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)),
            "max": float(values.max()), "rate": rate, "load_average": os.getloadavg()[0],
            "batches": len(batches), "mean_batch_s": float(np.mean(batches)) if batches else float("nan")}


def produce_steady(bootstrap: str, topic: str, machines: int, rate: int, duration_s: float,
                   appended: dict) -> None:
    """Produce at `rate` records/s for `duration_s`, remembering each record's append time."""
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 5}))
    partitions = partition_count(admin_client(bootstrap), topic)
    start = time.monotonic()
    step = 1
    sent = 0
    while time.monotonic() - start < duration_s:
        t = START_MS + step * STEP_MS
        for machine in range(machines):
            thing = f"M{machine:05d}"
            for quantity, moment in ((SPEED, t), (TORQUE, t + 3)):
                producer.produce(topic, encode_record({"thing": thing, "quantity": quantity, "phenomenonTime": moment,
                                                       "result": 1.0 + (sent % 97)}), record_key(thing, quantity),
                                 partition=thing_partition(thing, partitions))
                appended[(thing, quantity, moment)] = time.time()
                sent += 1
        producer.poll(0)
        step += 1
        ahead = sent / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)  # pacing the input rate
    producer.flush(30)


# The standalone joiner's output: waited for this long at first, then done once none came for STANDALONE_IDLE_S.
STANDALONE_START_S = 120.0
STANDALONE_IDLE_S = 15.0


def run_standalone(bootstrap: str, topics: Topics, records: int, cleanup: list[str]) -> dict:
    """The standalone joiner on the same pre-loaded input: records/s from its first to its last output."""
    out = make_topics(bootstrap, "standalone")
    cleanup.extend(dataclasses.astuple(out))
    group = f"bench-standalone.{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "kafka_joiner", "--kafka-bootstrap-servers", bootstrap,
               "--input-topic", topics.data, "--output-topic", out.out, "--dlq-topic", out.dlq,
               "--group-id", group, "--transactional-id-prefix", group, "--input-partitioned-by-thing"]
    consumer = Consumer(consumer_config(bootstrap, f"{group}.reader"))
    consumer.subscribe([out.out])
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    count, first, last = 0, None, None
    # The joiner's start (imports, group join, the first transaction) may take longer than the idle time on a
    # loaded machine: its first output is waited for longer, else the run ends before it and prints nan.
    idle_since, idle_s = time.monotonic(), STANDALONE_START_S
    try:
        while time.monotonic() - idle_since < idle_s:
            messages = [m for m in consumer.consume(10_000, 0.5) if not m.error()]
            if messages:
                now = time.monotonic()
                first = first or now
                last = now
                count += len(messages)
                idle_since, idle_s = now, STANDALONE_IDLE_S
            elif process.poll() is not None:
                raise RuntimeError(f"the standalone joiner exited with {process.returncode}")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
        consumer.close()
        cleanup.extend(name for name in admin_client(bootstrap).list_topics(timeout=10).topics
                       if name.startswith(f"{group}."))
    if not count:
        raise RuntimeError(f"the standalone joiner wrote no output within {STANDALONE_START_S:.0f} s")
    seconds = (last - first) if first and last and last > first else float("nan")
    return {"joins": count, "seconds": seconds, "records_per_s": records / seconds, "joins_per_s": count / seconds}


_FIGURES = "FIGURES "  # the child's answer on its stdout, where Spark's Python workers may print too


def in_fresh_process(task: dict) -> dict:
    """Run one measurement (``run_task``) in a new Python process, so each job starts with a cold JVM as it
    does in production, and no run inherits the JIT work of another."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.spark_joiner", "--task", json.dumps(task)],
                          stdout=subprocess.PIPE, text=True, check=True)
    figures = [line for line in done.stdout.splitlines() if line.startswith(_FIGURES)]
    return json.loads(figures[-1][len(_FIGURES):])


def run_task(task: dict) -> dict:
    """The child's side of ``in_fresh_process``: its own Spark session, one job run, and after it, if asked,
    the source-only runs and the latency run."""
    spark = spark_session(task["master"], shuffle_partitions=task["shuffle_partitions"], driver_memory="2g",
                          quick_jit=not task["full_jit"])
    tune_gc_for_streaming()  # as `python -m spark_joiner` runs
    workdir = Path(task["workdir"])
    cleanup: list[str] = []
    try:
        topics = Topics(*task["topics"])
        figures = run_throughput(spark, task["bootstrap"], topics, task["records"], workdir, task["batch"], task["job"])
        # In the JVM the job has warmed up, as a job that has run for a while: the source alone, and latency.
        if task["floor"]:
            figures["floors"] = [(label, run_source_floor(spark, task["bootstrap"], topics, task["records"],
                                                          task["batch"], python_step, workdir))
                                 for label, python_step in (("source -> no-op sink", False),
                                                            ("source -> Python step -> no-op sink", True))]
        if task["latency"]:
            figures["latency"] = run_latency(spark, task["bootstrap"], 100, task["rate"], task["latency_s"],
                                             task["trigger_s"], workdir, cleanup)
        return figures
    finally:
        spark.stop()
        delete_topics(task["bootstrap"], cleanup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_joiner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # KafkaSettings' default: KAFKA_BOOTSTRAP_SERVERS, else this host's KAFKA_PORT, as every stage takes it.
    parser.add_argument("--kafka-bootstrap-servers",
                        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", KafkaSettings.kafka_bootstrap_servers))
    parser.add_argument("--records", type=int, default=1_000_000, help="pre-loaded records per machine count")
    parser.add_argument("--machines", type=int, nargs="+", default=[100, 100_000],
                        help="machine counts of the throughput runs (the first one's job run is followed by the "
                             "source-only runs and the latency run)")
    parser.add_argument("--batch", type=int, default=250_000,
                        help="maxOffsetsPerTrigger of the throughput runs (the first batch, with the warm-up, is reported apart)")
    parser.add_argument("--rate", type=int, default=10_000, help="records/s of the latency run")
    parser.add_argument("--latency-s", type=float, default=30.0)
    parser.add_argument("--trigger-s", type=float, default=SparkJoinerSettings.trigger_s,
                        help="trigger of the latency run (the job's default)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--shuffle-partitions", type=int, default=SparkJoinerSettings.shuffle_partitions,
                        help="state partitions of the job (the joiner's default unless given)")
    parser.add_argument("--full-jit", action="store_true",
                        help="let the JVM use its optimising compiler too (the job runs with C1 only)")
    parser.add_argument("--no-previous", action="store_true", help="skip the previous code's runs")
    parser.add_argument("--no-standalone", action="store_true", help="skip the standalone joiner's figures")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip the pass-through runs (the Kafka source and the sink with no join)")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency run")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip the runs of Spark's Kafka source alone (no join, no output)")
    parser.add_argument("--task", help=argparse.SUPPRESS)  # one measurement, run by in_fresh_process
    args = parser.parse_args(argv)
    configure_logging()
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.task:
        print(_FIGURES + json.dumps(run_task(json.loads(args.task))), flush=True)
        return 0
    recorded = Results("spark_joiner", argv)  # a --task child above is one measurement of this run, never recorded
    bootstrap = args.kafka_bootstrap_servers
    workdir = Path(tempfile.mkdtemp(prefix="spark-joiner-bench-"))
    cleanup: list[str] = []
    results: list[tuple[int, dict[str, dict], dict | None]] = []
    floors: list[tuple[str, dict]] = []  # Spark's Kafka source alone, on the first machine count's input
    floor_machines = 0
    common = {"bootstrap": bootstrap, "master": args.master, "shuffle_partitions": args.shuffle_partitions,
              "full_jit": args.full_jit}
    skipped = {"previous"} if args.no_previous else set()
    if args.no_ceiling:
        skipped.add("pass-through")
    jobs = [job for job in JOBS if job not in skipped]
    latency: dict | None = None
    try:
        for index, machines in enumerate(args.machines):
            topics, records = preload_machines(bootstrap, machines, args.records, cleanup)
            runs = {}
            for job in jobs:
                first_job_run = job == "job" and index == 0
                figures = in_fresh_process({
                    **common, "job": job, "topics": dataclasses.astuple(topics), "records": records,
                    "batch": args.batch, "workdir": str(workdir / f"m{machines}-{job}"),
                    "floor": first_job_run and not args.no_floor, "latency": first_job_run and not args.no_latency,
                    "rate": args.rate, "latency_s": args.latency_s, "trigger_s": args.trigger_s})
                cleanup.extend(figures.pop("topics"))
                if "floors" in figures:
                    floors, floor_machines = figures.pop("floors"), machines
                latency = figures.pop("latency", latency)
                log.info("spark, %d machines, %s: %s", machines, job, figures)
                runs[job] = figures
            standalone = None if args.no_standalone else run_standalone(bootstrap, topics, records, cleanup)
            results.append((machines, runs, standalone))
    finally:
        delete_topics(bootstrap, sorted(set(cleanup)))
        shutil.rmtree(workdir, ignore_errors=True)
    print_figures(args, results, floors, floor_machines, latency)
    record_figures(recorded, results, floors, latency)
    recorded.write()
    return 0


def ceiling_line(job: dict, pass_through: dict) -> str:
    """The job against its pass-through (one run each, the same input and session): records/s, after the first
    batch too, and CPU per record."""
    as_run = [Run(figures["records"], figures["seconds"], figures["cpu_us_per_record"] * figures["records"] / 1e6)
              for figures in (job, pass_through)]
    steady = job["steady_records_per_s"] / pass_through["steady_records_per_s"]
    job_cpu, ceiling_cpu = (sum(figures["steady_cpu_us_per_record"].values()) for figures in (job, pass_through))
    return (ratio_line("job / pass-through", ratio(as_run[:1], as_run[1:]), SPARK_TARGET)
            + f"; after the first batch {steady:.2f} ({verdict(steady, SPARK_TARGET)}), "
              f"CPU per record {job_cpu:.1f} µs against {ceiling_cpu:.1f} µs ({ceiling_cpu / job_cpu:.2f})")


def print_scaling(results: list[tuple[int, dict[str, dict], dict | None]]) -> None:
    """The job's cost in machines: its records/s after the first batch at the most machines against the fewest
    (target SCALING_TARGET) and against the standalone joiner there; its checkpoint's state per machine."""
    runs = [(machines, runs["job"], standalone) for machines, runs, standalone in results if "job" in runs]
    for machines, job, _ in runs:
        print(f"{machines:9,d}  checkpoint state on disk after the run: {job['state_bytes'] / machines:,.0f} bytes "
              f"per machine ({job['state_bytes'] / 1e6:,.1f} MB)")
    if len(runs) < 2:
        return
    (fewest, small, _), (most, large, standalone) = min(runs, key=lambda run: run[0]), max(runs, key=lambda run: run[0])
    flat = large["steady_records_per_s"] / small["steady_records_per_s"]
    line = (f"{most:9,d}  job after the first batch: {flat:.2f} of its records/s at {fewest:,} machines "
            f"({verdict(flat, SCALING_TARGET)})")
    if standalone:
        against = large["steady_records_per_s"] / standalone["records_per_s"]
        line += f", {against:.2f}x the standalone joiner's at {most:,} ({verdict(against, 1.0)})"
    print(line)


def record_figures(recorded: Results, results: list[tuple[int, dict[str, dict], dict | None]],
                   floors: list[tuple[str, dict]], latency: dict | None) -> None:
    """The figures `print_figures` shows, recorded: per machine count the job's rates, first batch and CPU, against
    its pass-through, the previous code and the standalone joiner; its cost in machines; the source alone; latency."""
    fewest = min((machines for machines, _, _ in results), default=0)
    for machines, runs, standalone in results:
        at = f"{machines:,} machines"
        for job, figures in runs.items():
            recorded.add(f"{at}, {job}", figures["records_per_s"], "records/s")
            recorded.add(f"{at}, {job}, after the first batch", figures["steady_records_per_s"], "records/s",
                         at_least(STEADY_RATE_TARGET) if job == "job" and machines == fewest else None)
            recorded.add(f"{at}, {job}, first batch from a cold start", figures["first_batch_s"], "s",
                         at_most(FIRST_BATCH_TARGET_S) if job == "job" else None)
            recorded.add(f"{at}, {job}, CPU per record after the first batch",
                         sum(figures["steady_cpu_us_per_record"].values()), "µs")
        job = runs.get("job")
        if job and "pass-through" in runs:
            through = runs["pass-through"]
            recorded.add(f"{at}, job / pass-through, after the first batch",
                         job["steady_records_per_s"] / through["steady_records_per_s"], "x")
            recorded.add(f"{at}, job / pass-through, by CPU per record after the first batch",
                         sum(through["steady_cpu_us_per_record"].values())
                         / sum(job["steady_cpu_us_per_record"].values()), "x", at_least(SPARK_TARGET))
        if job and "previous" in runs:
            recorded.add(f"{at}, job / previous code, after the first batch",
                         job["steady_records_per_s"] / runs["previous"]["steady_records_per_s"], "x")
        if job:
            recorded.add(f"{at}, checkpoint state on disk per machine", job["state_bytes"] / machines, "bytes")
        if job and standalone:
            recorded.add(f"{at}, standalone joiner on the same input", standalone["records_per_s"], "records/s")
            recorded.add(f"{at}, job after the first batch / standalone joiner",
                         job["steady_records_per_s"] / standalone["records_per_s"], "x",
                         at_least(1.0) if machines != fewest else None)
    jobs = [(machines, runs["job"]) for machines, runs, _ in results if "job" in runs]
    if len(jobs) > 1:
        (few, small), (most, large) = min(jobs, key=lambda run: run[0]), max(jobs, key=lambda run: run[0])
        recorded.add(f"job after the first batch, {most:,} machines / {few:,}",
                     large["steady_records_per_s"] / small["steady_records_per_s"], "x", at_least(SCALING_TARGET))
    for label, figures in floors:
        recorded.add(f"Spark's Kafka source alone: {label}, after the first batch", figures["steady_records_per_s"],
                     "records/s")
    if latency:
        at_rate = f"latency at {latency['rate']:,} records/s, 100 machines"
        recorded.add(f"{at_rate}, p50", latency["p50"], "s")
        recorded.add(f"{at_rate}, p99", latency["p99"], "s", at_most(LATENCY_P99_TARGET_S))
        recorded.add(f"{at_rate}, max", latency["max"], "s")


def print_figures(args: argparse.Namespace, results: list[tuple[int, dict[str, dict], dict | None]],
                  floors: list[tuple[str, dict]], floor_machines: int, latency: dict | None) -> None:
    print()
    print(f"Spark joiner ({args.master}), exactly once into machine.out; each run in a fresh process (JVM start"
          " included); 'previous': the same job with its router and output records in Python per record;"
          " 'pass-through': the job's ceiling, its Kafka source and sink with no join (each record written unchanged)")
    print(f"{'machines':>9} {'code':>12} {'records':>9} {'joins':>9} {'rec/s':>9} {'joins/s':>9} {'steady rec/s':>13}"
          f" {'1st batch s':>11} {'planning s':>10} {'CPU µs/rec':>10} {'load':>5}"
          f" | {'standalone rec/s':>16} {'joins/s':>9}")
    for machines, runs, standalone in results:
        for job, figures in runs.items():
            other = (f"{standalone['records_per_s']:16,.0f} {standalone['joins_per_s']:9,.0f}"
                     if standalone and job == "job" else f"{'-':>16} {'-':>9}")
            print(f"{machines:9,d} {job:>12} {figures['records']:9,d} {figures['joins']:9,d}"
                  f" {figures['records_per_s']:9,.0f} {figures['joins_per_s']:9,.0f}"
                  f" {figures['steady_records_per_s']:13,.0f} {figures['first_batch_s']:11.1f}"
                  f" {figures['first_batch_planning_s']:10.2f}"
                  f" {figures['cpu_us_per_record']:10.1f} {figures['load_average']:5.1f} | {other}")
        if "previous" in runs:
            job, previous = runs["job"], runs["previous"]
            print(f"{machines:9,d}  job / previous: {job['records_per_s'] / previous['records_per_s']:.2f}x records/s, "
                  f"{job['steady_records_per_s'] / previous['steady_records_per_s']:.2f}x after the first batch, "
                  f"{job['cpu_us_per_record'] / previous['cpu_us_per_record']:.2f}x the CPU per record")
        if "pass-through" in runs:
            print(f"{machines:9,d}  " + ceiling_line(runs["job"], runs["pass-through"]))
    print_scaling(results)
    print("CPU µs per record after the first batch, by process: where the job's time goes")
    print(f"{'machines':>9} {'code':>12} " + " ".join(f"{kind:>14}" for kind in CPU_KINDS) + f" {'all':>8}")
    for machines, runs, _ in results:
        for job, figures in runs.items():
            split = figures["steady_cpu_us_per_record"]
            print(f"{machines:9,d} {job:>12} " + " ".join(f"{split[kind]:14.1f}" for kind in CPU_KINDS)
                  + f" {sum(split.values()):8.1f}")
    if floors:
        print(f"Spark's Kafka source alone on the same input ({floor_machines:,} machines, same batches, JVM warmed up "
              "by the job), no join and no output: what the job pays before its own work")
        for label, figures in floors:
            print(f"{label:>36}: {figures['records_per_s']:9,.0f} rec/s, steady {figures['steady_records_per_s']:9,.0f},"
                  f" 1st batch {figures['first_batch_s']:4.1f} s, CPU µs/rec {figures['cpu_us_per_record']:5.1f}")
    if latency:
        print(f"latency at {latency['rate']:,} records/s, trigger {args.trigger_s} s, 100 machines: "
              f"p50 {latency['p50']:.2f} s, p99 {latency['p99']:.2f} s, max {latency['max']:.2f} s "
              f"over {latency['joins']:,} joins (Kafka append of the later input -> visible to read_committed), "
              f"{latency['batches']} batches of {latency['mean_batch_s']:.2f} s on average, "
              f"load {latency['load_average']:.1f}")
    print("planning s: of the first batch, Spark's query planning; CPU µs/rec: CPU time of the driver, its JVM and "
          "Python workers per input record, first batch included; load: 1-minute load average of the machine "
          "(2 cores) at the end of the run")


if __name__ == "__main__":
    sys.exit(main())
