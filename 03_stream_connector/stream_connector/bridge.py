"""Each MQTT row along its way into Kafka, one method per step of `row_state.py`.

`read` (a row read from MQTT: its records and dead letter handed to the producer, then it is sent; while the
partition switch holds rows, a row that arrives waits there unread and unacknowledged, and is read once released),
`_answered` (Kafka's answer to one of them: settled, or replaced by a dead letter, or the row failed),
`acknowledge_confirmed` (the confirmed rows at the front, in arrival order), `_fail`, `let_go_all`.

A record Kafka refuses for the record itself (too large, invalid) goes to machine.dlq in its place; a row
that breaks the rules goes there with the reason (`rows.py`); should processing a row fail in a way nobody
foresaw, that row is dead-lettered too, so it cannot stop the connector on every restart. What is no
fault of the row (Kafka away, a fatal producer error, refused access) fails it, and the connector is told
(`kafka_failed`): it starts its Kafka side afresh, or stops.
"""
from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Message

from pipeline_core.kafka_clients import produce, refused_for_itself
from pipeline_core.progress import StageCounters
from pipeline_core.records import dead_letter, payload_omitted
from pipeline_core.retry import Retries

from .kafka_side import TopicsRead, new_producer
from .partition_switch import PartitionSwitch
from .redelivery import Redelivery, rejected_row_key
from .row_state import CONFIRMED, LET_GO, Row
from .rows import kafka_messages, split_row
from .settings import ConnectorSettings

log = logging.getLogger(__name__)

STAGE = "stream_connector"


