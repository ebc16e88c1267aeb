"""The simulator against the real Mosquitto, with a live QoS 1 subscriber counting what arrives: every row once,
each machine in order; a Thing the broker refuses in a topic under the fallback topic (which Things those are,
asked of the broker itself); a row the broker keeps refusing found, sent under the fallback topic or set aside;
SIGTERM and Ctrl-C ending a run within the stated bound while the broker is frozen."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion

from conftest import EVENTS_FILE
from connector_support import read_rows, run_simulator
from pipeline_core.mqtt import new_client, pump, wait_connected
from simulator.__main__ import STOP_DEADLINE_S
from simulator.publisher import Publisher
from simulator.topics import fits_a_level
from stack import supervision
from stack.processes import process_state
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


# --- names the broker refuses in a topic, and stopping --------------------------------------------

def broker_takes_topic(settings, topic: str) -> bool:
    """Whether Mosquitto acknowledges a QoS 1 PUBLISH under `topic`, or closes the connection instead."""
    client = new_client(settings, unique("topic-probe").replace(".", "-"), protocol=MQTTProtocolVersion.MQTTv311)
    client.connect(settings.mqtt_host, settings.mqtt_port)
    try:
        assert wait_connected(client, 10)
        info = client.publish(topic, b"probe", qos=1)
        end = time.monotonic() + 10
        while not info.is_published():
            if pump(client, 0.05) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return False
            assert time.monotonic() < end, f"neither a PUBACK nor a closed connection for {topic!r}"
        return True
    finally:
        client.disconnect()


# Every C0 and C1 control, DEL and the ASCII and Latin-1 characters around them, and the noncharacters and their
# neighbours in the BMP and the planes above.
PROBED = [*range(0x00, 0xA2), 0xD7FF, 0xE000, 0xFDCF, 0xFDD0, 0xFDEF, 0xFDF0, 0xFEFF, 0xFFFD, 0xFFFE, 0xFFFF,
          0x1FFFD, 0x1FFFE, 0x1FFFF, 0x2028, 0x10FFFD, 0x10FFFE, 0x10FFFF]


def test_a_thing_fits_a_topic_level_exactly_when_mosquitto_takes_the_topic(stack) -> None:
    base = f"test/{unique('probe')}/states"
    taken = {code_point: broker_takes_topic(stack, f"{base}/a{chr(code_point)}b") for code_point in PROBED
             if chr(code_point) not in "/+#"}
    assert not taken[0x09] and not taken[0x85] and taken[0x41]  # the probe tells the two apart
    assert {code_point: fits_a_level(f"a{chr(code_point)}b") for code_point in taken} == taken


REFUSED_THINGS = ["Press\t4", "Press 5\n", "\x00", "\x7f", "\x85", "\ufffe", "Line/Cell", "+", "$SYS"]


def test_rows_of_a_thing_the_broker_refuses_in_a_topic_go_under_the_fallback_topic_and_stall_nothing(
        stack, tmp_path) -> None:
    base = f"test/{unique('fallback')}/states"
    received: list[tuple[str, bytes]] = []
    subscribed = threading.Event()
    subscriber = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=unique("fallback-subscriber"))
    subscriber.on_message = lambda _c, _u, message: received.append((message.topic, message.payload))
    subscriber.on_subscribe = lambda *_args: subscribed.set()
    subscriber.connect(stack.mqtt_host, stack.mqtt_port)
    subscriber.subscribe(f"{base}/#", qos=1)
    subscriber.loop_start()
    try:
        wait_for(subscribed.is_set, 10, "SUBACK")
        things = ["M1", "Plant1.Hall2", *REFUSED_THINGS]
        rows = [{"Thing": thing, "Timestamp": 1_554_096_460_000 + 1000 * tick, "q": float(tick), "id": f"{n}/{tick}"}
                for tick in range(20) for n, thing in enumerate(things)]
        events = tmp_path / "rows.json"
        events.write_text("".join(json.dumps(row) + "\n" for row in rows))
        result = run_simulator(f"{base}/{{thing}}", "--events-file", str(events), "--order", "file", timeout_s=60)
        assert result.returncode == 0 and f"published {len(rows)} rows" in result.stdout \
            and ", 0 failures" in result.stdout, result.stdout + result.stderr
        assert "connection lost" not in result.stderr  # the broker never refused a row
        wait_for(lambda: len(received) >= len(rows), 30, f"{len(rows)} rows at the subscriber")
        arrived = [(topic, json.loads(payload)) for topic, payload in received]
        assert sorted(row["id"] for _topic, row in arrived) == sorted(row["id"] for row in rows)
        for topic, row in arrived:
            assert topic == (base if row["Thing"] in REFUSED_THINGS else f"{base}/{row['Thing']}"), (topic, row)
        for thing in things:
            assert [row["q"] for _topic, row in arrived if row["Thing"] == thing] == [float(tick) for tick in range(20)]
    finally:
        subscriber.loop_stop()
        subscriber.disconnect()


def test_a_row_the_broker_keeps_refusing_goes_under_the_fallback_topic_or_is_set_aside_and_the_rest_flow(
        stack) -> None:
    """What `fits_a_level` cannot foresee: the publisher finds the row the broker closes the connection on, sends
    it under the fallback topic, and sets it aside if the broker refuses it there too."""
    base = f"test/{unique('refused')}/states"
    for fallback, expected in ((base, "rerouted"), (f"{base}/re\tfused", "set aside")):
        publisher = Publisher(stack, unique("refused-publisher").replace(".", "-"), window=200,
                              fallback_topic=fallback)
        publisher.connect()
        for index in range(600):
            assert publisher.publish(f"{base}/a\tb" if index in (150, 151, 420) else f"{base}/m{index % 5}",
                                     json.dumps({"row": index}))
        assert publisher.drain(60) == 0
        publisher.close()
        if expected == "rerouted":
            assert (publisher.acked, publisher.set_aside, publisher.rerouted, publisher.failed) == (600, 0, 3, 0)
        else:
            assert (publisher.acked, publisher.set_aside, publisher.failed) == (597, 3, 3)


def bytes_unread_by(port: int) -> int:
    """Bytes the listener on `port` has not read of its connections (their receive queues, /proc/net/tcp)."""
    unread = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                unread += int(fields[4].split(":")[1], 16)
    return unread


def test_sigterm_and_ctrl_c_end_the_simulator_within_its_bound_saying_what_was_not_acknowledged(
        private_mosquitto, tmp_path) -> None:
    """A broker that stopped answering (frozen), rows of the simulator's unread in its socket: told to stop, the
    simulator waits at most STOP_DEADLINE_S for their acknowledgements, then ends and says how many did not come."""
    pid = supervision.process_info("mosquitto").pid
    arrived: set[str] = set()
    subscriber = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=unique("stop-subscriber"))
    subscriber.on_message = lambda _c, _u, message: arrived.add(message.topic.split("/")[1])
    subscriber.connect(private_mosquitto.mqtt_host, private_mosquitto.mqtt_port)
    subscriber.subscribe("test/#", qos=0)
    subscriber.loop_start()
    try:
        for signum in (signal.SIGTERM, signal.SIGINT):
            log_path = tmp_path / f"simulator-{signum.name}.log"
            with open(log_path, "wb") as log:
                simulator = subprocess.Popen(
                    [sys.executable, "-m", "simulator", "--mqtt-port", str(private_mosquitto.mqtt_port),
                     "--no-progress", "--synthetic", "--machines", "3", "--rate", "2000", "--window", "50",
                     "--mqtt-topic", f"test/{signum.name}/{{thing}}", "--replay-log", "none"],
                    stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_for(lambda: signum.name in arrived, 30, "rows of the simulator's at the broker")
                os.kill(pid, signal.SIGSTOP)
                try:
                    wait_for(lambda: process_state(pid) == "T", 10, "Mosquitto frozen")
                    wait_for(lambda: bytes_unread_by(private_mosquitto.mqtt_port) > 0, 10,
                             "rows the frozen broker has not read")
                    simulator.send_signal(signum)
                    simulator.wait(STOP_DEADLINE_S + 5)
                finally:
                    os.kill(pid, signal.SIGCONT)
            finally:
                simulator.kill()
            output = log_path.read_text()
            assert f"stopped by {signum.name}" in output and " not acknowledged" in output, output
            assert simulator.returncode == 1, output
    finally:
        subscriber.loop_stop()
        subscriber.disconnect()
