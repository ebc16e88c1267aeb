"""The standalone joiner's ceiling: the same source and sink with no join in between.

Consume -> produce in transactions with the consumed offsets sent along (confluent-kafka-python's
``eos_transactions.py``), built from the joiner's own parts so that only the join differs: its consumer and
transactional producer (``kafka_joiner.clients``), its transactions (``kafka_joiner.transaction``: the same
interval, size limit, offsets with the group metadata and retries), its consume batch and wait, and its
settings. Each input record goes to the output topic unchanged, key and value.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from pipeline_core.kafka_clients import produce, retry_transient

from kafka_joiner.clients import joiner_consumer, joiner_producer
from kafka_joiner.progress import JoinerStats
# The joiner's consume batch and wait, so both loops commit at the same moments.
from kafka_joiner.service import CONSUME_BATCH, POLL_TIMEOUT_S
from kafka_joiner.settings import KafkaJoinerSettings
from kafka_joiner.transaction import KAFKA_TIMEOUT_S, Transaction

log = logging.getLogger("benchmarks.passthrough")


class PassThrough:
    """``settings.input_topic`` -> ``settings.output_topic``, exactly once, no join: the joiner's loop without
    the join. Offers what the bench uses of ``KafkaJoiner``: ``stats``, ``start``, ``run``, ``forced``."""

    def __init__(self, settings: KafkaJoinerSettings) -> None:
        self.settings = settings
        self.stats = JoinerStats()
        instance_id = settings.instance_id or uuid.uuid4().hex[:12]
        self.transactional_id = f"{settings.transactional_id_prefix}.{instance_id}"
        # The joiner's consumer, its statistics included (a wedge watch reads them), only unread here.
        self._consumer = joiner_consumer(settings, lambda _statistics: None)
        self._transaction = Transaction(lambda: joiner_producer(settings, self.transactional_id), self._consumer,
                                        self.stats, settings.commit_interval_ms / 1000, settings.max_transaction_records)
        self._positions: dict[int, int] = {}  # input partition -> next offset, committed with the outputs

    def start(self) -> None:
        retry_transient(lambda: self._transaction.initialise(KAFKA_TIMEOUT_S),
                        what=f"initialising transactions ({self.transactional_id})",
                        deadline_s=self.settings.kafka_startup_deadline_s)
        self._consumer.subscribe([self.settings.input_topic], on_revoke=self._on_revoke, on_lost=self._on_lost)

    def run(self, until: Callable[[PassThrough], bool]) -> None:
        try:
            while not until(self):
                self.step()
        finally:
            if self._transaction.open:
                self._commit()
            self._consumer.close()
            self._transaction.producer.flush(KAFKA_TIMEOUT_S)

    def step(self) -> None:
        """One round, as the joiner's: consume a batch, produce it in the open transaction, commit when the
        batch was short (the input is drained) or the transaction is due."""
        messages = self._consumer.consume(CONSUME_BATCH, self._transaction.wait_s(POLL_TIMEOUT_S))
        if messages:
            self._process(messages)
        if self._transaction.open and (len(messages) < CONSUME_BATCH or self._transaction.due()):
            self._commit()

    def _process(self, messages: list[Message]) -> None:
        stats = self.stats
        if stats.first_record_at is None:
            stats.first_record_at = time.monotonic()
        transaction = self._transaction
        if not transaction.open:
            transaction.begin()
        producer = self._transaction.producer
        produce_one = producer.produce
        output_topic = self.settings.output_topic
        append_times = transaction.append_times
        positions = self._positions
        outputs = self._outputs
        count = produced = 0
        for message in messages:
            error = message.error()
            if error is not None:
                if error.fatal():
                    raise KafkaException(error)
                log.warning("consumer: %s", error)
                continue
            for value, key in outputs(message):
                try:
                    produce_one(output_topic, value, key)
                except BufferError:  # local queue full: the shared helper waits for deliveries to drain it
                    produce(producer, output_topic, value, key)
                produced += 1
            positions[message.partition()] = message.offset() + 1
            append_times.append(message.timestamp()[1])
            count += 1
        transaction.records += count
        stats.records_in += count
        stats.records_out += produced
        stats.joinable += count
        stats.joined_in += count

    def _outputs(self, message: Message) -> Iterable[tuple[bytes | None, bytes | None]]:
        """What one input record becomes in the output topic, (value, key) each: itself, unchanged."""
        return ((message.value(), message.key()),)

    def _commit(self) -> None:
        offsets = [TopicPartition(self.settings.input_topic, partition, offset)
                   for partition, offset in self._positions.items()]
        if not self._transaction.commit(offsets):
            # The bench runs one instance on its own topics: nothing should abort its transactions.
            raise RuntimeError("the pass-through's transaction was aborted")

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._transaction.open:
            self._commit()
        for partition in partitions:
            self._positions.pop(partition.partition, None)

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._transaction.open:
            self._transaction.abort()
        for partition in partitions:
            self._positions.pop(partition.partition, None)

    def forced(self) -> int:
        return 0
