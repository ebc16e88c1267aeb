"""Kafka goes away longer than the producer's delivery timeout and comes back: the stream
connector loses nothing and dead-letters nothing good. Rows wait unacknowledged in Mosquitto, and
every good row arrives exactly once. Meanwhile its heartbeat says it is stuck (alive, but nothing done),
and healthy once Kafka is back.

Two connectors go through one outage side by side: one that waits for Kafka as long as it takes (the default) and one
whose records time out after 2 s, as the old connector's did. The test stops and starts Kafka, so it runs its own
Mosquitto and Kafka (private ports and state folder, started and stopped through `stack.manager`), never the shared
stack.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from conftest import EVENTS_FILE
from connector_support import ConnectorProcess, expected_records, read_rows, topic_size
from fault_support import stop_server
from pipeline_core import paths
from pipeline_core.settings import ConnectionSettings, load_settings
from pipeline_core.stage_health import assess, read_heartbeat
from simulator.publisher import Publisher
from stack import manager
from stack.services import Kafka, Mosquitto
from stack.processes import free_loopback_ports
from support import read_topic, unique, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def private_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectionSettings]:
    """Mosquitto and Kafka on ports and a state folder of their own; the environment points the
    connector (a subprocess) and every client of the test at them."""
    mqtt, kafka, controller = free_loopback_ports(3)
    state_dir = tmp_path_factory.mktemp("outage-stack")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paths, "STATE_DIR", state_dir)
        for name, value in (("STACK_STATE_DIR", state_dir), ("MQTT_PORT", mqtt), ("KAFKA_PORT", kafka), ("KAFKA_CONTROLLER_PORT", controller),
                            ("KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{kafka}")):
            patch.setenv(name, str(value))
        servers = [Mosquitto(), Kafka()]
        try:
            manager.up(servers)
            yield load_settings(ConnectionSettings, [])
        finally:
            manager.down(servers)


def publish(settings: ConnectionSettings, topic: str, rows: list[dict]) -> None:
    publisher = Publisher(settings, unique("outage-publisher").replace(".", "-"))
    publisher.connect()
    for row in rows:
        publisher.publish(topic, json.dumps(row))
    assert publisher.drain(30) == 0, "Mosquitto did not take every row"
    publisher.close()


def size_once_readable(bootstrap: str, topic: str) -> int:
    """`topic_size`, 0 while the topic's partitions have no leader yet (just created, or Kafka just back)."""
    try:
        return topic_size(bootstrap, topic)
    except KafkaException:
        return 0


def canonical(values: list[bytes]) -> list[str]:
    return sorted(json.dumps(json.loads(value), sort_keys=True) for value in values)


# The connectors' delivery timeouts, one connector each:
DELIVERY_TIMEOUTS_MS = (
    2000,  # the old connector dead-lettered every record still waiting for Kafka after this long
    0,  # the default: the producer never gives up
)


def test_a_kafka_outage_loses_nothing_and_dead_letters_nothing(private_stack: ConnectionSettings,
                                                               tmp_path: Path) -> None:
    bootstrap = private_stack.kafka_bootstrap_servers
    bridges: dict[int, ConnectorProcess] = {}
    for delivery_timeout_ms in DELIVERY_TIMEOUTS_MS:
        name = unique("outage").replace(".", "-")
        folder = tmp_path / f"delivery-timeout-{delivery_timeout_ms}"
        folder.mkdir()
        bridges[delivery_timeout_ms] = ConnectorProcess(
            mqtt_topic=f"test/{name}/states", client_id=name, data_topic=f"machine.data.{name}",
            dlq_topic=f"machine.dlq.{name}", log_path=folder / "connector.log",
            extra=["--delivery-timeout-ms", str(delivery_timeout_ms), "--progress-file", str(folder / "progress.json")])

    def health(delivery_timeout_ms: int) -> str:
        return assess(read_heartbeat(bridges[delivery_timeout_ms].log_path.parent / "progress.json"), time.time()).state

    rows = read_rows(EVENTS_FILE)[:400]
    before, during = rows[:200], rows[200:]
    try:
        for bridge in bridges.values():
            bridge.start()
        for bridge in bridges.values():
            publish(private_stack, bridge.mqtt_topic, before)
        for bridge in bridges.values():
            wait_for(lambda: size_once_readable(bootstrap, bridge.data_topic) >= len(expected_records(before)), 60,
                     "the rows before the outage in Kafka")

        stop_server(Kafka(), bootstrap, "Kafka")
        for bridge in bridges.values():
            publish(private_stack, bridge.mqtt_topic, during)  # Mosquitto takes them; Kafka is away
        wait_for(lambda: "Message timed out" in bridges[2000].log(), 60, "a delivery timeout during the outage")
        wait_for(lambda: ", lag 100;" in bridges[0].log(), 60, "rows waiting for Kafka")
        # Whether its Kafka side restarts again and again (a delivery timeout) or waits: nothing is done.
        for delivery_timeout_ms, bridge in bridges.items():
            wait_for(lambda: health(delivery_timeout_ms) == "stuck", 60,
                     f"the heartbeat of the connector with delivery timeout {delivery_timeout_ms} ms to say stuck",
                     interval_s=0.2)
            assert bridge.process.poll() is None, bridge.log()
        assert manager.up([Kafka()]) == ["kafka"]

        expected = canonical([json.dumps(record).encode() for record in expected_records(rows)])
        for delivery_timeout_ms, bridge in bridges.items():
            wait_for(lambda: size_once_readable(bootstrap, bridge.data_topic) >= len(expected), 120,
                     "every record after Kafka came back", interval_s=1.0)
            arrived = [message.value for message in read_topic(bootstrap, bridge.data_topic, idle_s=1.0)]
            assert canonical(arrived) == expected, delivery_timeout_ms  # each good record exactly once
            assert topic_size(bootstrap, bridge.dlq_topic) == 0, bridge.log()
            assert bridge.process.poll() is None, bridge.log()
            wait_for(lambda: health(delivery_timeout_ms) in ("progressing", "idle"), 30,
                     f"the connector with delivery timeout {delivery_timeout_ms} ms healthy again", interval_s=0.2)
        assert "Kafka did not take a record" not in bridges[0].log()
    finally:
        for bridge in bridges.values():
            bridge.close()
