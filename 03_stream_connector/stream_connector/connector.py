"""The MQTT -> Kafka bridge: rows in, one record per quantity out, nothing lost on a crash.

An MQTT row is acknowledged (manual PUBACK) only after Kafka confirmed every record made from it,
and the session is persistent (fixed client id, clean session off): rows the
connector read but did not finish, and rows published while it was down, are redelivered by the
broker when it comes back. A crash can therefore repeat rows, as exact copies of their records,
which the join engine and the database connector absorb.

One thread does everything: MQTT reads, splitting, `produce`, delivery callbacks and acks; the
Kafka client batches and sends in its own native threads.
"""
from __future__ import annotations

import dataclasses
import logging
import select
import signal
import time
from collections import deque
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from pipeline_core.kafka_clients import admin_client, produce, producer_config
from pipeline_core.logs import announce_ready
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import dead_letter, encode_record, record_key
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, ensure_topics, partition_count

from pipeline_core.mqtt import FastClient, new_client, pump
from .rows import split_row
from .settings import ConnectorSettings

log = logging.getLogger(__name__)

STAGE = "stream_connector"
# A dead letter that Kafka refuses for its size keeps this much of the payload, plus its size.
TRUNCATED_PAYLOAD_BYTES = 1_000_000
MAX_RECONNECT_DELAY_S = 5.0


class PendingRow:
    """An MQTT message whose records are on their way to Kafka; acked when `remaining` is 0."""

    __slots__ = ("mid", "qos", "remaining", "error")

    def __init__(self, mid: int, qos: int) -> None:
        self.mid = mid
        self.qos = qos
        self.remaining = 0
        self.error: KafkaError | None = None


@dataclass
class Counters:
    rows: int = 0
    records: int = 0
    dead_letters: int = 0
    rejected_rows: int = 0
    acked: int = 0
    reconnects: int = 0


