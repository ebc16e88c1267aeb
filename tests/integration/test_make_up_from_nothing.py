"""`make clean && make up` once per joiner, on a private stack (own ports and state folder): every process
comes up healthy, and a row replayed with `make data` becomes a joined record in machine.out. Prints how long
the start took and the first join's latency. `make reliability` runs ten starts per joiner.

Before the replay, a plain Kafka producer writes records of every kind no stage may stop on (`poison_corpus`)
to machine.data and machine.out, as other producers can: each becomes one dead letter per stage that reads
it, no stage restarts, and the replay of the whole events file still gives exactly its 2,748 joins."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from db_connector_support import expected_joined_points, expected_raw_points, wait_for_points
from pipeline_core.records import decode_record
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT
from poison_corpus import PoisonRecord, poison_records
from startup_support import PrivateStack, assert_all_healthy, healthy_states
from support import read_topic

pytestmark = pytest.mark.integration

EVENTS_FILE_JOINS = 2_748
EVENTS_FILE_RECORDS = 19_825  # one per quantity of each of the 5,000 rows
JOINER_STAGE = {"spark": "spark_joiner", "lsb": "kafka_joiner"}
# Room below the topic's limit for the record's key, headers and Kafka's framing.
_FRAMING_BYTES = 1024


# The standalone joiner's run is the secure one (`make up SECURITY=on`): Kafka with SCRAM and each stage's ACLs.
@pytest.mark.parametrize(("joiner", "secure"), [("spark", False), ("lsb", True)])
def test_make_up_from_nothing_runs_every_process_and_joins(joiner: str, secure: bool, state_dir: Path, capsys) -> None:
    stack = PrivateStack(state_dir, secure=secure)
    try:
        started = stack.start_from_nothing(joiner)
        assert_all_healthy(started)
        assert (stack.state_dir / "credentials.env").exists() == secure
        security = stack.kafka_security
        poison = {topic: put_poison(stack.bootstrap, topic, security) for topic in (MACHINE_DATA.name, MACHINE_OUT.name)}
        joined = stack.first_join(rows=None)
        assert joined.record["thing"] and joined.record["quantity"]

        # Every stage reading a topic dead-letters each of its bad records once: the joiner machine.data's,
        # the DB connector both topics'.
        expected = Counter({(JOINER_STAGE[joiner], *origin): 1 for origin in poison[MACHINE_DATA.name]})
        expected.update({("db_connector", *origin): 1 for records in poison.values() for origin in records})
        read_topic(stack.bootstrap, MACHINE_OUT.name, expected=EVENTS_FILE_JOINS + len(poison[MACHINE_OUT.name]),
                   deadline_s=600, security=security)
        read_topic(stack.bootstrap, MACHINE_DLQ.name, expected=sum(expected.values()), deadline_s=300, security=security)
        # Nothing more comes: both read again to their end.
        letters = Counter(origin_of(message.value)
                          for message in read_topic(stack.bootstrap, MACHINE_DLQ.name, security=security))
        assert letters == expected
        out = read_topic(stack.bootstrap, MACHINE_OUT.name, security=security)
        joins = [message for message in out if (MACHINE_OUT.name, message.partition, message.offset)
                 not in poison[MACHINE_OUT.name]]
        ids = Counter(decode_record(message.value)["id"] for message in joins)
        assert len(joins) == EVENTS_FILE_JOINS and len(ids) == EVENTS_FILE_JOINS, ids.most_common(3)
        # InfluxDB, point by point: each record of machine.data (but the bad ones) a raw point and each join a
        # joined point, with their tags, times and values; nothing else.
        data = [decode_record(message.value)
                for message in read_topic(stack.bootstrap, MACHINE_DATA.name, security=security)
                if (MACHINE_DATA.name, message.partition, message.offset) not in poison[MACHINE_DATA.name]]
        assert len(data) == EVENTS_FILE_RECORDS
        wait_for_points(stack.influx(), raw=expected_raw_points(data),
                        joined=expected_joined_points(decode_record(message.value) for message in joins),
                        deadline_s=300)
        assert stack.states(joiner) == healthy_states(joiner)
        if joiner == "spark":
            # The JVM's temporary files (its block manager's dir, RocksDB's unpacked library) lie in the joiner's
            # state, which `make clean` removes, not in /tmp, where a killed JVM would leave them for good: in a
            # folder of the driver's own there, which its process removes as it exits.
            temp_dir = stack.state_dir / "spark-joiner" / "tmp"
            driver = "spark-driver-*/"
            assert any(temp_dir.glob(f"{driver}blockmgr-*")) and any(temp_dir.glob(f"{driver}librocksdbjni*")), \
                sorted(str(path.relative_to(temp_dir)) for path in temp_dir.rglob("*"))[:20]
        with capsys.disabled():
            print(f"\nJOINER={joiner}{' SECURITY=on' if secure else ''}: make up from nothing {started.seconds:.1f} s "
                  f"(stack up in {started.reported_seconds:.1f} s); first replayed row -> first joined record "
                  f"{joined.latency_s:.2f} s; {len(poison[MACHINE_DATA.name])} bad records on each of "
                  f"{MACHINE_DATA.name} and {MACHINE_OUT.name}: {sum(letters.values())} dead letters")
    finally:
        stack.down()


def put_poison(bootstrap: str, topic: str, security: dict[str, str]) -> dict[tuple[str, int, int], PoisonRecord]:
    """Write the corpus to `topic` with a plain producer; each record by where it landed."""
    limit = max_message_bytes(bootstrap, topic, security)
    producer = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 2 * limit, "linger.ms": 0, **security})
    landed: dict[tuple[str, int, int], PoisonRecord] = {}
    for record in poison_records(limit - _FRAMING_BYTES):
        def delivered(error, message, record=record) -> None:
            assert error is None, f"{record.what}: {error}"
            landed[(message.topic(), message.partition(), message.offset())] = record

        producer.produce(topic, record.value, record.key, headers=record.headers, on_delivery=delivered)
        assert producer.flush(30) == 0
    return landed


def max_message_bytes(bootstrap: str, topic: str, security: dict[str, str]) -> int:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap, **security})  # kept while its answer is awaited
    configs = admin.describe_configs([resource])[resource].result(30)
    return int(configs["max.message.bytes"].value)


def origin_of(letter: bytes) -> tuple:
    envelope = json.loads(letter)
    return envelope["stage"], envelope.get("topic"), envelope.get("partition"), envelope.get("offset")
