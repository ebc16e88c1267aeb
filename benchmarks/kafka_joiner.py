"""Benchmark of the Kafka joiner at exactly-once: ``python -m benchmarks.kafka_joiner``.

1. Throughput: pre-load synthetic records (several machines, speed and torque interleaved) into a fresh
   copy of machine.data, then run joiner instances, each in its own process, from the first consumed
   record to the commit of the last output: joins/s and records/s. One row each for the input partitioned
   by thing with one and with two instances, and partitioned by key (repartitioned first) with one.
2. Latency: a steady input of `--rate` records/s produced by a separate process into a fresh topic with
   log-append timestamps; per output, the time from its completing record's append to the commit of the
   transaction that carries it: p50/p99.
3. The ceiling (before the latency run): the joiner, one process, against its pass-through
   (``benchmarks.passthrough``: the joiner's consumer, producer, transactions and loop with no join), on the
   same pre-loaded input in alternate rounds, for the shipped events replicated (the real mix) and for the
   synthetic input (every record joins): records/s, CPU per record, the ratio against its target, and the
   joiner's CPU per record by phase (``benchmarks.joiner_costs``).

Every run uses its own topics and consumer group, deleted afterwards.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import queue
import signal
import sys
import time
import uuid
from collections.abc import Iterator

from confluent_kafka import Producer

from pipeline_core.kafka_clients import admin_client, producer_config
from pipeline_core.kafka_clients import produce as produce_with_backpressure
from pipeline_core.logs import configure_logging
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import encode_record, record_key
from pipeline_core.runtime import tune_gc_for_streaming
from pipeline_core.settings import KafkaSettings, add_arguments, from_namespace
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics, partition_count
from pipeline_core.validation import DEFAULT_MAX_ROW_BYTES
from simulator.settings import DEFAULT_EVENTS_FILE
from stream_connector.rows import split_row

from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.specs import load_join_specs
from kafka_joiner.service import KafkaJoiner
from kafka_joiner.settings import KafkaJoinerSettings

from benchmarks.ceiling import RUN_HEADER, STANDALONE_TARGET, Run, cost_lines, ratio, ratio_line, run_line
from benchmarks.joiner_costs import phase_costs
from benchmarks.passthrough import PassThrough
from benchmarks.results import Results, at_least, at_most

log = logging.getLogger("benchmarks.kafka_joiner")

START_MS = 1_700_000_000_000
TICK_MS = 10  # speed at every tick, torque half a tick later: each record completes about one pair
JOINS_PER_S_TARGET = 50_000  # with two processes, input partitioned by thing, as `make up` runs
LATENCY_P99_TARGET_MS = 250.0  # at a steady --rate


def synthetic_records(count: int, machines: int, axes: int) -> Iterator[tuple[str, bytes, str]]:
    """(key, value, thing) of `count` records in time order: speed and torque of every machine and axis."""
    per_tick = machines * axes * 2
    # Formatted directly (the same compact JSON encode_record writes): generating 1M records stays quick.
    template = '{{"thing":"{}","quantity":"{}","phenomenonTime":{},"result":{!r}}}'
    for tick in range(count // per_tick):
        t = START_MS + tick * TICK_MS
        for machine in range(machines):
            thing = f"bench-{machine:03d}"
            for axis in range(11, 11 + axes):
                for quantity, offset, value in ((f"actSpeed_C{axis}", 0, 1000.0 + tick % 97),
                                                (f"vaTorque_C{axis}", TICK_MS // 2, 2.5 + tick % 13)):
                    yield (record_key(thing, quantity), template.format(thing, quantity, t + offset, value).encode(),
                           thing)


def expected_joins(count: int, machines: int, axes: int) -> int:
    """Alternating speed/torque at distinct times: each key's n + n records form 2n - 1 pairs."""
    keys = machines * axes
    ticks = count // (keys * 2)
    return keys * (2 * ticks - 1) if ticks else 0


