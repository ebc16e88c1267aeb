"""The simulator against the real Mosquitto, with a live QoS 1 subscriber counting what arrives."""
from __future__ import annotations

import json
import threading

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from conftest import EVENTS_FILE
from connector_support import read_rows, run_simulator
from support import unique, wait_for


@pytest.fixture
def subscriber(stack):
    """A QoS 1 subscriber on a fresh topic; yields (topic, received payloads)."""
    topic = f"test/{unique('sim')}/states"
    received: list[bytes] = []
    subscribed = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=unique("sim-subscriber"))
    client.on_message = lambda _c, _u, message: received.append(message.payload)
    client.on_subscribe = lambda *_args: subscribed.set()
    client.connect(stack.mqtt_host, stack.mqtt_port)
    client.subscribe(topic, qos=1)
    client.loop_start()
    wait_for(subscribed.is_set, 10, "SUBACK")
    yield topic, received
    client.loop_stop()
    client.disconnect()


def test_every_real_row_arrives_once_and_each_machine_in_time_order(subscriber):
    topic, received = subscriber
    result = run_simulator(topic, "--events-file", str(EVENTS_FILE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "published 5000 rows" in result.stdout and ", 0 failures" in result.stdout
    wait_for(lambda: len(received) >= 5000, 30, "5000 rows at the subscriber")
    rows = [json.loads(payload) for payload in received]
    assert len(rows) == 5000
    assert sorted(row["id"] for row in rows) == sorted(row["id"] for row in read_rows(EVENTS_FILE))
    for thing in {row["Thing"] for row in rows}:
        times = [row["Timestamp"] for row in rows if row["Thing"] == thing]
        assert times == sorted(times)


def test_synthetic_rows_published_at_a_rate_are_the_ones_written_to_a_file(subscriber, tmp_path):
    topic, received = subscriber
    args = ["--synthetic", "--machines", "2", "--axes", "1", "--seed", "5", "--limit", "200"]
    written = tmp_path / "synthetic.json"
    assert run_simulator(topic, *args, "--output", str(written)).returncode == 0
    result = run_simulator(topic, *args, "--rate", "2000")
    assert result.returncode == 0 and ", 0 failures" in result.stdout, result.stdout + result.stderr
    wait_for(lambda: len(received) >= 200, 30, "200 synthetic rows")
    assert [json.loads(payload) for payload in received] == read_rows(written)


def test_an_unreachable_broker_is_a_clear_error():
    result = run_simulator("test/unreachable", "--mqtt-port", "1", "--limit", "1")
    assert result.returncode == 2
    assert "cannot reach the MQTT broker at 127.0.0.1:1" in result.stderr
