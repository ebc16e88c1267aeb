"""`python -m benchmarks.db_connector`: points/s from Kafka into InfluxDB, the seed's way and ours, same run.

The seed's way: one point per HTTP request (its connector called `write_points([point])` per record).
Ours: the DB connector's batched line-protocol writes with commits after each batch. Both read the same
records from one fresh topic into their own fresh database, which is dropped afterwards; each rate is
counted from the first record consumed to the last point stored.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer

from pipeline_core.influx import influx_client
from pipeline_core.kafka_clients import admin_client, consumer_config, producer_config
from pipeline_core.kafka_clients import produce as kafka_produce
from pipeline_core.lifecycle import StopSignal
from pipeline_core.logs import configure_logging
from pipeline_core.records import encode_record, record_key
from pipeline_core.settings import InfluxSettings, KafkaSettings, load_settings, setting
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics

from db_connector.connector import DbConnector
from db_connector.influx_sink import InfluxSink
from db_connector.settings import DbConnectorSettings

from benchmarks.results import Results, at_least

log = logging.getLogger("benchmarks.db_connector")

THINGS = ("R0815", "H31415", "R27182")
QUANTITIES = ("actSpeed_C11", "vaTorque_C11", "vaCurr_C11", "vaLoad_C11", "cmdSpeed_C11", "vaPower_C11")
# A day ago: inside the raw retention policy the connector writes into, which refuses older points.
START_MS = (int(time.time()) - 86_400) * 1000
SPEED_UP_TARGET = 100.0  # ours against the seed's one point per request, points/s


def synthetic_records(count: int) -> list[dict]:
    """`count` machine.data records: every thing and quantity once per millisecond step."""
    per_step = len(THINGS) * len(QUANTITIES)
    return [{"thing": THINGS[i % len(THINGS)], "quantity": QUANTITIES[(i // len(THINGS)) % len(QUANTITIES)],
             "phenomenonTime": START_MS + i // per_step, "result": (i % 1000) * 0.5, "id": str(i)}
            for i in range(count)]


def produce(bootstrap: str, topic: str, records: list[dict]) -> None:
    producer = Producer(producer_config(bootstrap, **{"linger.ms": 20}))
    for record in records:
        kafka_produce(producer, topic, encode_record(record), record_key(record["thing"], record["quantity"]))
    if producer.flush(120):
        raise RuntimeError("records not delivered to Kafka")


@dataclasses.dataclass(frozen=True)
class BenchSettings(KafkaSettings, InfluxSettings):
    """Points/s into InfluxDB from Kafka: the seed's one point per request beside the DB connector."""

    records: int = setting(200_000, "BENCH_RECORDS", "records for the DB connector")
    seed_records: int = setting(3_000, "BENCH_SEED_RECORDS", "records for the seed's method")


def seed_rate(settings: BenchSettings, topic: str, count: int) -> float:
    """The seed's connector: consume, and write each record as its own request."""
    client = influx_client(settings)
    client.create_database(settings.influxdb_database)
    consumer = Consumer(consumer_config(settings.kafka_bootstrap_servers, f"bench-seed-{uuid.uuid4().hex[:8]}"))
    consumer.subscribe([topic])
    written, started = 0, None
    try:
        while written < count:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            started = started or time.perf_counter()
            record = json.loads(message.value())
            client.write_points([{"measurement": "machinedata",
                                  "tags": {"thing": record["thing"], "quantity": record["quantity"]},
                                  "time": record["phenomenonTime"], "fields": {"result": float(record["result"])}}],
                                time_precision="ms")
            written += 1
    finally:
        consumer.close()
    return count / (time.perf_counter() - started)


def connector_rate(settings: DbConnectorSettings, count: int) -> float:
    """Our connector, in-process, until it has stored `count` points."""
    stop = StopSignal()
    connector = DbConnector(settings, InfluxSink.from_settings(settings), stop)
    runner = threading.Thread(target=connector.run, name="db-connector")
    runner.start()
    started = None
    try:
        while connector.counters.records_out < count:
            if not runner.is_alive():
                raise RuntimeError("the connector stopped")
            if started is None and connector.counters.records_in:
                started = time.perf_counter()
            time.sleep(0.005)
        return count / (time.perf_counter() - (started or time.perf_counter()))
    finally:
        stop.set()
        runner.join(60)


def main() -> None:
    configure_logging("WARNING")
    args = load_settings(BenchSettings, prog="python -m benchmarks.db_connector")
    recorded = Results("db_connector")
    connection = {field.name: getattr(args, field.name)
                  for field in dataclasses.fields(KafkaSettings) + dataclasses.fields(InfluxSettings)}
    suffix = uuid.uuid4().hex[:10]
    topics = [dataclasses.replace(spec, name=f"{spec.name}.bench.{suffix}")
              for spec in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)]
    admin = admin_client(args.kafka_bootstrap_servers)
    ensure_topics(admin, tuple(topics))
    databases = [f"bench_seed_{suffix}", f"bench_ours_{suffix}"]
    try:
        total = max(args.records, args.seed_records)
        print(f"producing {total:,} records to {topics[0].name} ...", flush=True)
        produce(args.kafka_bootstrap_servers, topics[0].name, synthetic_records(total))

        print(f"seed's method (one point per request), {args.seed_records:,} points ...", flush=True)
        seed = seed_rate(dataclasses.replace(args, influxdb_database=databases[0]), topics[0].name,
                         args.seed_records)
        print(f"db_connector (batched line protocol), {args.records:,} points ...", flush=True)
        ours = connector_rate(DbConnectorSettings(**{
            **connection, "influxdb_database": databases[1],
            "data_topic": topics[0].name, "out_topic": topics[1].name, "dlq_topic": topics[2].name,
            "group_id": f"bench-ours-{suffix}", "progress_interval_s": 3600.0, "health_metrics": False}), args.records)
        stored = list(influx_client(dataclasses.replace(args, influxdb_database=databases[1])).query(
            "SELECT count(result) FROM machinedata WHERE time > 0").get_points())[0]["count"]
        print()
        print(f"{'method':<42}{'points':>10}{'points/s':>12}")
        print(f"{'seed: one point per HTTP request':<42}{args.seed_records:>10,}{seed:>12,.0f}")
        print(f"{'db_connector: batched line protocol':<42}{stored:>10,}{ours:>12,.0f}")
        print(f"speed-up: {ours / seed:,.0f}x (target >= {SPEED_UP_TARGET:g}x)")
        recorded.add("db_connector, batched line protocol", ours, "points/s")
        recorded.add("seed's method, one point per HTTP request", seed, "points/s")
        recorded.add("db_connector / seed's method", ours / seed, "x", at_least(SPEED_UP_TARGET))
        recorded.write()
    finally:
        for database in databases:
            influx_client(dataclasses.replace(args, influxdb_database=database)).drop_database(database)
        # Wait for the deletion: the admin client's request would die with the process otherwise.
        for future in admin.delete_topics([spec.name for spec in topics], operation_timeout=30).values():
            future.result(30)


if __name__ == "__main__":
    main()