def fresh_topics(bootstrap: str, append_time: bool) -> dict[str, str]:
    suffix = f"bench.{uuid.uuid4().hex[:8]}"
    data_config = dict(MACHINE_DATA.config, **({"message.timestamp.type": "LogAppendTime"} if append_time else {}))
    specs = (dataclasses.replace(MACHINE_DATA, name=f"{MACHINE_DATA.name}.{suffix}", config=data_config),
             dataclasses.replace(MACHINE_OUT, name=f"{MACHINE_OUT.name}.{suffix}"),
             dataclasses.replace(MACHINE_DLQ, name=f"{MACHINE_DLQ.name}.{suffix}"))
    ensure_topics(admin_client(bootstrap), specs)
    return {"data": specs[0].name, "out": specs[1].name, "dlq": specs[2].name, "group": f"kafka-joiner.{suffix}"}


def delete_topics(bootstrap: str, topics: dict[str, str]) -> None:
    admin = admin_client(bootstrap)
    names = [name for name in admin.list_topics(timeout=10).topics
             if name in topics.values() or name.startswith(topics["group"] + ".")]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(30)


def produce(bootstrap: str, topic: str, records: Iterator[tuple[str, bytes, str]], by_thing: bool,
            rate: float | None = None) -> int:
    """Produce the records (at `rate` per second if given) and wait for every acknowledgement; partitioned
    by thing as the stream connector writes them, or by key."""
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 20 if rate is None else 2,
                                                      "batch.size": 1_000_000,
                                                      "queue.buffering.max.messages": 2_000_000}))
    partitions = partition_count(admin_client(bootstrap), topic)

    def send(key: str, value: bytes, thing: str) -> None:
        if by_thing:
            produce_with_backpressure(producer, topic, value, key, partition=thing_partition(thing, partitions))
        else:
            produce_with_backpressure(producer, topic, value, key)

    count = 0
    if rate is not None:
        # The pace starts once the first record is acknowledged: until the connection and the idempotent
        # producer's id are set up, paced records would queue locally and reach the broker as one burst.
        first = next(records, None)
        if first is not None:
            send(*first)
            count = 1
        producer.flush(30)
    started = time.monotonic()
    for record in records:
        if rate is not None and count % 100 == 0:
            ahead = count / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        send(*record)
        producer.poll(0)
        count += 1
    if producer.flush(120):
        raise RuntimeError("input records not acknowledged")
    return count


def joiner_settings(connection: KafkaSettings, topics: dict[str, str], commit_interval_ms: int, by_thing: bool,
                    instance_id: str | None = None) -> KafkaJoinerSettings:
    return KafkaJoinerSettings(**dataclasses.asdict(connection), input_partitioned_by_thing=by_thing,
                               input_topic=topics["data"], output_topic=topics["out"], dlq_topic=topics["dlq"],
                               group_id=topics["group"], transactional_id_prefix=topics["group"],
                               instance_id=instance_id, commit_interval_ms=commit_interval_ms, progress_interval_s=5.0,
                               health_metrics=False)


@dataclasses.dataclass(frozen=True)
class InstanceResult:
    """What one joiner instance of a throughput run did; times are time.monotonic(), the same clock in
    every process."""

    first_record_at: float | None
    last_commit_at: float | None
    joins_out: int
    joined_in: int
    records_in: int
    transactions: int
    forced: int
    cpu_s: float


def _throughput_instance(settings: KafkaJoinerSettings, started: multiprocessing.synchronize.Barrier,
                         stop: multiprocessing.synchronize.Event, reports: multiprocessing.Queue,
                         pass_through: bool = False) -> None:
    """One joiner instance in its own process, as `python -m kafka_joiner` runs (or its pass-through, the
    same loop without the join): it reports its committed outputs and the records it read every 0.1 s, and its
    result once the parent says stop."""
    configure_logging("WARNING")
    tune_gc_for_streaming()
    joiner = PassThrough(settings) if pass_through else KafkaJoiner(settings)
    stats = joiner.stats
    cpu_before = time.process_time()
    next_report = 0.0

    def done(_joiner: KafkaJoiner) -> bool:
        nonlocal next_report
        now = time.monotonic()
        if now >= next_report:
            reports.put(("progress", settings.instance_id, (stats.first_record_at, stats.records_out,
                                                              stats.records_in)))
            next_report = now + 0.1
        return stop.is_set()

    # All instances join the group at once: the first does not take every partition, only to hand
    # some over in a rebalance a second later, when the others have imported their modules.
    started.wait(60)
    joiner.start()
    joiner.run(until=done)
    reports.put(("done", settings.instance_id, InstanceResult(
        stats.first_record_at, stats.last_commit_at, stats.records_out, stats.joined_in, stats.records_in,
        stats.transactions, joiner.forced(), time.process_time() - cpu_before)))


