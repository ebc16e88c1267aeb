"""A SIGKILL of Mosquitto while rows wait in its queue for the stream connector.

The connector is stopped (as during its restart, or while it waits out a Kafka outage), 2,000 rows
are published at QoS 1 and every PUBACK comes back, and two seconds later Mosquitto is killed with
SIGKILL; supervisord starts it again, then the connector. Mosquitto keeps its queues in memory and
saves them every `autosave_interval` (02_mqtt_broker/README.md): the rows it acknowledged after
its last save are lost, any other row must reach machine.data. The figure is printed; the shipped
setting (a save every 2 s) keeps all 2,000 when the kill comes 2 s after the last row.
"""
from __future__ import annotations

import itertools
import json
import shutil
import time

import pytest

from chaos_support import (MOSQUITTO_SAVE_WINDOW_S, AckTimedPublisher, Fault, PrivateStack, canonical, chaos_workdir,
                           lost_to_broker_kill)
from connector_support import expected_records
from pipeline_core.health import mqtt_ready
from pipeline_core.settings import MACHINE_STATES_TOPIC
from pipeline_core.topics import MACHINE_DATA
from simulator.synthetic import synthetic_rows
from support import read_topic, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROWS = 2000


def test_a_sigkill_of_mosquitto_loses_only_rows_acknowledged_after_its_last_save():
    workdir = chaos_workdir("mosquitto-sigkill")
    stack = PrivateStack(workdir / "stack", "lsb")
    try:
        # Inside: an `up` that fails (a process never healthy) leaves the others running until `down`.
        stack.stack("up", timeout_s=900)
        stack.stop("stream-connector")
        rows = [json.dumps(row).encode()
                for row in itertools.islice(synthetic_rows(5, 1, 7, 1_554_076_800_000, 1000), ROWS)]
        publisher = AckTimedPublisher(stack.mqtt, "mosquitto-sigkill")
        publisher.connect(deadline_s=30)
        for payload in rows:
            publisher.publish(MACHINE_STATES_TOPIC, payload)
        assert publisher.drain(deadline_s=120) == 0, "rows the broker did not acknowledge"
        publisher.close()
        time.sleep(2.0)  # the fault's moment (rows acknowledged 2 s before the kill): not a synchronisation
        old_pid = stack.pid("mosquitto")
        stack.inject(Fault(0.0, "kill", "mosquitto"))
        wait_for(lambda: stack.pid("mosquitto") != old_pid and mqtt_ready("127.0.0.1", stack.mqtt.mqtt_port),
                 300, "supervisord to start Mosquitto again", interval_s=0.5)
        stack.start("stream-connector")

        records = {payload: {canonical(record) for record in expected_records([json.loads(payload)])}
                   for payload in rows}
        kill = stack.broker_kills[-1]
        # Saving works: its last save came at most a save interval (and a long save) before the kill. Were saving
        # broken, every row would be acknowledged after the last save, at risk, and losing them all would pass.
        assert kill.killed_at - kill.saved_at <= MOSQUITTO_SAVE_WINDOW_S, \
            f"Mosquitto's last save came {kill.killed_at - kill.saved_at:.1f} s before its SIGKILL: more than " \
            f"{MOSQUITTO_SAVE_WINDOW_S} s"
        at_risk = {payload for payload in rows if lost_to_broker_kill(publisher.acks[payload], [kill])}
        required = set().union(*(records[payload] for payload in rows if payload not in at_risk))

        previous: list[set[str]] = [set()]

        def settled() -> set[str]:
            """machine.data once it holds every row Mosquitto had saved and stopped growing."""
            found = {canonical(m.value) for m in read_topic(stack.bootstrap, MACHINE_DATA.name, idle_s=5.0,
                                                              deadline_s=300)}
            done, previous[0] = found >= required and found == previous[0], found
            return found if done else set()

        found = wait_for(settled, 600, "every row Mosquitto had saved in machine.data", interval_s=5.0)
        delivered = [payload for payload in rows if records[payload] <= found]
        lost = [payload for payload in rows if payload not in delivered]
        assert set(lost) <= at_risk
        print(f"Mosquitto SIGKILL 2 s after {ROWS} acknowledged rows (connector stopped): {len(delivered)} "
              f"reached machine.data, {len(lost)} lost; its last save was {kill.killed_at - kill.saved_at:.1f} s "
              f"before the kill, {len(at_risk)} rows acknowledged since")
    finally:
        stack.stack("down", timeout_s=300)
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when the run failed
