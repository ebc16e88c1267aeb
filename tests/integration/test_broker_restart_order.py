"""Mosquitto restarted while the simulator publishes a few hundred rows/s: a subscriber set up like
the stream connector gets every row, and each machine's rows in time order.

A row first seen after a later row of its machine is what the joiners dead-letter as out of order.
The publisher used to cause it: after a reconnect it wrote new rows into the socket before paho
sent the unacknowledged ones again on the CONNACK. Repeats are allowed (QoS 1 is at least once;
the connector writes a repeated row's records once, `redelivery.py`), gaps and reordering are not.

The test restarts Mosquitto, so it runs its own (private port and state folder, started through
`stack.manager` under supervisord and restarted with supervisorctl, as the chaos run does).
"""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from connector_support import read_rows
from fault_support import group_gone, stop_server
from pipeline_core import paths
from pipeline_core.mqtt import CONNECTOR_CLIENT_ID, ReceivedMessage, new_client, pump
from pipeline_core.settings import MACHINE_STATES_TOPIC, MqttSettings
from stack import manager, supervision
from stack.services import Mosquitto
from support import unique, wait_for

pytestmark = pytest.mark.integration

log = logging.getLogger(__name__)

ROWS = 10_000
RATE = 400  # rows/s: 25 s of publishing, through three restarts of about 6 s each
# After this share of the rows arrived, Mosquitto is restarted (each once the previous restart is done).
RESTART_AFTER = (0.2, 0.45, 0.7)
# The connector acknowledges a row once Kafka confirmed its records: rows stay in flight at the
# broker for a while, so its restore of the session's in-flight and queued rows is exercised too.
ACK_HOLD_S = 0.05


class ConnectorLikeSubscriber(threading.Thread):
    """The stream connector's MQTT side: MQTT 3.1.1, persistent session, manual acks in arrival
    order; on a lost connection it lets its unacknowledged rows go (the broker sends them again)
    and connects anew."""

    def __init__(self, settings: MqttSettings, topic: str) -> None:
        super().__init__(name="subscriber", daemon=True)
        self.settings = settings
        self.received: list[ReceivedMessage] = []
        self.subscribed = threading.Event()
        self.stopping = threading.Event()
        self._unacked: list[tuple[float, int]] = []
        client = self.client = new_client(settings, unique("restart-order").replace(".", "-"),
                                          protocol=MQTTProtocolVersion.MQTTv311, clean_session=False,
                                          manual_ack=True)
        client.on_connect = lambda c, _u, _f, _rc, _p: c.subscribe(topic, qos=1)
        client.on_subscribe = lambda *_args: self.subscribed.set()
        client.on_message = self._on_message

    def _on_message(self, _client, _userdata, message: ReceivedMessage) -> None:
        self.received.append(message)
        self._unacked.append((time.monotonic(), message.mid))

    def run(self) -> None:
        self._connect()
        while not self.stopping.is_set():
            if pump(self.client, 0.002 if self._unacked else 0.2) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._unacked.clear()
                self._connect()
                continue
            held = time.monotonic() - ACK_HOLD_S
            due = [mid for received_at, mid in self._unacked if received_at <= held]
            self._unacked = self._unacked[len(due):]
            self.client.ack_all(due)
        self.client.disconnect()

    def _connect(self) -> None:
        while not self.stopping.is_set():
            try:
                self.client.connect(self.settings.mqtt_host, self.settings.mqtt_port, keepalive=30)
                return
            except OSError:
                self.stopping.wait(0.2)  # the broker is restarting: retry, as the connector does

    def distinct_rows(self) -> int:
        return len({message.payload for message in self.received})


def restart_mosquitto() -> None:
    """Restarts Mosquitto gracefully with supervisorctl; confirmed by its answer, the old process gone and a new
    one running."""
    old = supervision.process_info("mosquitto").pid
    assert old, "Mosquitto not running before its restart"
    done = subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(supervision.config_file()),
                           "restart", "mosquitto"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and {"mosquitto: stopped", "mosquitto: started"} <= set(done.stdout.splitlines()), \
        done.stdout + done.stderr
    assert group_gone(old), f"the old Mosquitto (PID {old}) outlived its restart"
    assert supervision.process_info("mosquitto").pid not in (None, old)