# Read all of its input with no output committed for this long, a run is over: what it has not written, it holds.
SETTLED_S = 1.0


def run_instances(settings: list[KafkaJoinerSettings], joins: int, max_s: float,
                  pass_through: bool = False, records: int | None = None) -> list[InstanceResult]:
    """Run one process per instance until together they committed `joins` outputs, or read `records` input records
    and committed nothing more for SETTLED_S (a join with a disorder bound holds its last pairs), or for at most
    `max_s` after the first record (`pass_through`: the joiner's pass-through instead)."""
    context = multiprocessing.get_context("spawn")
    started = context.Barrier(len(settings))
    stop = context.Event()
    reports = context.Queue()
    processes = [context.Process(target=_throughput_instance, args=(each, started, stop, reports, pass_through))
                 for each in settings]
    for process in processes:
        process.start()
    committed: dict[str, int] = {}
    read: dict[str, int] = {}
    first_record_at: float | None = None
    # Since when every input record was read and the committed outputs stood at this count.
    settled: tuple[float, int] | None = None
    results: dict[str, InstanceResult] = {}
    try:
        while len(results) < len(processes):
            try:
                kind, name, report = reports.get(timeout=1.0)
            except queue.Empty:
                if any(process.exitcode for process in processes):
                    raise RuntimeError("a joiner instance failed") from None
                continue
            if kind == "progress":
                first, committed[name], read[name] = report
                if first is not None:
                    first_record_at = first if first_record_at is None else min(first_record_at, first)
                now = time.monotonic()
                out_of_time = first_record_at is not None and now - first_record_at > max_s
                outputs = sum(committed.values())
                if records is not None and sum(read.values()) >= records:
                    settled = settled if settled and settled[1] == outputs else (now, outputs)
                held_only = settled is not None and now - settled[0] >= SETTLED_S
                if outputs >= joins or out_of_time or held_only:
                    stop.set()
            else:
                results[name] = report
    finally:
        stop.set()
        for process in processes:
            process.join(60)
    return list(results.values())


def throughput_row(connection: KafkaSettings, args: argparse.Namespace, by_thing: bool, instances: int,
                   recorded: Results) -> str:
    """Pre-load fresh topics and run `instances` joiner processes on them: one row of the table, and its figures."""
    bootstrap = connection.kafka_bootstrap_servers
    topics = fresh_topics(bootstrap, append_time=False)
    try:
        count = produce(bootstrap, topics["data"], synthetic_records(args.records, args.machines, args.axes),
                        by_thing)
        joins = expected_joins(count, args.machines, args.axes)
        settings = [joiner_settings(connection, topics, args.commit_interval_ms, by_thing, f"bench-{index}")
                    for index in range(instances)]
        results = run_instances(settings, joins, args.max_s)
    finally:
        delete_topics(bootstrap, topics)
    first = min(r.first_record_at for r in results if r.first_record_at is not None)
    last = max(r.last_commit_at for r in results if r.last_commit_at is not None)
    elapsed = last - first
    joins_out = sum(r.joins_out for r in results)
    joined_in = sum(r.joined_in for r in results)
    cpu_per_record = sum(r.cpu_s for r in results) / max(sum(r.records_in for r in results), 1) * 1e6
    label = "by thing, joined where it lies" if by_thing else "by key, repartitioned first"
    name = f"input {label}, {instances} process{'es' if instances > 1 else ''}"
    recorded.add(name, joins_out / elapsed, "joins/s",
                 at_least(JOINS_PER_S_TARGET) if by_thing and instances == 2 else None)
    recorded.add(f"{name}: CPU per record", cpu_per_record, "µs")
    row = (f"  {label:<32} {instances:>9} {joins_out:>10,} {elapsed:>8.1f} {joins_out / elapsed:>10,.0f} "
           f"{joined_in / elapsed:>10,.0f} {sum(r.transactions for r in results):>7,} {cpu_per_record:>13.0f}")
    if joins_out < joins:
        row += f"\n    (stopped after --max-s {args.max_s:.0f}: {joins_out:,} of {joins:,} joins)"
    forced = sum(r.forced for r in results)
    if forced:
        row += f"\n    WARNING: {forced:,} pending records were forced out: the streams of a key drifted apart"
    return row