class Connector:
    def __init__(self, settings: ConnectorSettings) -> None:
        self.settings = settings
        self.counters = Counters()
        self.producer = Producer(producer_config(settings.kafka_bootstrap_servers,
                                                 **{"linger.ms": settings.linger_ms}))
        self.client = self._new_mqtt_client()
        # Rows in arrival order: MQTT wants QoS 1 acks in the order the messages came.
        self.unacked: deque[PendingRow] = deque()
        self.subscribed = False
        self.stopping = False
        self.failure: str | None = None
        # Records go to the partition of their thing (see pipeline_core.partitioning): a joiner finds a machine's
        # joined quantities together. Read from the topic on start.
        self.data_partitions = MACHINE_DATA.partitions

    # --- MQTT side -----------------------------------------------------------------------------

    def _new_mqtt_client(self) -> FastClient:
        # MQTT 3.1.1, not 5: paho decodes MQTT 5 properties on every message, which cost ten
        # times the rest of reading a row (measured: 59 vs 5 µs per message).
        client = new_client(self.settings, self.settings.mqtt_client_id,
                            protocol=MQTTProtocolVersion.MQTTv311, clean_session=False, manual_ack=True)
        client.on_connect = self._on_connect
        client.on_subscribe = self._on_subscribe
        client.on_message = self._on_message
        return client

    def _connect(self) -> None:
        """Connect, retrying with growing pauses while the broker cannot be reached (or until stopped)."""
        delay = 0.2
        while not self.stopping:
            try:
                self.client.connect(self.settings.mqtt_host, self.settings.mqtt_port, keepalive=30)
                return
            except OSError as error:
                log.warning("MQTT broker %s:%d unreachable (%s); retrying in %.1f s", self.settings.mqtt_host,
                            self.settings.mqtt_port, error, delay)
                self.producer.poll(delay)  # meanwhile, Kafka deliveries still arrive
                delay = min(delay * 2, MAX_RECONNECT_DELAY_S)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.failure = f"MQTT broker refused the connection: {reason_code}"
            return
        log.info("connected to MQTT %s:%d as %r (session present: %s)", self.settings.mqtt_host,
                 self.settings.mqtt_port, self.settings.mqtt_client_id, flags.session_present)
        client.subscribe(self.settings.mqtt_topic, qos=1)
        # A present session still holds the subscription: rows flow (and come again) before the SUBACK.
        self.subscribed = self.subscribed or flags.session_present

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        refused = [code for code in reason_codes if code.is_failure]
        if refused:
            self.failure = f"MQTT broker refused the subscription to {self.settings.mqtt_topic!r}: {refused[0]}"
            return
        self.subscribed = True

    def _on_message(self, client, userdata, message) -> None:
        self.counters.rows += 1
        pending = PendingRow(message.mid, message.qos)
        self.unacked.append(pending)
        split = split_row(message.payload, self.settings.max_payload_bytes)
        delivered = self._delivery_callback(pending)
        data_topic = self.settings.data_topic
        partitions = self.data_partitions
        for record in split.records:
            thing = record["thing"]
            self._produce(data_topic, encode_record(record), record_key(thing, record["quantity"]),
                          pending, delivered, partition=thing_partition(thing, partitions))
        self.counters.records += len(split.records)
        if split.rejections:
            self.counters.rejected_rows += 1
            self._dead_letter(pending, delivered, "; ".join(split.rejections), message.payload, message.topic,
                              rejectedQuantities=split.rejected_quantities or None)

    def _ack_delivered(self) -> None:
        """Acknowledge, in order, every row whose records Kafka has all confirmed."""
        unacked, done = self.unacked, []
        while unacked and unacked[0].remaining == 0:
            pending = unacked[0]
            if pending.error is not None:
                self.failure = f"Kafka did not take a record: {pending.error}"
                break
            unacked.popleft()
            if pending.qos == 1:  # a QoS 0 row has nothing to acknowledge
                done.append(pending.mid)
        self.client.ack_all(done)
        self.counters.acked += len(done)

    # --- Kafka side ----------------------------------------------------------------------------

    def _delivery_callback(self, pending: PendingRow):
        """One callback for all records of a row: counts them down, keeps the first real error."""

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is not None and not self._dead_letter_refused_record(pending, delivered, error, message):
                pending.error = error
            pending.remaining -= 1

        return delivered

    def _produce(self, topic: str, value: bytes, key: str | None, pending: PendingRow, delivered,
                 **options: int) -> None:
        pending.remaining += 1
        produce(self.producer, topic, value, key, on_delivery=delivered, **options)

    def _dead_letter(self, pending: PendingRow, delivered, reason: str, payload: bytes, mqtt_topic: str,
                     **context) -> None:
        letter = dead_letter(reason, payload, STAGE, mqttTopic=mqtt_topic, **context)
        try:
            self._produce(self.settings.dlq_topic, letter, None, pending, delivered)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                raise
            pending.remaining -= 1
            log.error("dead letter of %d bytes is too large for Kafka; keeping the first %d bytes",
                      len(letter), TRUNCATED_PAYLOAD_BYTES)
            letter = dead_letter(f"{reason} (payload truncated to {TRUNCATED_PAYLOAD_BYTES} bytes for Kafka)",
                                 payload[:TRUNCATED_PAYLOAD_BYTES], STAGE, mqttTopic=mqtt_topic,
                                 payloadBytes=len(payload), **context)
            self._produce(self.settings.dlq_topic, letter, None, pending, delivered)
        self.counters.dead_letters += 1

    def _dead_letter_refused_record(self, pending: PendingRow, delivered, error: KafkaError,
                                    message: Message) -> bool:
        """A record Kafka refuses for itself (not for a broken connection) goes to the DLQ, not lost."""
        if message.topic() != self.settings.data_topic or error.retriable() or error.fatal():
            return False
        self._dead_letter(pending, delivered, f"Kafka refused the record: {error.str()}", message.value(),
                          self.settings.mqtt_topic, key=(message.key() or b"").decode(errors="replace"))
        return True

    # --- Life cycle ----------------------------------------------------------------------------

    def request_stop(self, signum: int, _frame) -> None:
        log.info("received %s: finishing what is in flight", signal.Signals(signum).name)
        self.stopping = True

    def run(self) -> int:
        """Bridge until SIGTERM/SIGINT or an unrecoverable error; returns the exit code."""
        admin = admin_client(self.settings.kafka_bootstrap_servers)
        deadline_s = self.settings.kafka_startup_deadline_s
        ensure_topics(admin, (dataclasses.replace(MACHINE_DATA, name=self.settings.data_topic),
                              dataclasses.replace(MACHINE_DLQ, name=self.settings.dlq_topic)), deadline_s=deadline_s)
        self.data_partitions = partition_count(admin, self.settings.data_topic, deadline_s)
        self._connect()
        ready = False
        next_report = time.monotonic() + self.settings.stats_interval_s
        reported = (time.monotonic(), 0, 0)
        while not self.stopping and self.failure is None:
            # While rows wait for Kafka, come back quickly to ack them; otherwise wait for input.
            rc = pump(self.client, 0.002 if self.unacked else 0.2)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._reconnect(rc)
            self.producer.poll(0)
            self._ack_delivered()
            if not ready and self.subscribed:
                ready = True
                announce_ready(log, f"stream connector {self.settings.mqtt_topic!r} -> "
                                    f"{self.settings.data_topic!r} (dead letters: {self.settings.dlq_topic!r})")
            if time.monotonic() >= next_report:
                reported = self._report(reported)
                next_report = time.monotonic() + self.settings.stats_interval_s
        return self._shutdown()

    def _reconnect(self, rc: MQTTErrorCode) -> None:
        log.warning("MQTT connection lost (%s); %d unacknowledged rows will be redelivered by the broker",
                    rc.name, len(self.unacked))
        # Their records may still reach Kafka; the broker sends the rows again, so they repeat exactly.
        self.unacked.clear()
        self.counters.reconnects += 1
        self._connect()

    def _report(self, previous: tuple[float, int, int]) -> tuple[float, int, int]:
        now, counters = time.monotonic(), self.counters
        elapsed = max(now - previous[0], 1e-9)
        log.info("rows %d (%.0f/s), records %d (%.0f/s), rejected rows %d, dead letters %d, "
                 "awaiting Kafka %d, reconnects %d", counters.rows, (counters.rows - previous[1]) / elapsed,
                 counters.records, (counters.records - previous[2]) / elapsed, counters.rejected_rows,
                 counters.dead_letters, len(self.unacked), counters.reconnects)
        return now, counters.rows, counters.records

    def _shutdown(self) -> int:
        """Flush Kafka, ack what it confirmed, then leave the broker; unread rows stay in the session."""
        left = self.producer.flush(self.settings.shutdown_timeout_s)
        if self.failure is None:
            self._ack_delivered()
        self._send_queued_packets(deadline_s=5.0)
        self.client.disconnect()
        counters = self.counters
        summary = (f"rows {counters.rows}, records {counters.records}, rejected rows {counters.rejected_rows}, "
                   f"dead letters {counters.dead_letters}, acknowledged {counters.acked}")
        if self.failure is not None:
            log.error("stopped: %s; %s (unacknowledged rows stay with the broker and come again)",
                      self.failure, summary)
            return 1
        if left:
            log.error("stopped with %d records unconfirmed by Kafka, their rows unacknowledged; %s", left, summary)
            return 1
        log.info("stopped cleanly: %s", summary)
        return 0

    def _send_queued_packets(self, deadline_s: float) -> None:
        """Write the pending PUBACKs without reading (and so starting) any further rows."""
        end = time.monotonic() + deadline_s
        sock = self.client.socket()
        while sock is not None and self.client.want_write() and time.monotonic() < end:
            select.select([], [sock], [], 0.05)
            if self.client.loop_write() != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return