def test_a_broker_restart_under_load_keeps_every_row_and_each_machines_order(private_mosquitto: MqttSettings,
                                                                            tmp_path: Path) -> None:
    topic = f"test/{unique('restart-order')}/states"
    rows_args = ["--synthetic", "--machines", "10", "--axes", "1", "--seed", "7", "--limit", str(ROWS)]
    rows_file = tmp_path / "rows.json"
    subprocess.run([sys.executable, "-m", "simulator", *rows_args, "--output", str(rows_file)], check=True,
                   capture_output=True)
    expected = [json.dumps(row, sort_keys=True) for row in read_rows(rows_file)]

    subscriber = ConnectorLikeSubscriber(private_mosquitto, topic)
    subscriber.start()
    simulator = None
    try:
        wait_for(subscriber.subscribed.is_set, 10, "the subscriber's SUBACK")
        simulator = subprocess.Popen(
            [sys.executable, "-m", "simulator", *rows_args, "--rate", str(RATE), "--mqtt-topic", topic,
             "--mqtt-port", str(private_mosquitto.mqtt_port), "--no-progress", "--drain-timeout-s", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for share in RESTART_AFTER:
            wait_for(lambda: subscriber.distinct_rows() >= share * ROWS, 60, f"{share:.0%} of the rows")
            assert simulator.poll() is None, "the simulator finished before the restart: nothing was tested"
            restart_mosquitto()
        output, _ = simulator.communicate(timeout=120)
        assert simulator.returncode == 0 and f"published {ROWS} rows" in output and ", 0 failures" in output, output
        wait_for(lambda: subscriber.distinct_rows() >= ROWS, 60, "every row at the subscriber")
    finally:
        subscriber.stopping.set()
        subscriber.join(10)
        if simulator is not None and simulator.poll() is None:
            simulator.kill()

    first_seen: list[dict] = []
    seen: set[bytes] = set()
    for message in subscriber.received:
        if message.payload not in seen:
            seen.add(message.payload)
            first_seen.append(json.loads(message.payload))
    assert sorted(json.dumps(row, sort_keys=True) for row in first_seen) == sorted(expected)
    late = []
    latest: dict[str, int] = {}  # per machine, the latest Timestamp seen so far
    for row in first_seen:
        thing, timestamp = row["Thing"], row["Timestamp"]
        if timestamp <= latest.get(thing, timestamp - 1):
            late.append((thing, timestamp, latest[thing]))
        latest[thing] = max(timestamp, latest.get(thing, timestamp))
    log.info("%d messages for %d rows", len(subscriber.received), len(first_seen))
    assert not late, f"{len(late)} rows first seen after a later row of their machine, e.g. {late[:3]}"


def _row_reaches_a_connector_that_never_subscribed(settings: MqttSettings, payload: bytes) -> bool:
    """A device publishes `payload` (QoS 1, acknowledged) before the stream connector has connected; the connector
    then connects with its persistent session and subscribes to nothing: it gets the row only when the broker
    already held its session."""
    device = new_client(settings, unique("device"), protocol=MQTTProtocolVersion.MQTTv311, clean_session=True)
    acknowledged: list[int] = []
    device.on_publish = lambda _c, _u, mid, _code, _p: acknowledged.append(mid)
    device.connect(settings.mqtt_host, settings.mqtt_port)
    info = device.publish(f"{MACHINE_STATES_TOPIC}/M1", payload, qos=1)
    wait_for(lambda: pump(device, 0.05) == MQTTErrorCode.MQTT_ERR_SUCCESS and info.mid in acknowledged, 10,
             "the broker's PUBACK")
    device.disconnect()
    received: list[bytes] = []
    present: list[bool] = []
    connector = new_client(settings, CONNECTOR_CLIENT_ID, protocol=MQTTProtocolVersion.MQTTv311, clean_session=False)
    connector.on_connect = lambda _c, _u, flags, _code, _p: present.append(flags.session_present)
    connector.on_message = lambda _c, _u, message: received.append(message.payload)
    connector.connect(settings.mqtt_host, settings.mqtt_port)
    end = time.monotonic() + 5
    while payload not in received and time.monotonic() < end:
        pump(connector, 0.05)
    connector.disconnect()
    return present == [True] and payload in received


def test_a_new_store_holds_the_connectors_session_before_any_device_connects(private_mosquitto: MqttSettings) -> None:
    """A first start, and a broker whose store is lost (its host replaced with an empty disk): rows published
    before the connector is back are queued for it, not acknowledged and dropped for want of a subscriber."""
    assert _row_reaches_a_connector_that_never_subscribed(private_mosquitto, b'{"first": "start"}')
    stop_server(Mosquitto(), f"127.0.0.1:{private_mosquitto.mqtt_port}", "Mosquitto")
    shutil.rmtree(paths.STATE_DIR / "mosquitto" / "data")
    manager.up([Mosquitto()])
    assert _row_reaches_a_connector_that_never_subscribed(private_mosquitto, b'{"store": "lost"}')