def throughput(connection: KafkaSettings, args: argparse.Namespace, recorded: Results) -> None:
    print(f"throughput at exactly-once: {args.records:,} records pre-loaded ({args.machines} machines x "
          f"{args.axes} axes, one join per record), from the first record consumed to the last output committed")
    print(f"  {'input partitioned':<32} {'processes':>9} {'joins':>10} {'seconds':>8} {'joins/s':>10} "
          f"{'records/s':>10} {'commits':>7} {'CPU µs/record':>13}")
    for by_thing, instances in ((True, 1), (True, 2), (False, 1)):
        print(throughput_row(connection, args, by_thing, instances, recorded), flush=True)
    print("  (by thing is how `make up` runs: the stream connector writes every quantity of a machine to one "
          "partition;\n   CPU is the joiners' own, all threads; the broker shares the same cores)")


def real_mix(copies: int) -> tuple[list[tuple[str, bytes, str]], int]:
    """The shipped events as the stream connector writes them to machine.data, every quantity whether a join
    reads it or not, replayed by `copies` machines per real one (under their own names, at the same times),
    in time order: (key, value, thing) of each record; and how many joins the engine makes of them."""
    records = []
    for line in DEFAULT_EVENTS_FILE.read_bytes().splitlines():
        if line.strip():
            records.extend(split_row(line, DEFAULT_MAX_ROW_BYTES).records)
    records.sort(key=lambda record: record["phenomenonTime"])  # stable: the file's order within a time
    fleet = [dict(record, thing=f"{record['thing']}-{copy:03d}") for record in records for copy in range(copies)]
    engine = KeyedJoiner(load_join_specs(None))
    joins = sum(len(engine.ingest(record).outputs) for record in fleet)
    return [(record_key(record["thing"], record["quantity"]), encode_record(record), record["thing"])
            for record in fleet], joins


def ceiling_settings(connection: KafkaSettings, topics: dict[str, str], commit_interval_ms: int,
                     name: str) -> KafkaJoinerSettings:
    """One run on the pre-loaded input of `topics`: a group and output topics of its own, named after it."""
    group = f"{topics['group']}.{name}"  # under the run's group: deleted with its topics
    own = dict(topics, out=f"{group}.out", dlq=f"{group}.dlq", group=group)
    specs = (dataclasses.replace(MACHINE_OUT, name=own["out"]), dataclasses.replace(MACHINE_DLQ, name=own["dlq"]))
    ensure_topics(admin_client(connection.kafka_bootstrap_servers), specs)
    return joiner_settings(connection, own, commit_interval_ms, True, name)


