"""Crash and shutdown: rows are acknowledged to MQTT only after Kafka has their records."""
from __future__ import annotations

import json

from conftest import EVENTS_FILE
from connector_support import (connector, expected_records, read_rows, run_simulator,  # noqa: F401
                               start_simulator, topic_size)
from support import read_topic, wait_for


def _canonical(record: dict) -> str:
    return json.dumps(record, sort_keys=True)


def test_kill_9_in_the_middle_of_a_replay_loses_no_record(connector, bootstrap):
    bridge = connector()
    expected = {_canonical(record) for record in expected_records(read_rows(EVENTS_FILE))}
    simulator = start_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE), "--rate", "1000")
    try:
        wait_for(lambda: topic_size(bootstrap, bridge.data_topic) >= 2_000, 60, "the first records in Kafka")
        bridge.kill()  # SIGKILL: rows read but not yet acknowledged must come again
        assert simulator.poll() is None, "the replay ended before the crash; the test needs it in flight"
        bridge.start()  # same client id: the broker kept the session and the rows sent meanwhile
        output, _ = simulator.communicate(timeout=120)
    finally:
        simulator.kill()
    assert simulator.returncode == 0, output

    def everything_arrived() -> list:
        values = [message.value.decode() for message in read_topic(bootstrap, bridge.data_topic, idle_s=1.0)]
        return values if {_canonical(json.loads(value)) for value in values} >= expected else []

    values = wait_for(everything_arrived, 90, "every record after the restart", interval_s=0.5)
    arrived = [_canonical(json.loads(value)) for value in values]
    assert set(arrived) == expected  # nothing missing
    # Rows the broker sent again after the crash wrote only what Kafka did not hold yet.
    assert len(arrived) == len(expected), f"{len(arrived) - len(expected)} records written twice"
    assert "session present: True" in bridge.log()


def test_sigterm_confirms_what_is_in_flight_and_exits_cleanly(connector, bootstrap):
    bridge = connector()
    rows = read_rows(EVENTS_FILE)[:300]
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE), "--order", "file",
                              "--limit", "300")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    count = len(expected_records(rows))
    wait_for(lambda: topic_size(bootstrap, bridge.data_topic) >= count, 60, "the records of all 300 rows")
    assert bridge.terminate() == 0, bridge.log()
    assert "stopped cleanly: rows 300," in bridge.log() and "acknowledged 300" in bridge.log()
    assert topic_size(bootstrap, bridge.data_topic) == count
