"""Shared confluent-kafka client configuration: every stage builds its clients here, and retries its
start-up calls through `retry_transient`."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from .records import DLQ_MAX_MESSAGE_BYTES
from .retry import Backoff
from .settings import DEFAULT_STARTUP_DEADLINE_S, KafkaSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a broker answers while it starts, creates its internal topics (__consumer_offsets,
# __transaction_state), loads a coordinator or elects a partition's leader, or while it cannot be
# reached: each passes by itself within seconds, so a start-up call asks again. librdkafka flags some
# of them retriable only in some contexts (a KafkaError made from the code alone is not), hence the list.
TRANSIENT_ERRORS = frozenset({
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.CONCURRENT_TRANSACTIONS,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._WAIT_COORD,
    # A node leaving the cluster's metadata (fenced, replaced) while a call waited on it.
    KafkaError._DESTROY_BROKER,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
})


class KafkaStartupError(SystemExit):
    """Kafka kept answering a transient error until the start-up deadline: the stage exits with this
    message, which says what to check."""


def is_transient(error: KafkaError) -> bool:
    """True for an error that passes by itself (see TRANSIENT_ERRORS, or flagged retriable); never a fatal one."""
    return not error.fatal() and (error.code() in TRANSIENT_ERRORS or error.retriable())


def is_fatal(error: KafkaError) -> bool:
    """True when the client serves nothing any more and only a new one helps. librdkafka reports a fatal consumer
    error as _FATAL, not always flagged fatal (a static member fenced by a newer member with its
    group.instance.id, as after its coordinator was cut off): a stage that only logged it turned idle for good."""
    return error.fatal() or error.code() == KafkaError._FATAL


def raise_partition_errors(partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
    """The partitions of a per-partition answer (e.g. `Consumer.committed`), raising the first one's error."""
    partitions = list(partitions)
    for partition in partitions:
        if partition.error is not None:
            raise KafkaException(partition.error)
    return partitions


def retry_transient(call: Callable[[], T], *, what: str, deadline_s: float = DEFAULT_STARTUP_DEADLINE_S,
                    max_pause_s: float = 1.0, while_waiting: Callable[[], object] | None = None) -> T:
    """`call()`, asked again with growing pauses while it raises a transient `KafkaException`;
    `while_waiting()` runs after each transient answer, the last included (a progress report: the stage's
    heartbeat stays fresh, and says what it waits for).

    Any other error is raised at once. Past `deadline_s` a transient one ends the start-up with a
    `KafkaStartupError` naming `what` was being done, the broker's last answer and what to check. It is
    a `SystemExit`: raise it only where the process may end, never on a thread another library runs."""
    end = time.monotonic() + deadline_s
    # Bound: `deadline_s` in all, pauses from 50 ms up to `max_pause_s`.
    pauses_s = Backoff(min(0.05, max_pause_s), max_pause_s).pauses_s()
    pause = next(pauses_s)
    last_logged: int | None = None
    while True:
        try:
            return call()
        except KafkaException as exception:
            error = exception.args[0]
            if not isinstance(error, KafkaError) or not is_transient(error):
                raise
            if while_waiting is not None:
                # Also when this answer ends the wait: one attempt may block as long as the whole deadline.
                while_waiting()
            if time.monotonic() + pause > end:
                raise KafkaStartupError(
                    f"{what}: Kafka still answered {error.name()} ({error.str()}) after {deadline_s:.0f} s. "
                    "Check that Kafka runs and is healthy (`make status`, `make logs SERVICE=kafka`) and that "
                    "the pipeline's topics exist (`python -m stack topics`), then start again; "
                    "KAFKA_STARTUP_DEADLINE_S sets how long to wait.") from exception
            if error.code() != last_logged:  # once per kind of answer, not once per attempt
                log.info("%s: Kafka answered %s, asking again for up to %.0f s", what, error.name(),
                         end - time.monotonic())
                last_logged = error.code()
        time.sleep(pause)
        pause = next(pauses_s)


# Delivery errors caused by the record itself (its size, its format): no retry or restart helps,
# the record goes to the dead-letter topic. Every other delivery error is Kafka's or the client's.
RECORD_ERRORS = frozenset((KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                           KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG_SIZE))
# Errors only an administrator fixes (credentials, ACLs).
ACCESS_ERRORS = frozenset((KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                           KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED))


def refused_for_itself(error: KafkaError) -> bool:
    """True when Kafka refused a record for what the record is."""
    return error.code() in RECORD_ERRORS and not error.fatal()


