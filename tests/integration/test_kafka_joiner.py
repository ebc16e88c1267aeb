"""The standalone Kafka joiner against real Kafka: its committed machine.out equals the offline engine's
join on the same records, exactly once, through file-order input, crashes and a second instance; with the
input partitioned by thing (as the stream connector writes it) and by key (repartitioned first)."""
from __future__ import annotations

import dataclasses
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from clock_support import as_given_up, engine_join, given_up
from conftest import EVENTS_FILE
from connector_support import ConnectorProcess, run_simulator
from kafka_joiner_support import (JoinerProcess, as_multiset, delete_internal_topics, key_of, new_group,
                                  offline_join, read_outputs, records_in, restart_after_a_quiet_machine,
                                  rows_as_records)
from kafka_joiner.changelog import STATE_TOPIC_CONFIG
from kafka_joiner.settings import KafkaJoinerSettings
from pipeline_core.kafka_clients import admin_client, consumer_config, producer_config
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import encode_record
from pipeline_core.topics import MACHINE_DATA, TopicSpec, ensure_topics
from pipeline_core.mqtt import drop_session
from support import produce_records, read_topic, unique, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def joiners(bootstrap: str, tmp_path: Path) -> Iterator[list[JoinerProcess]]:
    """Joiner subprocesses of one test; killed, and their internal topics deleted, afterwards."""
    started: list[JoinerProcess] = []
    yield started
    # A joiner that failed by itself explains whatever the test saw: show its log.
    failures = [f"{joiner.log_path} (exit {joiner.process.returncode}):\n{joiner.log()}"
                for joiner in started if joiner.failed()]
    for joiner in started:
        joiner.close()
    delete_internal_topics(bootstrap, sorted({joiner.group_id for joiner in started}))
    assert not failures, "a joiner failed:\n" + "\n".join(failures)


@pytest.fixture(params=["by_thing", "by_key"])
def by_thing(request: pytest.FixtureRequest) -> bool:
    """Input partitioned by thing, joined where it lies; or by key, repartitioned by the joiner first."""
    return request.param == "by_thing"


def start_joiner(joiners: list[JoinerProcess], bootstrap: str, topics, group: str, tmp_path: Path,
                 instance_id: str | None = None, by_thing: bool = False, extra: tuple[str, ...] = ()) -> JoinerProcess:
    extra = ("--input-partitioned-by-thing", *extra) if by_thing else extra
    joiner = JoinerProcess(bootstrap, topics, group, tmp_path, instance_id, *extra)
    joiners.append(joiner)
    return joiner.start()


def test_time_order_replay_equals_offline_join(bootstrap, new_topics, joiners, tmp_path, by_thing) -> None:
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, rejected = offline_join(records)
    assert expected and not rejected
    # Its first progress report comes at its stop: with news to report, after the last commit.
    joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path, by_thing=by_thing,
                          extra=("--progress-interval-s", "3600"))
    produce_records(bootstrap, topics.data, records, key=key_of, by_thing=by_thing)

    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert all(m.key.decode() == f"{json.loads(m.value)['thing']}.{json.loads(m.value)['quantity']}"
               for m in outputs)
    assert read_topic(bootstrap, topics.dlq, idle_s=0.5) == []
    assert joiner.terminate() == 0
    # A clean stop: its last progress report measured the lag before the consumer closed.
    assert "stopped" in joiner.log() and "could not measure" not in joiner.log()


def test_simulator_to_joined_output_as_make_up_runs_it(stack, bootstrap, new_topics, joiners, tmp_path) -> None:
    """The path of `make up` + `make data`: simulator -> MQTT -> stream connector, which writes each thing to
    its partition -> the joiner joining records where they lie. machine.out equals the offline join."""
    topics = new_topics()
    name = unique("pipeline").replace(".", "-")
    connector = ConnectorProcess(mqtt_topic=f"test/{name}/states", client_id=name, data_topic=topics.data,
                                 dlq_topic=topics.dlq, log_path=tmp_path / "connector.log")
    try:
        connector.start()
        joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path, by_thing=True)
        simulated = run_simulator(connector.mqtt_topic, "--events-file", str(EVENTS_FILE))
        assert simulated.returncode == 0, simulated.stdout + simulated.stderr
        expected, _ = offline_join(rows_as_records(EVENTS_FILE, time_order=True))

        outputs = read_outputs(bootstrap, topics.out, len(expected))
        assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
        assert read_topic(bootstrap, topics.dlq, idle_s=0.5) == []
        assert joiner.terminate() == 0
    finally:
        connector.close()
        drop_session(stack, name)


