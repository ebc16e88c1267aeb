"""The 5,000 real rows through the real Mosquitto and Kafka: every quantity arrives once, in order."""
from __future__ import annotations

import json

from conftest import EVENTS_FILE
from connector_support import by_key, connector, expected_records, read_rows, run_simulator, topic_size  # noqa: F401
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import decode_record, record_key
from pipeline_core.topics import MACHINE_DATA
from support import read_topic


def test_replay_of_the_real_rows_gives_one_record_per_row_and_quantity(connector, bootstrap):
    bridge = connector()
    expected = expected_records(read_rows(EVENTS_FILE))
    assert len(expected) == 19_825  # the file's rows carry 1 to 8 quantities each

    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE))
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    assert "published 5000 rows" in simulated.stdout and ", 0 failures" in simulated.stdout

    messages = read_topic(bootstrap, bridge.data_topic, expected=len(expected), deadline_s=90)
    assert len(messages) == len(expected)
    records = [decode_record(message.value) for message in messages]
    for message, record in zip(messages, records):
        assert message.key.decode() == record_key(record["thing"], record["quantity"])
        # Every quantity of a machine in the partition of its thing: joiners find a key's streams together.
        assert message.partition == thing_partition(record["thing"], MACHINE_DATA.partitions)
    # Per key, Kafka holds the series exactly, in time order (the simulator's default order).
    wanted = {key: sorted(series, key=lambda r: r["phenomenonTime"]) for key, series in by_key(expected).items()}
    assert by_key(records) == wanted
    assert topic_size(bootstrap, bridge.dlq_topic) == 0
    assert bridge.process.poll() is None


def test_file_order_is_kept_per_key(connector, bootstrap):
    """`--order file` replays the rows as the file has them: late rows arrive late, as sent."""
    bridge = connector()
    rows = read_rows(EVENTS_FILE)[:600]
    expected = expected_records(rows)
    simulated = run_simulator(bridge.mqtt_topic, "--events-file", str(EVENTS_FILE), "--order", "file",
                              "--limit", "600")
    assert simulated.returncode == 0, simulated.stdout + simulated.stderr
    messages = read_topic(bootstrap, bridge.data_topic, expected=len(expected), deadline_s=60)
    assert by_key([json.loads(m.value) for m in messages]) == by_key(expected)