def security_config(settings: KafkaSettings) -> dict[str, str]:
    """The librdkafka settings that make a client the principal of `settings` (empty for PLAINTEXT): pass them
    to every producer, consumer and admin client as overrides (`producer_config(..., **security)`)."""
    protocol = settings.kafka_security_protocol.upper()
    config: dict[str, str] = {}
    if protocol != "PLAINTEXT":
        config["security.protocol"] = protocol
    if protocol.startswith("SASL"):
        if not settings.kafka_sasl_username or not settings.kafka_sasl_password:
            raise SystemExit(f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD "
                             "(a secure native stack's entry points read them from its credentials file)")
        config.update({"sasl.mechanism": settings.kafka_sasl_mechanism,
                       "sasl.username": settings.kafka_sasl_username,
                       "sasl.password": settings.kafka_sasl_password})
    if protocol.endswith("SSL") and settings.kafka_ssl_ca_location:
        config["ssl.ca.location"] = settings.kafka_ssl_ca_location
    return config


def java_security_options(settings: KafkaSettings, prefix: str = "kafka.") -> dict[str, str]:
    """The same identity for a Java Kafka client (Spark's Kafka source: prefix `kafka.`). The JAAS entry
    holds the password: never log these options."""
    protocol = settings.kafka_security_protocol.upper()
    if protocol == "PLAINTEXT":
        return {}
    options = {"security.protocol": protocol}
    if protocol.startswith("SASL"):
        security_config(settings)  # the same check of user and password
        module = ("org.apache.kafka.common.security.scram.ScramLoginModule"
                  if settings.kafka_sasl_mechanism.upper().startswith("SCRAM")
                  else "org.apache.kafka.common.security.plain.PlainLoginModule")
        options.update({"sasl.mechanism": settings.kafka_sasl_mechanism,
                        "sasl.jaas.config": f'{module} required username="{settings.kafka_sasl_username}" '
                                            f'password="{settings.kafka_sasl_password}";'})
    if protocol.endswith("SSL") and settings.kafka_ssl_ca_location:
        options.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": settings.kafka_ssl_ca_location})
    return {prefix + key: value for key, value in options.items()}


# How long any client's request waits for a broker's answer (librdkafka's socket.timeout.ms, a minute by default;
# the Java clients' request.timeout.ms in Spark's source). A frozen node (a hung JVM, a host cut off without a reset)
# keeps its connections open, so only this ends a request to it: with the default minute, a Kafka node of the
# cluster SIGSTOPped held the stream connector's produce requests, and the whole pipeline behind them, for 60-68 s,
# long after the controller had fenced the node (9 s) and its partitions led from the others; transactional commits
# waited alike. After this long the client asks the node's successor. Ten seconds leave a loaded machine's slowest
# answers (a transaction's commit, a fetch's 0.5 s wait) far inside it.
REQUEST_TIMEOUT_MS = 10_000
# How long one transactional call (sending the input offsets, a commit, an abort) may take: a request to a frozen
# coordinator timing out, the coordinator moving, the call asked again. librdkafka may wait without bound while
# the group coordinator is unknown (see `call_bounded`): past this the exactly-once stages let go of the producer
# and its transaction. With the transaction timeout (a minute) as the bound, a frozen node coordinating the Spark
# joiner's group held it for 94 s of a 120 s freeze.
TRANSACTIONAL_CALL_TIMEOUT_S = 3 * REQUEST_TIMEOUT_MS / 1000


def producer_config(bootstrap_servers: str, **overrides: Any) -> dict[str, Any]:
    """An idempotent producer: acks=all, no reordering or duplicates on retry, batched by linger."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        # Large enough for a dead letter that carries a rejected oversized payload.
        "message.max.bytes": DLQ_MAX_MESSAGE_BYTES + 64 * 1024,
        "socket.timeout.ms": REQUEST_TIMEOUT_MS,
    }
    config.update(overrides)
    return config


def transactional_producer_config(bootstrap_servers: str, transactional_id: str,
                                  **overrides: Any) -> dict[str, Any]:
    """A producer whose writes and consumer offsets commit atomically (exactly-once stages)."""
    # librdkafka refuses a request timeout longer than the transaction timeout (+100 ms).
    request_timeout_ms = min(REQUEST_TIMEOUT_MS, int(overrides.get("transaction.timeout.ms", REQUEST_TIMEOUT_MS)))
    return producer_config(bootstrap_servers, **{"transactional.id": transactional_id,
                                                 "socket.timeout.ms": request_timeout_ms, **overrides})


def consumer_config(bootstrap_servers: str, group_id: str, **overrides: Any) -> dict[str, Any]:
    """A consumer that only sees committed transactions and commits offsets itself."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "fetch.max.bytes": DLQ_MAX_MESSAGE_BYTES * 2,
        "max.partition.fetch.bytes": DLQ_MAX_MESSAGE_BYTES + 64 * 1024,
        # A subscribed topic deleted and created again is noticed (and assigned again) within this, not the
        # default five minutes (see pipeline_core.data_loss).
        "topic.metadata.refresh.interval.ms": 10_000,
        "socket.timeout.ms": REQUEST_TIMEOUT_MS,
    }
    config.update(overrides)
    return config