def ceiling_workload(connection: KafkaSettings, args: argparse.Namespace, label: str,
                     records: list[tuple[str, bytes, str]], joins: int, recorded: Results) -> None:
    """The joiner and its pass-through, one process each, on one pre-loaded input, in alternate rounds
    (pass-through first, then joiner first, ...); the ratio; and the joiner's time per phase."""
    bootstrap = connection.kafka_bootstrap_servers
    topics = fresh_topics(bootstrap, append_time=False)
    runs: dict[bool, list[Run]] = {False: [], True: []}
    transactions = consumed = 0
    try:
        count = produce(bootstrap, topics["data"], iter(records), True)
        for round_ in range(1, args.ceiling_rounds + 1):
            order = (True, False) if round_ % 2 else (False, True)
            for pass_through in order:
                name = f"{'pass-through' if pass_through else 'joiner'}-{round_}"
                result, = run_instances([ceiling_settings(connection, topics, args.commit_interval_ms, name)],
                                        count if pass_through else joins, args.max_s, pass_through)
                run = Run(result.records_in, (result.last_commit_at or float("nan")) - (result.first_record_at or 0),
                          result.cpu_s)
                runs[pass_through].append(run)
                if not pass_through:
                    transactions += result.transactions
                    consumed += result.records_in
                    if result.joins_out < joins:
                        log.warning("%s: stopped after --max-s with %d of %d joins", name, result.joins_out,
                                    joins)
                print(run_line(f"{label}, {'pass-through' if pass_through else 'joiner'}", round_, run), flush=True)
        outcome = ratio(runs[False], runs[True])
        print("  " + ratio_line(label, outcome, STANDALONE_TARGET), flush=True)
        recorded.add(f"{label}: joiner / pass-through, records/s", outcome.median, "x", at_least(STANDALONE_TARGET))
        recorded.add(f"{label}: joiner / pass-through, by CPU per record", outcome.cpu_ratio, "x")
        recorded.add(f"{label}: joiner, CPU per record", outcome.joiner_cpu_us, "µs")
        recorded.add(f"{label}: pass-through, CPU per record", outcome.ceiling_cpu_us, "µs")
        costs = phase_costs(ceiling_settings(connection, topics, args.commit_interval_ms, "costs"), count,
                            consumed // max(transactions, 1))
        print(f"  the joiner's CPU per input record by phase, {label} ({count:,} records, {joins:,} joins, "
              f"{consumed // max(transactions, 1):,} records per transaction as the joiner's):")
        for line in cost_lines(costs, count, outcome.joiner_cpu_us):
            print("  " + line)
        for phase, cpu_s in costs.items():
            recorded.add(f"{label}, the joiner's phase {phase}: CPU per record", cpu_s / count * 1e6, "µs")
    finally:
        delete_topics(bootstrap, topics)


def ceiling(connection: KafkaSettings, args: argparse.Namespace, recorded: Results) -> None:
    print(f"the ceiling: the joiner (one process, input partitioned by thing) against its pass-through, the same "
          f"consumer, producer and transactions with no join (each record produced unchanged), on the same "
          f"pre-loaded input, alternately; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(RUN_HEADER)
    records, joins = real_mix(args.ceiling_copies)
    real_share = joins / len(records)
    ceiling_workload(connection, args, f"real mix x{args.ceiling_copies}", records, joins, recorded)
    del records
    count = args.ceiling_records
    ceiling_workload(connection, args, "all-joinable", list(synthetic_records(count, args.machines, args.axes)),
                     expected_joins(count, args.machines, args.axes), recorded)
    print(f"  (real mix: every record of the shipped events, of every quantity, {real_share:.0%} of them completing a "
          f"join; all-joinable: the synthetic input above, every record completing one; load average "
          f"{os.getloadavg()[0]:.1f} at the end)")


def _steady_producer(bootstrap: str, topic: str, count: int, machines: int, axes: int, rate: float) -> None:
    produce(bootstrap, topic, synthetic_records(count, machines, axes), True, rate=rate)


def latency(connection: KafkaSettings, args: argparse.Namespace, recorded: Results) -> None:
    bootstrap = connection.kafka_bootstrap_servers
    topics = fresh_topics(bootstrap, append_time=True)
    count = int(args.rate * (args.warmup_s + args.latency_s))
    joins = expected_joins(count, args.machines, args.axes)
    try:
        joiner = KafkaJoiner(joiner_settings(connection, topics, args.commit_interval_ms, True))
        stats = joiner.stats
        stats.keep_latencies = True
        joiner.start()
        # Steady state: the input starts once the joiner owns its partitions, so joining the group and
        # the first assignment are not measured as latency of the first records.
        deadline = time.monotonic() + 60
        while not joiner.assigned() and time.monotonic() < deadline:
            joiner.step()
        producer = multiprocessing.get_context("spawn").Process(
            target=_steady_producer, args=(bootstrap, topics["data"], count, args.machines, args.axes, args.rate))
        producer.start()
        # The first transactions on the fresh topics are slow (the broker opens each new partition's log
        # and transaction state on first use; the input starts while the producer process is still
        # importing): the warm-up runs at the same rate and is reported apart, not in the steady figures.
        while stats.first_record_at is None and time.monotonic() < deadline:
            joiner.step()
        warm_until = time.monotonic() + args.warmup_s
        while time.monotonic() < warm_until:
            joiner.step()
        warmup = sorted(stats.latencies_ms)
        warmup_joins = stats.records_out
        del stats.latencies_ms[:]
        max_s = args.latency_s + args.max_s
        started = time.monotonic()
        joiner.run(until=lambda j: stats.records_out >= joins or time.monotonic() - started > max_s)
        producer.join(60)
        p50, p99, p999 = stats.latency_percentiles(0.5, 0.99, 0.999)
        print(f"latency at a steady {args.rate:,.0f} records/s for {args.latency_s:.0f} s "
              f"({stats.records_out - warmup_joins:,} joins, commit every {args.commit_interval_ms} ms): append to "
              f"commit p50 {p50:.0f} ms, p99 {p99:.0f} ms, p99.9 {p999:.0f} ms, max {max(stats.latencies_ms):.0f} ms")
        at_rate = f"latency at {args.rate:,.0f} records/s, append to commit"
        recorded.add(f"{at_rate}, p50", p50, "ms")
        recorded.add(f"{at_rate}, p99", p99, "ms", at_most(LATENCY_P99_TARGET_MS))
        recorded.add(f"{at_rate}, p99.9", p999, "ms")
        recorded.add(f"{at_rate}, max", max(stats.latencies_ms), "ms")
        if warmup:
            print(f"  (the {args.warmup_s:.0f} s warm-up before it on the fresh topics, {warmup_joins:,} joins: "
                  f"p50 {warmup[len(warmup) // 2]:.0f} ms, p99 {warmup[int(0.99 * len(warmup))]:.0f} ms, "
                  f"max {warmup[-1]:.0f} ms)")
    finally:
        delete_topics(bootstrap, topics)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kafka_joiner",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser, KafkaSettings)
    parser.add_argument("--records", type=int, default=1_000_000, help="records to pre-load for the throughput run")
    parser.add_argument("--machines", type=int, default=8, help="synthetic machines")
    parser.add_argument("--axes", type=int, default=2, help="axes per machine (one power join each)")
    parser.add_argument("--rate", type=float, default=10_000, help="steady input records/s for the latency run")
    parser.add_argument("--latency-s", type=float, default=20, help="length of the latency run")
    parser.add_argument("--warmup-s", type=float, default=5,
                        help="input at the same rate before the latency run, reported apart")
    parser.add_argument("--commit-interval-ms", type=int, default=KafkaJoinerSettings.commit_interval_ms,
                        help="transaction interval of the joiner while it reads a backlog")
    parser.add_argument("--max-s", type=float, default=90,
                        help="stop the throughput run this long after its first record (the latency run: after the input)")
    parser.add_argument("--ceiling-copies", type=int, default=20,
                        help="machines per real one in the ceiling's real mix (19,825 records each)")
    parser.add_argument("--ceiling-records", type=int, default=400_000,
                        help="records of the ceiling's all-joinable input")
    parser.add_argument("--ceiling-rounds", type=int, default=2,
                        help="alternate runs of the joiner and its pass-through per ceiling input")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-ceiling", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    tune_gc_for_streaming()  # as `python -m kafka_joiner` runs
    # A stop request unwinds normally, so the runs' topics are still deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    connection = from_namespace(KafkaSettings, args)
    recorded = Results("kafka_joiner", argv)
    if not args.skip_throughput:
        throughput(connection, args, recorded)
    if not args.skip_ceiling:
        ceiling(connection, args, recorded)
    if not args.skip_latency:
        latency(connection, args, recorded)
    recorded.write()


if __name__ == "__main__":
    main()
