"""The MQTT -> Kafka bridge: rows in, one record per quantity out, nothing lost on a crash.

An MQTT row is acknowledged (manual PUBACK) only after Kafka confirmed every record made from it,
and the session is persistent (fixed client id, clean session off): rows the
connector read but did not finish, and rows published while it was down, are redelivered by the
broker when it comes back. Of a row sent again only the records Kafka does not hold yet are written
(`redelivery.py`), so neither a crash nor a broker restart writes a record twice.

No row stops it. A row that is not a valid row (`pipeline_core.validation`), and a record Kafka
refuses for the record itself (too large), go to machine.dlq with the reason; should processing a
row fail in a way nobody foresaw, that row is dead-lettered too, so it cannot stop the connector
on every restart. Kafka being away is no fault of any row: the producer never gives up on a
record (no delivery timeout by default), the rows stay unacknowledged, and the broker queues the
rows behind them until Kafka is back. What a restart of the Kafka client fixes (a fatal producer
error, a deleted topic, a finite `--delivery-timeout-ms` running out) the connector does itself:
a fresh producer, and the broker sends the unacknowledged rows again. It exits only when it needs
someone: the broker refuses its credentials or subscription, or Kafka its access to a topic.

One thread does everything: MQTT reads, splitting, `produce`, delivery callbacks and acks; the
Kafka client batches and sends in its own native threads.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import select
import time
from collections import deque
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.kafka_clients import (ACCESS_ERRORS, KafkaStartupError, admin_client, produce, producer_config,
                                         refused_for_itself, retry_transient, security_config)
from pipeline_core.lifecycle import StopSignal
from pipeline_core.logs import announce_ready
from pipeline_core.mqtt import RECONNECT_BACKOFF, FastClient, new_client, pump
from pipeline_core.progress import Observation, ProgressReporter, StageCounters
from pipeline_core.records import dead_letter, payload_omitted
from pipeline_core.retry import Backoff, Retries
from pipeline_core.settings import MACHINE_STATES_TOPIC
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, ensure_topics, partition_count

from .filters import covers, parse_filters
from .partition_switch import PartitionSwitch, SwitchSettings
from .redelivery import (WrittenRecords, dead_letter_key, fence_transactional_id, read_tail, rejected_row_key,
                         settle_unseen_writes)
from .rows import kafka_messages, split_row
from .settings import ConnectorSettings

log = logging.getLogger(__name__)

STAGE = "stream_connector"
# Where devices publish (the broker's ACL): what the instances' filters together must cover.
DEVICE_TOPICS = f"{MACHINE_STATES_TOPIC}/#"
# A fresh Kafka client after a failure Kafka caused: no deadline (rows wait in the broker's queue meanwhile),
# pauses from 0.5 s up to this, back at the start once a record is delivered.
MAX_KAFKA_RETRY_DELAY_S = 30.0
# Records in the producer's queue before `produce` waits: far above what the broker's window of
# unacknowledged rows (max_inflight_messages) times a row's quantities can put there, so the loop
# never blocks on a full queue while Kafka is away (and keeps answering the broker's keepalive).
PRODUCER_QUEUE_MESSAGES = 1_000_000
# How long a look at the data topic's partition count may take (partition_switch): the loop waits for it.
PARTITION_COUNT_TIMEOUT_S = 2.0


class PendingRow:
    """An MQTT message whose records are on their way to Kafka; acked when `remaining` is 0.

    `failed`: a record of it did not reach Kafka for a reason not its own; the row must not be
    acknowledged, the broker sends it again. `abandoned`: the connector let the row go (a new MQTT
    connection or Kafka client); the broker sends it again, and late callbacks are ignored."""

    __slots__ = ("mid", "qos", "topic", "remaining", "failed", "abandoned")

    def __init__(self, mid: int, qos: int, topic: str) -> None:
        self.mid = mid
        self.qos = qos
        self.topic = topic  # the MQTT topic it came on: named in its dead letters
        self.remaining = 0
        self.failed = False
        self.abandoned = False


@dataclass
class ConnectorCounters(StageCounters):
    """records in: MQTT rows; records out: Kafka records made from them."""

    rejected_rows: int = 0
    acked: int = 0
    rows_done: int = 0  # rows whose records Kafka confirmed (or took as dead letters): acknowledged, or QoS 0 let go
    reconnects: int = 0
    kafka_restarts: int = 0
    redelivered_records: int = 0  # of rows sent again, records Kafka already held: not written twice
    redelivered_dead_letters: int = 0  # of rows sent again, dead letters Kafka already held or had on their way


class Connector:
    def __init__(self, settings: ConnectorSettings, stop: StopSignal | None = None) -> None:
        self.settings = settings
        self.topic_filters = parse_filters(settings.topic_filters)  # FilterError before anything starts
        self.stop = stop or StopSignal()
        self.counters = ConnectorCounters()
        self.progress: ProgressReporter | None = None
        self.producer = self._new_producer()
        self.client = self._new_mqtt_client()
        # Rows in arrival order: MQTT wants QoS 1 acks in the order the messages came.
        self.unacked: deque[PendingRow] = deque()
        self.subscribed = False
        self.rows_to_redeliver = 0
        # Set when the connector must stop: says what is wrong and what to do.
        self.failure: str | None = None
        # Set when Kafka failed in a way a fresh producer fixes; the loop restarts the Kafka side.
        self.kafka_trouble: str | None = None
        self.kafka_retries = Retries(Backoff(0.5, MAX_KAFKA_RETRY_DELAY_S))
        # Records go to the partition of their thing (see pipeline_core.partitioning): a joiner finds a machine's
        # joined quantities together. By which partition count: `switch` (set up on start, with the topic's count).
        self.data_partitions = MACHINE_DATA.partitions
        self.switch: PartitionSwitch | None = None
        self._admin = None  # for the data topic's partition count, once running
        # Record values Kafka confirmed lately: filled from machine.data's tail on start.
        self.written = WrittenRecords(settings.redelivery_window_records)
        self.dead_lettered = WrittenRecords(settings.redelivery_window_records)  # rows, by rejected_row_key
        # Record values handed to the producer and not yet confirmed or failed, each with the rows sent
        # again that wait for it too.
        self.in_flight: dict[bytes, list[PendingRow]] = {}
        # The same for dead letters, by rejected_row_key: a bad row sent again while its letter is on its way
        # waits for that letter instead of writing a second one.
        self.letters_in_flight: dict[bytes, list[PendingRow]] = {}

    def _new_producer(self) -> Producer:
        return Producer(producer_config(self.settings.kafka_bootstrap_servers, **security_config(self.settings), **{
            "linger.ms": self.settings.linger_ms,
            # 0 (the default): never give up on a record while Kafka is away; see the module docstring.
            "message.timeout.ms": self.settings.delivery_timeout_ms,
            "queue.buffering.max.messages": PRODUCER_QUEUE_MESSAGES}))

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
        pauses_s = RECONNECT_BACKOFF.pauses_s()
        while not self.stop.is_set():
            delay = next(pauses_s)
            try:
                self.client.connect(self.settings.mqtt_host, self.settings.mqtt_port, keepalive=30)
                return
            except OSError as error:
                log.warning("MQTT broker %s:%d unreachable (%s); retrying in %.1f s", self.settings.mqtt_host,
                            self.settings.mqtt_port, error, delay)
                self.producer.poll(delay)  # meanwhile, Kafka deliveries still arrive

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self.failure = (f"MQTT broker refused the connection: {reason_code}; check --mqtt-username/"
                            "--mqtt-password (MQTT_USERNAME/MQTT_PASSWORD) and the broker's ACL, then start again")
            return
        log.info("connected to MQTT %s:%d as %r (session present: %s)", self.settings.mqtt_host,
                 self.settings.mqtt_port, self.settings.mqtt_client_id, flags.session_present)
        client.subscribe([(topic_filter, 1) for topic_filter in self.topic_filters])
        # A present session still holds the subscription: rows flow (and come again) before the SUBACK.
        self.subscribed = self.subscribed or flags.session_present

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        refused = [code for code in reason_codes if code.is_failure]
        if refused:
            self.failure = (f"MQTT broker refused the subscription to {self.settings.topic_filters!r}: {refused[0]}; "
                            "check --topic-filters and the broker's ACL, then start again")
            return
        self.subscribed = True

    def _on_message(self, client, userdata, message) -> None:
        if self.switch.holding:  # unacknowledged until placed: see partition_switch
            self.switch.hold(message)
            return
        self.counters.records_in += 1
        pending = PendingRow(message.mid, message.qos, message.topic)
        self.unacked.append(pending)
        delivered = self._delivery_callback(pending)
        settings = self.settings
        try:
            try:
                split = split_row(message.payload, settings.max_payload_bytes, settings.max_quantities)
                # Every record encoded before the first is produced: a row goes out whole or not at all.
                records = kafka_messages(split.records, self.switch.partitions)
                # Not only rows flagged DUP: a publisher whose acknowledgement got lost in a broker restart
                # sends its row again as a new message (QoS 1 is at least once).
                records = self._not_yet_written(records, pending)
            except Exception as error:  # noqa: BLE001 - a defect this row shows: dead-letter it, never stop on it
                log.exception("could not process a row of %d bytes; dead-lettering it", len(message.payload))
                self.counters.rejected_rows += 1
                self._dead_letter(pending, delivered, f"the connector could not process the row: {error!r}"[:1000],
                                  message.payload, message.topic)
                return
            header = self.switch.header
            for value, key, partition in records:
                if self._produce(settings.data_topic, value, key, pending, delivered, partition=partition,
                                 headers=header):
                    self.in_flight[value] = []
            self.counters.records_out += len(records)
            if split.rejections:
                self.counters.rejected_rows += 1
                self._dead_letter(pending, delivered, "; ".join(split.rejections), message.payload, message.topic,
                                  rejectedQuantities=split.rejected_quantities or None)
        except KafkaException as error:  # the producer itself failed (fatal state, unknown topic, ...)
            self._kafka_failed(pending, error.args[0])

    def _not_yet_written(self, records: list, pending: PendingRow) -> list:
        """Of a row, the records Kafka neither holds nor will: all of them, unless the row was sent again. A record still on its
        way (its row let go at a reconnect while Kafka was away) is not sent again: the row waits for it."""
        missing = []
        for record in records:
            value = record[0]
            if value in self.written:
                continue
            waiting = self.in_flight.get(value)
            if waiting is None:
                missing.append(record)
            else:
                waiting.append(pending)
                pending.remaining += 1
        self.counters.redelivered_records += len(records) - len(missing)
        return missing

    def _ack_delivered(self) -> None:
        """Acknowledge, in order, every row whose records Kafka has all confirmed."""
        unacked, done, popped = self.unacked, [], 0
        while unacked and unacked[0].remaining == 0 and not unacked[0].failed:
            pending = unacked[0]
            unacked.popleft()
            popped += 1
            if pending.qos == 1:  # a QoS 0 row has nothing to acknowledge
                done.append(pending.mid)
        self.client.ack_all(done)
        self.counters.acked += len(done)
        self.counters.rows_done += popped

    # --- Kafka side ----------------------------------------------------------------------------

    def _delivery_callback(self, pending: PendingRow):
        """One callback for all records of a row: counts them down; a record Kafka refuses for itself
        is dead-lettered, any other failure keeps the row unacknowledged (see `_kafka_failed`)."""

        def delivered(error: KafkaError | None, message: Message) -> None:
            if message.topic() == self.settings.data_topic:
                value = message.value()
                if error is None:
                    self.written.add(value)
                    self.switch.delivered(message.partition(), message.offset())
                for waiting in self.in_flight.pop(value, ()):
                    self._settle_waiting(waiting, error)
            if pending.abandoned:
                return
            pending.remaining -= 1
            if error is None:
                self.kafka_retries.reset()
            elif refused_for_itself(error):
                try:
                    self._dead_letter_refused_record(pending, delivered, error, message.topic(), message.value(),
                                                     message.key())
                except KafkaException as failure:
                    self._kafka_failed(pending, failure.args[0])
            else:
                self._kafka_failed(pending, error)

        return delivered

    def _settle_waiting(self, pending: PendingRow, error: KafkaError | None) -> None:
        """A row sent again learns the fate of a record it did not send itself; should Kafka have refused
        it, the row stays unacknowledged and, sent again, writes the record itself."""
        if pending.abandoned:
            return
        pending.remaining -= 1
        if error is not None:
            self._kafka_failed(pending, error)

    def _last_resort_callback(self, pending: PendingRow):
        """The callback of a dead letter sent without its payload: if Kafka refuses even that, it
        takes someone to change the topic."""

        def delivered(error: KafkaError | None, _message: Message) -> None:
            if pending.abandoned:
                return
            pending.remaining -= 1
            if error is None:
                return
            if refused_for_itself(error):
                pending.failed = True
                self.failure = (f"Kafka refuses even a dead letter without payload on {self.settings.dlq_topic} "
                                f"({error.str()}): raise that topic's max.message.bytes, then start the connector "
                                "again")
            else:
                self._kafka_failed(pending, error)

        return delivered

    def _kafka_failed(self, pending: PendingRow, error: KafkaError) -> None:
        """A record did not reach Kafka, for no fault of its own: the row stays unacknowledged."""
        pending.failed = True
        if error.code() in ACCESS_ERRORS:
            self.failure = (f"Kafka refused access ({error.str()}): grant the connector's principal Describe "
                            f"and Write on the topics {self.settings.data_topic} and {self.settings.dlq_topic} "
                            "(and Create, or create them), then start it again")
        elif self.kafka_trouble is None:
            self.kafka_trouble = error.str()

    def _produce(self, topic: str, value: bytes, key: bytes | None, pending: PendingRow, delivered,
                 **options: object) -> bool:
        """Hand a record of `pending` to the producer; False if the client refused it at once for itself,
        which is then dealt with as a refusal on delivery (dead-lettered)."""
        pending.remaining += 1
        try:
            refused = produce(self.producer, topic, value, key, on_delivery=delivered, **options)
        except KafkaException:
            pending.remaining -= 1  # no callback will come for it
            raise
        if refused is None:
            return True
        pending.remaining -= 1
        self._dead_letter_refused_record(pending, delivered, refused, topic, value, key)
        return False

    def _dead_letter(self, pending: PendingRow, delivered, reason: str, payload: bytes, mqtt_topic: str,
                     **context) -> None:
        row = rejected_row_key(mqtt_topic, payload)
        if row in self.dead_lettered:  # a row sent again, whose dead letter Kafka holds already
            self.counters.redelivered_dead_letters += 1
            return
        waiting = self.letters_in_flight.get(row)
        if waiting is not None:  # a row sent again, whose dead letter is on its way: the row waits for it
            waiting.append(pending)
            pending.remaining += 1
            self.counters.redelivered_dead_letters += 1
            return
        # Never larger than Kafka takes: an over-size letter keeps the start of the payload and its size.
        letter = dead_letter(reason, payload, STAGE, mqttTopic=mqtt_topic, **context)
        if self._produce(self.settings.dlq_topic, letter, None, pending, self._remembering(row, delivered)):
            self.letters_in_flight[row] = []
        self.counters.dead_letters += 1

    def _remembering(self, row: bytes, delivered):
        """`delivered`, which also remembers the row once Kafka confirmed its dead letter, and settles the rows
        sent again that waited for it. A letter Kafka refuses for itself is sent again without its payload by
        the row that sent it, so those rows need nothing more."""

        def remembering(error: KafkaError | None, message: Message) -> None:
            if error is None:
                self.dead_lettered.add(row)
            settled = None if error is None or refused_for_itself(error) else error
            for waiting in self.letters_in_flight.pop(row, ()):
                self._settle_waiting(waiting, settled)
            delivered(error, message)

        return remembering

    def _dead_letter_refused_record(self, pending: PendingRow, delivered, error: KafkaError, topic: str,
                                    value: bytes | None, key: bytes | None) -> None:
        """A record Kafka refuses for itself goes to the DLQ, not lost. A dead letter refused for its
        size (a machine.dlq whose limit is below the letters') goes again without the payload (only
        its size); one refused even then needs someone."""
        if topic == self.settings.data_topic:
            self._dead_letter(pending, delivered, f"Kafka refused the record: {error.str()}", value,
                              pending.topic, key=(key or b"").decode(errors="replace") or None)
            return
        pending.remaining += 1
        refused = produce(self.producer, self.settings.dlq_topic, payload_omitted(value or b"", error.str(), STAGE),
                          None, on_delivery=self._last_resort_callback(pending))
        if refused is not None:
            self._last_resort_callback(pending)(refused, None)

    # --- Life cycle ----------------------------------------------------------------------------

    def _prepare_topics(self, *, without_end: bool = False) -> None:
        """Create the topics if missing and read the data topic's partitions. At start, Kafka has
        `--kafka-startup-deadline-s` to answer; `without_end` (a restart of the Kafka side while
        running) waits for it as long as it takes, as the rows wait in the broker's queue."""
        security = security_config(self.settings)
        admin = admin_client(self.settings.kafka_bootstrap_servers, **security)
        deadline_s = self.settings.kafka_startup_deadline_s
        if without_end:
            # Ask in rounds of a reporting interval, reporting between them: the heartbeat goes on saying the
            # connector waits for Kafka with rows in hand (stuck), where silence would say it hangs.
            deadline_s = min(deadline_s, self.settings.progress_interval_s)
        warn_at = 0.0
        while not self.stop.is_set():
            try:
                ensure_topics(admin, (dataclasses.replace(MACHINE_DATA, name=self.settings.data_topic),
                                      dataclasses.replace(MACHINE_DLQ, name=self.settings.dlq_topic)),
                              deadline_s=deadline_s)
                self.data_partitions = partition_count(admin, self.settings.data_topic, deadline_s)
                dlq_partitions = partition_count(admin, self.settings.dlq_topic, deadline_s)
                # What an earlier run wrote and a follower has not yet taken becomes readable first (redelivery.py).
                retry_transient(lambda: settle_unseen_writes(
                    self.settings.kafka_bootstrap_servers,
                    {self.settings.data_topic: self.data_partitions, self.settings.dlq_topic: dlq_partitions},
                    fence_transactional_id(self.settings.mqtt_client_id), security=security),
                    what="making every record Kafka holds readable before reading the topics' tails",
                    deadline_s=deadline_s)
                self.written = read_tail(self.settings.kafka_bootstrap_servers, self.settings.data_topic,
                                         self.data_partitions, self.settings.redelivery_window_records,
                                         security=security)
                self._start_switch(admin, security, deadline_s)
                self.dead_lettered = read_tail(self.settings.kafka_bootstrap_servers, self.settings.dlq_topic,
                                               dlq_partitions, self.settings.redelivery_window_records,
                                               functools.partial(dead_letter_key, STAGE), security=security)
                return
            except KafkaStartupError as error:
                if not without_end:
                    raise
                if self.progress is not None:
                    self.progress.maybe_report()
                if time.monotonic() >= warn_at:
                    log.warning("%s; still waiting for Kafka", error)
                    warn_at = time.monotonic() + self.settings.kafka_startup_deadline_s

    def _start_switch(self, admin, security: dict[str, str], deadline_s: float) -> None:
        """Which partition count records are placed by (partition_switch): the one this connector placed them by
        before, and where the topic ends now (what earlier runs placed lies below)."""
        topic = self.settings.data_topic
        offsets = BrokerOffsets(self.settings.kafka_bootstrap_servers, min(30.0, deadline_s), security=security)
        ends = retry_transient(
            lambda: offsets.latest([(topic, partition) for partition in range(self.data_partitions)])
            or _no_answer(topic), what=f"reading where {topic} ends", deadline_s=deadline_s)
        if self.switch is not None:
            self.switch.close()
        groups = tuple(group.strip() for group in self.settings.joiner_groups.split(",") if group.strip())
        self.switch = retry_transient(lambda: PartitionSwitch.started(
            SwitchSettings(topic, groups, self.settings.partition_check_interval_s, self.settings.switch_max_pause_s,
                           self.settings.switch_retry_s),
            self.settings.kafka_bootstrap_servers, self.settings.mqtt_client_id, self.data_partitions,
            {partition: end for (_, partition), end in ends.items()}, security),
            what="reading the partition counts this connector placed records by", deadline_s=deadline_s)
        self._admin = admin
        if self.switch.partitions != self.data_partitions:
            log.info("%s has %d partitions; records are placed by %d until the joiners have read every record "
                     "placed so", topic, self.data_partitions, self.switch.partitions)

    def _switch_step(self) -> None:
        """The partition switch's turn in the loop: look at the topic's partition count when due, hold rows while
        the joiners catch up, and place the held rows once it is decided by which count."""
        switch = self.switch
        if switch.check_due():
            switch.observed(self._data_partitions_now() or switch.topic_partitions)
        if not switch.holding:
            switch.should_hold()
            return
        if switch.step(bool(self.unacked or self.in_flight or self.letters_in_flight), self._producer_knows):
            for message in switch.release():
                self._on_message(self.client, None, message)

    def _producer_knows(self, partitions: int) -> bool:
        """Whether the producer's metadata holds `partitions` partitions of the data topic (the request refreshes it:
        a producer learns of new partitions only at its next refresh, and refuses a record for one it does not
        know)."""
        try:
            metadata = self.producer.list_topics(self.settings.data_topic, timeout=PARTITION_COUNT_TIMEOUT_S)
        except KafkaException:
            return False
        topic = metadata.topics.get(self.settings.data_topic)
        return topic is not None and topic.error is None and len(topic.partitions) >= partitions

    def _data_partitions_now(self) -> int | None:
        """The data topic's partition count as Kafka says now; None when it does not answer in time."""
        try:
            metadata = self._admin.list_topics(self.settings.data_topic,
                                               timeout=PARTITION_COUNT_TIMEOUT_S).topics.get(self.settings.data_topic)
        except KafkaException:
            return None
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return None
        return len(metadata.partitions)

    def _pause(self, seconds: float) -> None:
        """Wait, serving Kafka's callbacks, until `seconds` passed or a stop was requested."""
        end = time.monotonic() + seconds
        while not self.stop.is_set() and (left := end - time.monotonic()) > 0:
            self.producer.poll(min(left, 0.2))
            if self.progress is not None:
                self.progress.maybe_report()  # Kafka away: the restarts keep showing

    def run(self) -> int:
        """Bridge until SIGTERM/SIGINT or an error that needs someone; returns the exit code."""
        if not any(covers(topic_filter, DEVICE_TOPICS) for topic_filter in self.topic_filters):
            log.warning("this instance takes only part of %s (%s): the filters of the other instances must cover "
                        "the rest, since the broker drops a row no session subscribes to, unseen by any connector",
                        DEVICE_TOPICS, self.settings.topic_filters)
        self._prepare_topics()
        self._connect()
        ready = False
        progress = self.progress = ProgressReporter.for_stage(
            STAGE, self.counters, self.settings, observe=self._observe, logger=log, labels={"records_in": "rows in"},
            progress_counters=("rows_done",))
        while not self.stop.is_set() and self.failure is None:
            # While rows wait for Kafka, come back quickly to ack them; otherwise wait for input.
            rc = pump(self.client, 0.002 if self.unacked else 0.2)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._reconnect(rc)
            self.producer.poll(0)
            self._ack_delivered()
            if self.kafka_trouble is not None and self.failure is None:
                self._restart_kafka_side()
            elif self.failure is None:
                self._switch_step()
            if not ready and self.subscribed:
                ready = True
                announce_ready(log, f"stream connector {self.settings.topic_filters!r} -> "
                                    f"{self.settings.data_topic!r} (dead letters: {self.settings.dlq_topic!r})")
            progress.maybe_report()
        try:
            return self._shutdown()
        finally:
            progress.close()

    def _reconnect(self, rc: MQTTErrorCode) -> None:
        log.warning("MQTT connection lost (%s); %d unacknowledged rows will be redelivered by the broker",
                    rc.name, len(self.unacked))
        # Their records may still reach Kafka; the broker sends the rows again, so they repeat exactly.
        self._abandon_unacked()
        self.counters.reconnects += 1
        self._connect()

    def _abandon_unacked(self) -> None:
        for pending in self.unacked:
            pending.abandoned = True
        self.unacked.clear()
        if self.switch is not None:
            self.switch.abandon()

    def _restart_kafka_side(self) -> None:
        """A fresh producer, and a new MQTT connection on which the broker sends every unacknowledged
        row again, in order: what a restart of the connector would do, without exiting."""
        pause_s = self.kafka_retries.next_pause_s()
        log.error("Kafka did not take a record (%s): starting the Kafka client afresh in %.1f s; the broker sends "
                  "the %d unacknowledged rows again", self.kafka_trouble, pause_s, len(self.unacked))
        # Until the broker sends them again, the heartbeat still counts them as work waiting.
        self.rows_to_redeliver = len(self.unacked)
        self._abandon_unacked()
        # Dropped records (their callbacks report a purge, ignored) come again with their rows.
        self.producer.purge()
        self.producer.poll(0)
        self.in_flight.clear()
        self.letters_in_flight.clear()
        self._pause(pause_s)
        self.producer = self._new_producer()
        self.kafka_trouble = None
        self.counters.kafka_restarts += 1
        self._prepare_topics(without_end=True)
        self._connect()
        self.rows_to_redeliver = 0

    def _observe(self) -> Observation:
        # The lag: rows read from MQTT whose records Kafka has not all confirmed, so not acknowledged yet.
        # Work waiting as well: rows let go by a restart of the Kafka side, until the broker sends them again.
        switch = self.switch
        return Observation(lag=len(self.unacked) + len(switch.held), pending=self.rows_to_redeliver,
                           values={"kafka_queue": len(self.producer), "partitions_placed_by": switch.partitions,
                                   "data_partitions": switch.topic_partitions, "partition_switches": switch.switches},
                           waiting_for="Kafka" if self.rows_to_redeliver else None, note=switch.note)

    def _shutdown(self) -> int:
        """Flush Kafka, ack what it confirmed, then leave the broker; unread rows stay in the session."""
        left = self.producer.flush(self.settings.shutdown_timeout_s)
        if self.switch is not None:
            self.switch.close()  # held rows stay unacknowledged: the broker sends them again
        if self.failure is None:
            self._ack_delivered()
        self._send_queued_packets(deadline_s=5.0)
        self.client.disconnect()
        counters = self.counters
        summary = (f"rows {counters.records_in}, records {counters.records_out}, "
                   f"rejected rows {counters.rejected_rows}, "
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


def _no_answer(topic: str) -> dict:
    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no end offsets of {topic}"))