def produce(producer: Producer, topic: str, value: bytes | None, key: bytes | str | None = None,
            **options: Any) -> KafkaError | None:
    """`producer.produce`, waiting for deliveries to drain the local queue when it is full
    instead of failing with BufferError.

    Returns None once the record is queued, or the client's error when it refuses the record for the
    record itself (`refused_for_itself`: larger than the producer's message.max.bytes): nothing was
    sent and no delivery callback comes, so the caller dead-letters it (or sends a smaller letter),
    as for a record Kafka refuses on delivery. Every other error is not the record's and is raised."""
    while True:
        try:
            producer.produce(topic, value, key, **options)
            return None
        except BufferError:
            producer.poll(0.05)
        except KafkaException as exception:
            error = exception.args[0]
            if isinstance(error, KafkaError) and refused_for_itself(error):
                return error
            raise


class KafkaCallWedged(RuntimeError):
    """A client call outlived its bound (`call_bounded`): it still runs on its own thread, and its client may
    be used for nothing else; the caller replaces the client."""


def call_bounded(call: Callable[[], T], timeout_s: float, *, what: str,
                 while_waiting: Callable[[], object] | None = None, slice_s: float = 0.5) -> T:
    """`call()` on a thread of its own, waited for at most `timeout_s`; `while_waiting()` runs every `slice_s`
    meanwhile (a progress report: the stage's heartbeat says it waits instead of going stale).

    For client calls whose own timeout librdkafka does not always keep: `send_offsets_to_transaction` waits
    without bound while the group coordinator is unknown or its broker was decommissioned (librdkafka issues
    5456 and 5511), as seen with two of three Kafka nodes stopped and started again. Raises what the call
    raised, or `KafkaCallWedged` past `timeout_s` (the call goes on in the background: drop its client)."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exception:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exception
        finally:
            done.set()

    threading.Thread(target=run, name=f"kafka-call: {what}", daemon=True).start()
    end = time.monotonic() + timeout_s
    while not done.wait(max(0.0, min(slice_s, end - time.monotonic()))):
        if time.monotonic() >= end:
            raise KafkaCallWedged(f"{what} did not return within {timeout_s:.0f} s")
        if while_waiting is not None:
            while_waiting()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def drop_producer(producer: Producer) -> None:
    """Let go of a producer that was replaced (fenced, fatal, or with a call still wedged): its queued records are
    purged on a thread of its own, since a call of it may still wait and destroying a client waits for its broker
    threads."""

    def purge() -> None:
        try:
            producer.purge()
        except KafkaException as error:  # a fatal producer may refuse even this; it goes all the same
            log.debug("purging a replaced producer: %s", error)

    threading.Thread(target=purge, name="kafka-producer-drop", daemon=True).start()


def admin_client(bootstrap_servers: str, **overrides: Any) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap_servers, "socket.timeout.ms": REQUEST_TIMEOUT_MS, **overrides})


def kafka_ready(bootstrap_servers: str, timeout: float = 2.0, security: Mapping[str, str] | None = None) -> bool:
    """True when a broker answers a metadata request (of a client with `security`, on a secure listener)."""
    try:
        # Quiet: "connection refused" is the expected answer while a broker starts.
        metadata = admin_client(bootstrap_servers, log_level=0, **(security or {})).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(metadata.brokers)


def wait_for_kafka(bootstrap_servers: str, deadline_s: float = 60.0, security: Mapping[str, str] | None = None) -> None:
    """Poll the broker's metadata until it answers, or raise TimeoutError at the deadline."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if kafka_ready(bootstrap_servers, timeout=min(2.0, max(0.1, end - time.monotonic())), security=security):
            return
    raise TimeoutError(f"Kafka at {bootstrap_servers} did not answer within {deadline_s:.0f} s")
