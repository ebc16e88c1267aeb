"""The wedged-consumer watch (`pipeline_core.group_watch`) with real clients: librdkafka's statistics of a consumer
not subscribed yet and of one in its group read as "up", Kafka's answer for a group is asked of the broker (and
missing where no broker listens), and a process ended as wedged exits at once with its exit status, without closing
its consumer.

The wedge itself (librdkafka's coordinator lookup stuck after a frozen broker) cannot be brought about on demand:
tests/integration/test_db_connector_commit.py meets it in some runs on a loaded machine and starts the connector
again when the watch ended it; the decision is tested on a clock of its own in tests/unit/test_group_watch.py."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import NewTopic

from pipeline_core.group_watch import (PROBE_TIMEOUT_S, WEDGED_CONSUMER_EXIT_CODE, GroupProbe, GroupWatch,
                                       group_handler_state)
from pipeline_core.kafka_clients import admin_client, consumer_config
from stack.processes import free_loopback_ports
from support import unique, wait_for

pytestmark = pytest.mark.integration


def _topic(bootstrap: str) -> str:
    topic = unique("group-watch")
    admin = admin_client(bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return topic


def _answer(probe: GroupProbe) -> bool:
    """Ask, and poll for the answer as a stage's loop does."""
    probe.ask()
    (answer,) = wait_for(lambda: (found := probe.answer()) is not None and (found,), PROBE_TIMEOUT_S + 20,
                         "the probe's answer")
    return answer


def test_a_consumer_in_its_group_reads_as_up_and_kafka_answers_for_the_group(bootstrap: str) -> None:
    topic, group = _topic(bootstrap), unique("group-watch")
    watch = GroupWatch.asking(group, lambda: admin_client(bootstrap))
    states: list[str] = []

    def on_statistics(statistics_json: str) -> None:
        handler = group_handler_state(statistics_json)
        states.append(handler.state if handler else "unreadable")
        watch.on_statistics(statistics_json)

    consumer = Consumer(consumer_config(bootstrap, group, **{"statistics.interval.ms": 200,
                                                             "stats_cb": on_statistics}))
    try:
        # Not subscribed yet (the DB connector subscribes once its sink answers, however long that takes): its group
        # handler finds the coordinator all the same, so the wait is no time outside the group.
        wait_for(lambda: consumer.poll(0.2) is None and states[-1:] == ["up"], 30,
                 "the unsubscribed consumer's statistics saying its group handler is up")
        assert watch.outside_s() == 0
        consumer.subscribe([topic])

        def assigned_and_up() -> bool:
            consumer.poll(0.2)
            return bool(consumer.assignment()) and states[-1:] == ["up"]

        wait_for(assigned_and_up, 60, "the consumer assigned, its statistics saying its group handler is up")
        assert "unreadable" not in states
        assert watch.outside_s() == 0
        watch.check()  # in its group: nothing to ask, nothing raised
        assert _answer(GroupProbe(group, lambda: admin_client(bootstrap)))
    finally:
        consumer.close()


def test_no_broker_is_no_answer_for_the_group() -> None:
    (port,) = free_loopback_ports(1)
    probe = GroupProbe("g", lambda: admin_client(f"127.0.0.1:{port}", log_level=0))
    assert _answer(probe) is False


def test_a_process_ended_as_wedged_exits_at_once_with_its_status(bootstrap: str) -> None:
    topic, group = _topic(bootstrap), unique("group-watch")
    script = textwrap.dedent(f"""
        import logging, time
        from confluent_kafka import Consumer
        from pipeline_core.group_watch import ConsumerWedged, end_wedged_process
        from pipeline_core.kafka_clients import consumer_config
        logging.basicConfig(level=logging.INFO)
        consumer = Consumer(consumer_config({bootstrap!r}, {group!r}))
        consumer.subscribe([{topic!r}])
        end = time.monotonic() + 60
        while not consumer.assignment() and time.monotonic() < end:
            consumer.poll(0.2)
        assert consumer.assignment(), "never assigned"
        end_wedged_process(ConsumerWedged("the test's consumer"), lambda: logging.info("the last report"))
        print("still running")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == WEDGED_CONSUMER_EXIT_CODE, done.stderr
    assert "still running" not in done.stdout
    assert "the test's consumer: ending the process" in done.stderr
    assert done.stderr.index("the last report") < done.stderr.index("ending the process")
