"""Benchmark of the Kafka joiner at exactly-once: ``python -m local_stream_buffer.kafka_joiner.bench``.

1. Throughput: pre-load synthetic records (several machines, speed and torque interleaved) into a fresh
   copy of machine.data, then run the joiner from the first consumed record to the commit of the last
   output: joins/s and records/s.
2. Latency: a steady input of `--rate` records/s produced by a separate process into a fresh topic with
   log-append timestamps; per output, the time from its completing record's append to the commit of the
   transaction that carries it: p50/p99.

Every run uses its own topics and consumer group, deleted afterwards.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing
import signal
import sys
import time
import uuid
from collections.abc import Iterator

from confluent_kafka import Producer

from stack.kafka_clients import admin_client, producer_config
from stack.kafka_clients import produce as produce_with_backpressure
from stack.logs import configure_logging
from stack.records import record_key
from stack.runtime import tune_gc_for_streaming
from stack.settings import KafkaSettings, add_arguments, from_namespace
from stack.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics

from .service import KafkaJoiner
from .settings import KafkaJoinerSettings

log = logging.getLogger("local_stream_buffer.kafka_joiner.bench")

START_MS = 1_700_000_000_000
TICK_MS = 10  # speed at every tick, torque half a tick later: each record completes about one pair


def synthetic_records(count: int, machines: int, axes: int) -> Iterator[tuple[str, bytes]]:
    """(key, value) of `count` records in time order: speed and torque of every machine and axis."""
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
                    yield record_key(thing, quantity), template.format(thing, quantity, t + offset, value).encode()


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


def produce(bootstrap: str, topic: str, records: Iterator[tuple[str, bytes]], rate: float | None = None) -> int:
    """Produce the records (at `rate` per second if given) and wait for every acknowledgement."""
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 20 if rate is None else 2,
                                                      "batch.size": 1_000_000,
                                                      "queue.buffering.max.messages": 2_000_000}))
    count = 0
    if rate is not None:
        # The pace starts once the first record is acknowledged: until the connection and the idempotent
        # producer's id are set up, paced records would queue locally and reach the broker as one burst.
        first = next(records, None)
        if first is not None:
            key, value = first
            produce_with_backpressure(producer, topic, value, key)
            count = 1
        producer.flush(30)
    started = time.monotonic()
    for key, value in records:
        if rate is not None and count % 100 == 0:
            ahead = count / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        produce_with_backpressure(producer, topic, value, key)
        producer.poll(0)
        count += 1
    if producer.flush(120):
        raise RuntimeError("input records not acknowledged")
    return count


def joiner_settings(connection: KafkaSettings, topics: dict[str, str], commit_interval_ms: int
                    ) -> KafkaJoinerSettings:
    return KafkaJoinerSettings(**dataclasses.asdict(connection), input_topic=topics["data"],
                               output_topic=topics["out"], dlq_topic=topics["dlq"], group_id=topics["group"],
                               transactional_id_prefix=topics["group"], commit_interval_ms=commit_interval_ms,
                               log_interval_s=5.0)


def run_until(joiner: KafkaJoiner, joins: int, max_seconds: float) -> None:
    """Run the joiner until it committed `joins` outputs, or for at most `max_seconds` after its first record."""
    joiner.start()
    stats = joiner.stats
    joiner.run(until=lambda j: stats.joins_out >= joins or (
        stats.first_record_at is not None and time.monotonic() - stats.first_record_at > max_seconds))


def throughput(connection: KafkaSettings, args: argparse.Namespace) -> None:
    bootstrap = connection.kafka_bootstrap_servers
    topics = fresh_topics(bootstrap, append_time=False)
    try:
        started = time.monotonic()
        count = produce(bootstrap, topics["data"], synthetic_records(args.records, args.machines, args.axes))
        print(f"pre-loaded {count:,} records ({args.machines} machines x {args.axes} axes) "
              f"in {time.monotonic() - started:.1f} s")
        joins = expected_joins(count, args.machines, args.axes)
        joiner = KafkaJoiner(joiner_settings(connection, topics, args.commit_interval_ms))
        cpu_before = time.process_time()
        run_until(joiner, joins, args.max_seconds)
        cpu = time.process_time() - cpu_before
        stats = joiner.stats
        elapsed = stats.last_commit_at - stats.first_record_at
        print(f"throughput at exactly-once: {stats.joins_out:,} joins of {stats.joined_in:,} records in "
              f"{elapsed:.1f} s (first record consumed to last output committed): "
              f"{stats.joins_out / elapsed:,.0f} joins/s, {stats.joined_in / elapsed:,.0f} records/s, "
              f"{stats.transactions} transactions; joiner CPU {cpu / max(stats.records_in, 1) * 1e6:.0f} µs per record "
              f"(all threads)")
        if stats.joins_out < joins:
            print(f"(stopped after --max-seconds {args.max_seconds:.0f}: {stats.joined_in:,} of {count:,} records "
                  f"joined; the rates are over that span)")
        forced = sum(join.joiner.counters.forced for join in joiner._joins.values())
        if forced:
            print(f"WARNING: {forced:,} pending records were forced out: the input streams of a key drifted apart")
    finally:
        delete_topics(bootstrap, topics)


def _steady_producer(bootstrap: str, topic: str, count: int, machines: int, axes: int, rate: float) -> None:
    produce(bootstrap, topic, synthetic_records(count, machines, axes), rate=rate)


def latency(connection: KafkaSettings, args: argparse.Namespace) -> None:
    bootstrap = connection.kafka_bootstrap_servers
    topics = fresh_topics(bootstrap, append_time=True)
    count = int(args.rate * (args.warmup_seconds + args.latency_seconds))
    joins = expected_joins(count, args.machines, args.axes)
    try:
        joiner = KafkaJoiner(joiner_settings(connection, topics, args.commit_interval_ms))
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
        warm_until = time.monotonic() + args.warmup_seconds
        while time.monotonic() < warm_until:
            joiner.step()
        warmup = sorted(stats.latencies_ms)
        warmup_joins = stats.joins_out
        del stats.latencies_ms[:]
        max_seconds = args.latency_seconds + args.max_seconds
        started = time.monotonic()
        joiner.run(until=lambda j: stats.joins_out >= joins or time.monotonic() - started > max_seconds)
        producer.join(60)
        p50, p99, p999 = stats.latency_percentiles(0.5, 0.99, 0.999)
        print(f"latency at a steady {args.rate:,.0f} records/s for {args.latency_seconds:.0f} s "
              f"({stats.joins_out - warmup_joins:,} joins, commit every {args.commit_interval_ms} ms): append to "
              f"commit p50 {p50:.0f} ms, p99 {p99:.0f} ms, p99.9 {p999:.0f} ms, max {max(stats.latencies_ms):.0f} ms")
        if warmup:
            print(f"  (the {args.warmup_seconds:.0f} s warm-up before it on the fresh topics, {warmup_joins:,} joins: "
                  f"p50 {warmup[len(warmup) // 2]:.0f} ms, p99 {warmup[int(0.99 * len(warmup))]:.0f} ms, "
                  f"max {warmup[-1]:.0f} ms)")
    finally:
        delete_topics(bootstrap, topics)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m local_stream_buffer.kafka_joiner.bench",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser, KafkaSettings)
    parser.add_argument("--records", type=int, default=1_000_000, help="records to pre-load for the throughput run")
    parser.add_argument("--machines", type=int, default=8, help="synthetic machines")
    parser.add_argument("--axes", type=int, default=2, help="axes per machine (one power join each)")
    parser.add_argument("--rate", type=float, default=10_000, help="steady input records/s for the latency run")
    parser.add_argument("--latency-seconds", type=float, default=20, help="length of the latency run")
    parser.add_argument("--warmup-seconds", type=float, default=5,
                        help="input at the same rate before the latency run, reported apart")
    parser.add_argument("--commit-interval-ms", type=int, default=50, help="transaction interval of the joiner")
    parser.add_argument("--max-seconds", type=float, default=90,
                        help="stop the throughput run this long after its first record (the latency run: after the input)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    tune_gc_for_streaming()  # as `python -m local_stream_buffer.kafka_joiner` runs
    # A stop request unwinds normally, so the runs' topics are still deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    connection = from_namespace(KafkaSettings, args)
    if not args.skip_throughput:
        throughput(connection, args)
    if not args.skip_latency:
        latency(connection, args)


if __name__ == "__main__":
    main()