class Bridge:
    """The rows on their way and the producer that writes their records.

    `counters` must count `rejected_rows`, `redelivered_records` and `redelivered_dead_letters` besides a stage's;
    `kafka_retries` is reset whenever Kafka confirms a record; `kafka_failed(error)` hears of every failure that
    is not a record's own, `needs_someone(what to do)` of a refusal only an operator can lift."""

    def __init__(self, settings: ConnectorSettings, counters: StageCounters, kafka_retries: Retries, *,
                 kafka_failed: Callable[[KafkaError], None], needs_someone: Callable[[str], None]) -> None:
        self.settings = settings
        self.counters = counters
        self.producer = new_producer(settings)
        # Rows read and not acknowledged yet, in arrival order: MQTT wants QoS 1 acks in the order the messages came.
        self.unacked: deque[Row] = deque()
        self.redelivery = Redelivery(settings.redelivery_window_records)
        # Records go to the partition of their thing (see pipeline_core.partitioning): a joiner finds a machine's
        # joined quantities together. By which partition count: the switch, set up with the topic's count on start.
        self.switch: PartitionSwitch | None = None
        self._kafka_retries = kafka_retries
        self._kafka_failed = kafka_failed
        self._needs_someone = needs_someone

    def topics_read(self, topics: TopicsRead) -> None:
        """What the topics hold, read at a start of the Kafka side (`kafka_side.read_topics`)."""
        self.redelivery.records.held, self.redelivery.letters.held = topics.written, topics.dead_lettered
        if self.switch is not None:
            self.switch.close()
        self.switch = topics.switch

    # --- the steps of a row's way ----------------------------------------------------------------

    def read(self, client, userdata, message) -> None:
        """A row read from MQTT: its records, and its dead letter if part of it is rejected, handed to the
        producer; then it is sent (or, waiting for nothing, confirmed)."""
        if self.switch.holding:  # unacknowledged until placed: see partition_switch
            self.switch.hold(message)
            return
        self.counters.records_in += 1
        row = Row(message.mid, message.qos, message.topic)
        self.unacked.append(row)
        try:
            self._send(row, message.payload)
        except KafkaException as error:  # the producer itself failed (fatal state, unknown topic, ...)
            self._fail(row, error.args[0])
        row.sent()

    def _send(self, row: Row, payload: bytes) -> None:
        settings, counters = self.settings, self.counters
        try:
            split = split_row(payload, settings.max_payload_bytes, settings.max_quantities)
            # Every record encoded before the first is produced: a row goes out whole or not at all.
            records = kafka_messages(split.records, self.switch.partitions)
            # Not only rows flagged DUP: a publisher whose acknowledgement got lost in a broker restart
            # sends its row again as a new message (QoS 1 is at least once).
            missing = self.redelivery.records_to_write(records, row)
            counters.redelivered_records += len(records) - len(missing)
        except Exception as error:  # noqa: BLE001 - a defect this row shows: dead-letter it, never stop on it
            log.exception("could not process a row of %d bytes; dead-lettering it", len(payload))
            counters.rejected_rows += 1
            self._dead_letter(row, f"the connector could not process the row: {error!r}"[:1000], payload)
            return
        answered = functools.partial(self._answered, row, None)  # one callback for all records of the row
        header = self.switch.header
        for value, key, partition in missing:
            if self._produce(settings.data_topic, value, key, row, answered, partition=partition, headers=header):
                self.redelivery.records.sent(value)
        counters.records_out += len(missing)
        if split.rejections:
            counters.rejected_rows += 1
            self._dead_letter(row, "; ".join(split.rejections), payload,
                              rejectedQuantities=split.rejected_quantities or None)

    def _answered(self, row: Row, letter: bytes | None, error: KafkaError | None, message: Message) -> None:
        """Kafka's answer to a record of `row`, or to its dead letter (`letter`: the row's rejected_row_key). The
        rows sent again that waited for the same record learn it too. Confirmed: settled. Refused for the record
        itself: a record is dead-lettered, a dead letter sent again without its payload, and that settles it.
        Any other failure is not the record's: the row fails."""
        refused = error is not None and refused_for_itself(error)
        if letter is None:
            waiting = self.redelivery.records.answered(message.value(), error)
            if error is None:
                self.switch.delivered(message.partition(), message.offset())
            settles = error  # a row that waited for a record Kafka refused writes it itself, sent again
        else:
            waiting = self.redelivery.letters.answered(letter, error)
            settles = None if refused else error  # the letter goes again without payload, from `row`: enough for them
        for other in waiting:
            self._settle_waiting(other, settles)
        if row.state is LET_GO:  # the broker sends the row again: this answer is not its any more
            return
        if error is None:
            self._kafka_retries.reset()
        elif refused:
            try:
                self._replace_refused(row, error, message.topic(), message.value(), message.key())
            except KafkaException as failure:
                self._fail(row, failure.args[0])
        else:
            self._fail(row, error)
        row.settled()

    def _settle_waiting(self, row: Row, error: KafkaError | None) -> None:
        """A row sent again learns the fate of a record it did not send itself; should Kafka have refused
        it, the row fails and, sent again, writes the record itself."""
        if row.state is LET_GO:
            return
        if error is not None:
            self._fail(row, error)
        row.settled()

    def acknowledge_confirmed(self) -> list[int]:
        """Every row at the front whose records Kafka has all confirmed, acknowledged in arrival order: the message
        ids to PUBACK (a QoS 0 row has none)."""
        unacked, mids, popped = self.unacked, [], 0
        while unacked and unacked[0].state is CONFIRMED:
            row = unacked.popleft()
            row.acknowledge()
            popped += 1
            if row.qos == 1:
                mids.append(row.mid)
        self.counters.acked += len(mids)
        self.counters.rows_done += popped
        return mids

    def _fail(self, row: Row, error: KafkaError) -> None:
        """A record of `row` did not reach Kafka, for no fault of its own: the row stays unacknowledged."""
        row.fail()
        self._kafka_failed(error)

    def let_go_all(self) -> None:
        """Every unacknowledged row back to the broker, which sends them again (the rows the switch holds too):
        their records may still reach Kafka, so the copies repeat exactly, and only what Kafka does not hold is
        written again."""
        for row in self.unacked:
            row.let_go()
        self.unacked.clear()
        if self.switch is not None:
            self.switch.abandon()

    def busy(self) -> bool:
        """Whether a row waits for Kafka, or a record of a row let go is still on its way."""
        return bool(self.unacked) or self.redelivery.any_on_their_way()

    def drop_on_their_way(self) -> None:
        """Before a fresh producer: the records the old one holds are dropped (their answers report a purge,
        ignored), to come again with their rows."""
        self.producer.purge()
        self.producer.poll(0)
        self.redelivery.forget_on_their_way()

    # --- what a row sends ------------------------------------------------------------------------

    def _produce(self, topic: str, value: bytes, key: bytes | None, row: Row, answered, **options: object) -> bool:
        """Hand a record of `row` to the producer; False if the client refused it at once for itself,
        which is then dealt with as a refusal on delivery (dead-lettered)."""
        row.awaits()
        try:
            refused = produce(self.producer, topic, value, key, on_delivery=answered, **options)
        except KafkaException:
            row.settled()  # no answer will come for it
            raise
        if refused is None:
            return True
        self._replace_refused(row, refused, topic, value, key)
        row.settled()
        return False

    def _dead_letter(self, row: Row, reason: str, payload: bytes, **context) -> None:
        letter = rejected_row_key(row.topic, payload)
        if not self.redelivery.letters.to_write(letter, row):  # held already, or on its way (the row waits for it)
            self.counters.redelivered_dead_letters += 1
            return
        # Never larger than Kafka takes: an over-size letter keeps the start of the payload and its size.
        envelope = dead_letter(reason, payload, STAGE, mqttTopic=row.topic, **context)
        if self._produce(self.settings.dlq_topic, envelope, None, row, functools.partial(self._answered, row, letter)):
            self.redelivery.letters.sent(letter)
        self.counters.dead_letters += 1

    def _replace_refused(self, row: Row, error: KafkaError, topic: str, value: bytes | None,
                         key: bytes | None) -> None:
        """A record Kafka refuses for itself goes to the DLQ, not lost. A dead letter refused for its
        size (a machine.dlq whose limit is below the letters') goes again without the payload (only
        its size); one refused even then needs someone (`_last_resort_answered`)."""
        if topic == self.settings.data_topic:
            self._dead_letter(row, f"Kafka refused the record: {error.str()}", value,
                              key=(key or b"").decode(errors="replace") or None)
            return
        row.awaits()
        answered = functools.partial(self._last_resort_answered, row)
        refused = produce(self.producer, self.settings.dlq_topic, payload_omitted(value or b"", error.str(), STAGE),
                          None, on_delivery=answered)
        if refused is not None:
            answered(refused, None)

    def _last_resort_answered(self, row: Row, error: KafkaError | None, _message: Message | None) -> None:
        """Kafka's answer to a dead letter sent without its payload: if it refuses even that, it takes someone
        to change the topic."""
        if row.state is LET_GO:
            return
        if error is not None and refused_for_itself(error):
            row.fail()
            self._needs_someone(f"Kafka refuses even a dead letter without payload on {self.settings.dlq_topic} "
                                f"({error.str()}): raise that topic's max.message.bytes, then start the connector "
                                "again")
        elif error is not None:
            self._fail(row, error)
        row.settled()