def test_file_order_dead_letters_late_and_malformed_records_and_joins_the_rest(bootstrap, new_topics, joiners, tmp_path,
                                                                             by_thing) -> None:
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=False)  # the file's own order: many late records
    # Its jumps of days back and forth are clock faults to the clock rule too: records it gives up after holding.
    expected, rejected, dropped = engine_join(records)
    assert rejected and dropped
    joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path, by_thing=by_thing)
    produce_records(bootstrap, topics.data, records, key=key_of, by_thing=by_thing)
    # Malformed input with keys of joined quantities: dead letters with the reason, the joiner stays up.
    malformed = {
        b"{not json": "malformed JSON",
        b'{"thing": "R0815", "quantity": "actSpeed_C11", "result": 1.0}': "missing field(s): phenomenonTime",
        b'{"thing": "R0815", "quantity": "actSpeed_C11", "phenomenonTime": 1554096460415, "result": NaN}':
            "result must be a finite number",
        b'{"thing": "X1", "quantity": "actSpeed_C11", "phenomenonTime": 1554096460415, "result": 1.0}':
            "does not match",
    }
    producer = Producer(producer_config(bootstrap))
    for payload in malformed:
        producer.produce(topics.data, payload, key=b"R0815.actSpeed_C11")
    assert producer.flush(30) == 0

    dead = read_topic(bootstrap, topics.dlq, expected=len(rejected) + len(dropped) + len(malformed), deadline_s=90)
    envelopes = [json.loads(m.value) for m in dead]
    assert all(e["stage"] == "kafka_joiner" and e["topic"] == topics.data for e in envelopes)
    assert given_up(envelopes) == as_given_up(dropped)
    envelopes = [e for e in envelopes if "offset" in e]  # the records dead-lettered as they came
    assert all(e["offset"] >= 0 for e in envelopes)
    late = [e for e in envelopes if e["reason"].startswith(("out_of_order:", "conflict:"))]
    assert as_multiset([e["payload"].encode() for e in late]) == as_multiset(rejected)
    reasons = {e["payload"].encode(): e["reason"] for e in envelopes if e not in late}
    assert set(reasons) == set(malformed)
    assert all(why in reasons[payload] for payload, why in malformed.items())
    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert len(read_topic(bootstrap, topics.dlq, idle_s=0.5)) == len(envelopes) + len(dropped)  # each once
    assert joiner.alive()


def test_backlog_in_some_partitions_while_the_others_stay_empty(bootstrap, new_topics, joiners, tmp_path) -> None:
    """Two keys fill at most two of the five input partitions before the joiner starts; the others stay
    empty. Holding partitions back for one that has not delivered yet must neither stall the backlog for
    good nor let a key's two streams drift apart into forcing."""
    topics = new_topics()
    joined = {"actSpeed_C11", "vaTorque_C11"}
    records = [r for r in rows_as_records(EVENTS_FILE, time_order=True)
               if r["thing"] == "R0815" and r["quantity"] in joined]
    expected, _ = offline_join(records)
    assert len(expected) > 100
    produce_records(bootstrap, topics.data, records, key=key_of)
    joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path)

    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert "forced out" not in joiner.log()
    assert joiner.terminate() == 0


