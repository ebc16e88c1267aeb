"""`retry_transient`, the start-up retry of every stage: which of Kafka's answers it asks again after, and
how it gives up; `call_bounded`, which bounds a client call librdkafka may wait on forever; and how long a
transactional request waits for a broker that does not answer. Real
`KafkaError` codes, raised as confluent-kafka raises them (`KafkaException(KafkaError)`)."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from pipeline_core.kafka_clients import (REQUEST_TIMEOUT_MS, KafkaCallWedged, KafkaStartupError,
                                         call_bounded, consumer_config, is_transient, producer_config,
                                         raise_partition_errors, retry_transient,
                                         transactional_producer_config)

# What a broker answers while it starts, creates __consumer_offsets or __transaction_state, loads a
# coordinator or elects a leader, or while it cannot be reached.
TRANSIENT = [
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
]
# Answers no waiting changes: a wrong configuration, missing rights, a bad request.
PERMANENT = [
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.INVALID_CONFIG,
    KafkaError.INVALID_PARTITIONS,
    KafkaError._INVALID_ARG,
    KafkaError._FENCED,
]


class FailsThenAnswers:
    """A Kafka call that raises `error` the first `failures` times, then returns 'answer'."""

    def __init__(self, error: KafkaError, failures: int) -> None:
        self.error = error
        self.failures = failures
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(self.error)
        return "answer"


@pytest.mark.parametrize("code", TRANSIENT, ids=lambda code: KafkaError(code).name())
def test_a_transient_answer_is_asked_again_until_kafka_answers(code: int) -> None:
    call = FailsThenAnswers(KafkaError(code), failures=3)
    assert is_transient(KafkaError(code))
    assert retry_transient(call, what="reading offsets", deadline_s=10, max_pause_s=0.01) == "answer"
    assert call.calls == 4


@pytest.mark.parametrize("code", PERMANENT, ids=lambda code: KafkaError(code).name())
def test_a_permanent_answer_is_raised_at_once(code: int) -> None:
    call = FailsThenAnswers(KafkaError(code), failures=1)
    assert not is_transient(KafkaError(code))
    with pytest.raises(KafkaException) as raised:
        retry_transient(call, what="reading offsets", deadline_s=10, max_pause_s=0.01)
    assert raised.value.args[0].code() == code
    assert call.calls == 1


def test_a_fatal_error_is_raised_at_once_even_with_a_transient_code() -> None:
    call = FailsThenAnswers(KafkaError(KafkaError.NOT_COORDINATOR, "fenced for good", fatal=True), failures=1)
    with pytest.raises(KafkaException):
        retry_transient(call, what="initialising transactions", deadline_s=10, max_pause_s=0.01)
    assert call.calls == 1


def test_an_error_librdkafka_flags_retriable_is_asked_again() -> None:
    error = KafkaError(KafkaError.OFFSET_NOT_AVAILABLE, "not yet", retriable=True)
    assert KafkaError.OFFSET_NOT_AVAILABLE not in PERMANENT and is_transient(error)
    call = FailsThenAnswers(error, failures=2)
    assert retry_transient(call, what="reading offsets", deadline_s=10, max_pause_s=0.01) == "answer"


def test_other_exceptions_pass_through() -> None:
    def broken() -> None:
        raise ValueError("not Kafka's")

    with pytest.raises(ValueError):
        retry_transient(broken, what="anything", deadline_s=10)


def test_past_the_deadline_the_start_fails_with_a_message_saying_what_to_do() -> None:
    call = FailsThenAnswers(KafkaError(KafkaError.NOT_COORDINATOR), failures=10**9)
    with pytest.raises(KafkaStartupError) as raised:
        retry_transient(call, what="reading the sink's last committed batch", deadline_s=0.3, max_pause_s=0.02)
    message = str(raised.value)
    assert message.startswith("reading the sink's last committed batch: Kafka still answered NOT_COORDINATOR")
    assert "make status" in message and "KAFKA_STARTUP_DEADLINE_S" in message
    assert isinstance(raised.value, SystemExit)  # the stage exits with the message, not a traceback
    assert isinstance(raised.value.__cause__, KafkaException)
    assert call.calls > 2


def test_per_partition_errors_become_the_exception_retry_transient_classifies() -> None:
    ok = TopicPartition("machine.out", 0, 5)
    assert raise_partition_errors([ok]) == [ok]
    # A TopicPartition's error is read-only: only an answer from a broker sets it.
    failed = SimpleNamespace(topic="machine.out", partition=1, offset=-1001,
                             error=KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
    with pytest.raises(KafkaException) as raised:
        raise_partition_errors([ok, failed])
    assert raised.value.args[0].code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS


def test_a_bounded_call_returns_what_the_call_returns_or_raises():
    assert call_bounded(lambda: 42, 5.0, what="answering") == 42

    def timing_out():
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    with pytest.raises(KafkaException):
        call_bounded(timing_out, 5.0, what="timing out")


def test_a_call_past_its_bound_is_wedged_and_the_caller_reports_meanwhile():
    release = threading.Event()
    reports = []
    try:
        with pytest.raises(KafkaCallWedged, match="send_offsets_to_transaction did not return within"):
            call_bounded(lambda: release.wait(60), 0.3, what="send_offsets_to_transaction",
                         while_waiting=lambda: reports.append(1), slice_s=0.05)
        assert reports  # the caller's loop went on turning (its heartbeat) while the call waited
    finally:
        release.set()  # the abandoned call ends


@pytest.mark.parametrize("transaction_timeout_ms, request_timeout_ms", [(None, 10_000), (120_000, 10_000),
                                                                        (5_000, 5_000)])
def test_a_transactional_request_waits_for_a_silent_broker_at_most_its_bound(transaction_timeout_ms,
                                                                             request_timeout_ms) -> None:
    """A frozen coordinator holds a transactional call for the request timeout, not librdkafka's minute; never more
    than the transaction timeout, which librdkafka refuses (the producer is made, so it accepted the pair)."""
    overrides = {} if transaction_timeout_ms is None else {"transaction.timeout.ms": transaction_timeout_ms}
    config = transactional_producer_config("127.0.0.1:9", "t.bound", **overrides)
    assert config["socket.timeout.ms"] == request_timeout_ms == min(REQUEST_TIMEOUT_MS,
                                                                    transaction_timeout_ms or REQUEST_TIMEOUT_MS)
    Producer(config).flush(0)


@pytest.mark.parametrize("make_config", [lambda: producer_config("127.0.0.1:9"),
                                         lambda: consumer_config("127.0.0.1:9", "g.bound")])
def test_every_client_waits_for_a_silent_broker_at_most_the_request_timeout(make_config) -> None:
    """A frozen node holds a request of any client for REQUEST_TIMEOUT_MS, not librdkafka's minute: the stream
    connector's produce requests held the whole pipeline that long. librdkafka accepts the setting."""
    config = make_config()
    assert config["socket.timeout.ms"] == REQUEST_TIMEOUT_MS < 60_000
    (Producer if "group.id" not in config else Consumer)(config)