def test_partitioned_by_thing_dead_letters_a_record_in_another_partition(bootstrap, new_topics, joiners,
                                                                         tmp_path) -> None:
    """A record outside its thing's partition cannot meet its partner there: it is dead-lettered with the
    reason, and the records where they belong still join exactly."""
    topics = new_topics()
    records = [r for r in rows_as_records(EVENTS_FILE, time_order=True) if r["thing"] == "R0815"]
    stray = next(r for r in records if r["quantity"] == "actSpeed_C11")
    records.remove(stray)
    expected, _ = offline_join(records)
    joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path, by_thing=True)
    produce_records(bootstrap, topics.data, records, key=key_of, by_thing=True)
    partitions = MACHINE_DATA.partitions
    home = thing_partition("R0815", partitions)
    producer = Producer(producer_config(bootstrap))
    producer.produce(topics.data, encode_record(stray), key=key_of(stray), partition=(home + 1) % partitions)
    assert producer.flush(30) == 0

    [dead] = read_topic(bootstrap, topics.dlq, expected=1, deadline_s=60)
    envelope = json.loads(dead.value)
    assert envelope["reason"].startswith("misrouted: thing 'R0815' belongs in partition")
    assert json.loads(envelope["payload"]) == stray and envelope["partition"] == (home + 1) % partitions
    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert joiner.terminate() == 0


def produce_paced(bootstrap: str, topic: str, records: list[dict], chunks: int, by_thing: bool,
                  pause_s: float = 0.0) -> Iterator[int]:
    """Produce in `chunks` parts, yielding after each (and pausing, to spread the input over time)."""
    size = -(-len(records) // chunks)
    for start in range(0, len(records), size):
        produce_records(bootstrap, topic, records[start:start + size], key=key_of, by_thing=by_thing)
        yield start + size
        time.sleep(pause_s)  # pacing the input, not waiting for anything


# The seeded moments of the six kills: the same on every run, so a failure comes again.
KILL_MOMENTS_SEED = 20261206


def test_kill_9_at_random_moments_loses_and_repeats_nothing(bootstrap, new_topics, joiners, tmp_path, by_thing) -> None:
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, _ = offline_join(records)
    rng = random.Random(KILL_MOMENTS_SEED)
    joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path, instance_id="crashy", by_thing=by_thing)
    # Input keeps flowing in a background thread while the joiner is killed and restarted, so kills land
    # mid-transaction, mid-rebuild and between transactions alike.
    producer = threading.Thread(target=lambda: list(produce_paced(bootstrap, topics.data, records, chunks=40,
                                                                  by_thing=by_thing, pause_s=0.25)))
    producer.start()
    try:
        for _ in range(6):
            moment = time.monotonic() + rng.uniform(0.1, 2.0)
            wait_for(lambda: time.monotonic() >= moment, 10, "a random moment")
            joiner.kill()
            joiner.start()
    finally:
        producer.join(120)
    assert joiner.kills == 6 and joiner.runs == 7  # each kill confirmed: the joiner ran, and the SIGKILL ended it

    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert joiner.terminate() == 0


def test_two_instances_one_stopped_midway(bootstrap, new_topics, joiners, tmp_path, by_thing) -> None:
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, _ = offline_join(records)
    group = new_group()
    first = start_joiner(joiners, bootstrap, topics, group, tmp_path, by_thing=by_thing)
    second = None
    for produced in produce_paced(bootstrap, topics.data, records, chunks=4, by_thing=by_thing):
        if second is None:
            # Alone in the group, the first instance holds every partition, so it joins this chunk's records
            # (its progress line says so, on an interval). After the rebalance it may hold only partitions
            # without records: with input partitioned by thing, three machines fill three of five.
            wait_for(lambda: records_in(first.log()) > 0, 60, "the first instance to report records in")
            second = start_joiner(joiners, bootstrap, topics, group, tmp_path, by_thing=by_thing)
            wait_for(lambda: "assigned" in second.log(), 30, "the second instance to get partitions")
        elif first.alive():
            assert first.terminate() == 0  # leaves the group: its partitions move to the second instance

    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert records_in(first.log()) > 0 and records_in(second.log()) > 0
    assert second.terminate() == 0


def test_a_restart_re_reads_a_bounded_amount_however_long_a_quiet_machine_holds_records(
        bootstrap, new_topics, joiners, tmp_path, by_thing) -> None:
    """A machine that goes quiet keeps records held for as long as it stays quiet. A restart must not
    re-read its partition from the oldest of them: the held records come back from the changelog, and the
    input is read on from where the last commit left it. The quiet machine's records, when it speaks
    again, still pair with what it held, so the output equals the offline join."""
    topics = new_topics()
    run = restart_after_a_quiet_machine(bootstrap, topics, joiners, tmp_path, by_thing, busy_ticks=4_000)
    assert run.re_read <= 500 < run.busy_records // 40  # one consume batch at most, however much the others sent
    assert 0 < run.restored < 100  # the records each machine's join holds, the quiet one's among them
    # The changelog holds what changed per commit, compacted after a minute: less than the input, and with
    # input partitioned by thing, whose backlog commits every 100 ms, a few records per key and commit.
    assert run.changelog_read < (run.busy_records // 10 if by_thing else 2 * run.busy_records)


def test_a_deleted_state_topic_is_rebuilt_from_the_input_without_a_repeat(bootstrap, new_topics, joiners, tmp_path,
                                                                          by_thing) -> None:
    """Half the replay, the joiner stopped and its state topic deleted, the other half: the restarted joiner
    finds the changelog short of its committed offsets, rebuilds the state from the input with its outputs
    suppressed, and the output is the offline join exactly, dead letters once each."""
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=False)[:3000]  # file order: dead letters too
    expected, rejected = offline_join(records)
    first_half = records[:len(records) // 2]
    expected_first, rejected_first = offline_join(first_half)
    assert 0 < len(expected_first) < len(expected) and rejected_first
    joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path, by_thing=by_thing)
    produce_records(bootstrap, topics.data, first_half, key=key_of, by_thing=by_thing)
    read_outputs(bootstrap, topics.out, len(expected_first))
    read_topic(bootstrap, topics.dlq, expected=len(rejected_first))
    assert joiner.terminate() == 0

    state_topic = KafkaJoinerSettings(group_id=joiner.group_id, input_topic=topics.data,
                                      input_partitioned_by_thing=by_thing).state_topic_name()
    admin = admin_client(bootstrap)
    admin.delete_topics([state_topic], operation_timeout=30)[state_topic].result(30)
    wait_for(lambda: state_topic not in admin.list_topics(timeout=10).topics, 60, "the state topic to be gone")
    produce_records(bootstrap, topics.data, records[len(first_half):], key=key_of, by_thing=by_thing)
    joiner.start()

    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    letters = [json.loads(m.value) for m in read_topic(bootstrap, topics.dlq, idle_s=1.0)]
    assert as_multiset([letter["payload"].encode() for letter in letters]) == as_multiset(rejected)
    assert "rebuilding the join state" in joiner.log()
    assert joiner.terminate() == 0


def test_a_rebuild_past_retention_warns_and_counts_the_records_gone(bootstrap, new_topics, joiners, tmp_path) -> None:
    """The state topic deleted after retention took the input's first records: the rebuild cannot be complete,
    and the joiner says by how many records, per partition, instead of rebuilding silently from what is left."""
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)[:2000]
    expected, _ = offline_join(records)
    joiner = start_joiner(joiners, bootstrap, topics, new_group(), tmp_path, by_thing=True)
    produce_records(bootstrap, topics.data, records, key=key_of, by_thing=True)
    read_outputs(bootstrap, topics.out, len(expected))
    assert joiner.terminate() == 0

    admin = admin_client(bootstrap)
    consumer = Consumer(consumer_config(bootstrap, unique("watermarks")))
    try:
        filled = [partition for partition in range(MACHINE_DATA.partitions)
                  if consumer.get_watermark_offsets(TopicPartition(topics.data, partition), timeout=10)[1] > 100]
    finally:
        consumer.close()
    assert filled
    for future in admin.delete_records([TopicPartition(topics.data, partition, 100) for partition in filled],
                                       request_timeout=30).values():
        future.result(30)  # what retention would have done: the first 100 records of each partition are gone
    state_topic = KafkaJoinerSettings(group_id=joiner.group_id, input_topic=topics.data,
                                      input_partitioned_by_thing=True).state_topic_name()
    admin.delete_topics([state_topic], operation_timeout=30)[state_topic].result(30)
    wait_for(lambda: state_topic not in admin.list_topics(timeout=10).topics, 60, "the state topic to be gone")
    joiner.start()

    wait_for(lambda: len(re.findall(r"misses the first (\d+) records", joiner.log())) == len(filled), 60,
             "a warning per rebuilt partition")
    assert [int(count) for count in re.findall(r"misses the first (\d+) records", joiner.log())] == [100] * len(filled)


def test_bad_state_records_and_an_over_size_dead_letter_never_stop_the_joiner(
        bootstrap, new_topics, _created_topics, joiners, tmp_path) -> None:
    """Two entrances besides the input, in one run.

    The changelog is a plain topic: whatever else lands there (a key that is no record position, a value that is
    no record) must not stop the joiner taking its partitions. Each such record is dead-lettered with its place
    in the changelog and tombstoned in the same transaction, so a restart does not dead-letter it again.

    A DLQ topic made with a lower max.message.bytes than the pipeline's: a bad input record of control
    characters, six times as large JSON-escaped, would make a letter the broker refuses, aborting the
    transaction on every try. The joiner sizes its letters by the topic's limit: the letter keeps reason,
    origin and the payload's size. The input joins exactly throughout."""
    topics = new_topics()
    small_dlq = f"{topics.dlq}.small"
    ensure_topics(admin_client(bootstrap), (TopicSpec(small_dlq, 3, {"max.message.bytes": "100000"}),))
    _created_topics.append(small_dlq)
    topics = dataclasses.replace(topics, dlq=small_dlq)
    group = new_group()
    state_topic = f"{group}.{topics.data}.state"
    ensure_topics(admin_client(bootstrap), (TopicSpec(state_topic, MACHINE_DATA.partitions, STATE_TOPIC_CONFIG),))
    home = thing_partition("R0815", MACHINE_DATA.partitions)
    bad_state = [(b"abc", b"x", home), ((7).to_bytes(8, "big"), b"{not a record", home),
                 ((8).to_bytes(8, "big"), b'{"thing": "R0815"}', (home + 1) % MACHINE_DATA.partitions)]
    landed = {}
    producer = Producer(producer_config(bootstrap))
    for key, value, partition in bad_state:
        producer.produce(state_topic, value, key, partition=partition,
                         on_delivery=lambda error, message: landed.update(
                             {(message.partition(), message.offset()): message.value()}))
    assert producer.flush(30) == 0 and len(landed) == len(bad_state)
    records = [r for r in rows_as_records(EVENTS_FILE, time_order=True) if r["thing"] == "R0815"]
    expected, _ = offline_join(records)
    joiner = start_joiner(joiners, bootstrap, topics, group, tmp_path, by_thing=True)
    payload = b"\x01" * 60_000
    producer.produce(topics.data, payload, key=b"R0815.actSpeed_C11", partition=home)
    assert producer.flush(30) == 0
    produce_records(bootstrap, topics.data, records, key=key_of, by_thing=True)

    outputs = read_outputs(bootstrap, topics.out, len(expected))
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    dead = read_topic(bootstrap, small_dlq, expected=len(bad_state) + 1, deadline_s=60)
    envelopes = [json.loads(m.value) for m in dead]
    from_state = [e for e in envelopes if e["topic"] == state_topic]
    assert {(e["partition"], e["offset"]): e["payload"].encode() for e in from_state} == landed
    assert all(e["stage"] == "kafka_joiner" and e["reason"].startswith("state record dropped: ") for e in from_state)
    [over_size] = [(m.value, e) for m, e in zip(dead, envelopes) if e["topic"] == topics.data]
    letter, envelope = over_size
    assert len(letter) <= 100_000 and envelope["payloadBytes"] == len(payload)
    assert envelope["reason"].startswith("malformed JSON") and envelope["offset"] == 0
    assert payload.startswith(envelope["payload"].encode())
    assert joiner.terminate() == 0
    joiner.start()  # restores from the changelog again: the dropped records are gone from it
    produce_records(bootstrap, topics.data, [dict(records[-1], phenomenonTime=records[-1]["phenomenonTime"] + 1)],
                    key=key_of, by_thing=True)  # a record to commit a transaction with
    wait_for(lambda: records_in(joiner.log()) > 0, 60, "the restarted joiner to read the new record")
    assert len(read_topic(bootstrap, small_dlq, idle_s=2.0)) == len(dead)
    assert joiner.terminate() == 0
