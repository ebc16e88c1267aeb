"""The consume loop: Kafka records in, batched InfluxDB writes out, offsets committed after each write.

At-least-once into idempotent points: a batch's offsets are committed only after InfluxDB stored it and
its dead letters are in machine.dlq, so a crash or an outage re-writes points (which overwrite
themselves) instead of losing them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from pipeline_core.influx import influx_client
from pipeline_core.kafka_clients import admin_client, consumer_config, producer_config
from pipeline_core.lifecycle import StopSignal
from pipeline_core.logs import announce_ready
from pipeline_core.progress import Observation, ProgressReporter, StageCounters
from pipeline_core.records import InvalidRecord, dead_letter, decode_record
from pipeline_core.topics import partition_count

from .points import PowerLevels, data_point, deadletter_point, joined_point
from .settings import DbConnectorSettings
from .writer import InfluxWriter, WriteAborted

log = logging.getLogger(__name__)

STAGE = "db_connector"
# Largest number of messages taken from the consumer per call.
_CONSUME_CHUNK = 10_000


@dataclass
class DbConnectorCounters(StageCounters):
    """records in: consumed from the three topics; records out: points InfluxDB stored."""

    batches: int = 0


@dataclass
class _Batch:
    lines: list[str] = field(default_factory=list)
    # Per line: the message it came from, to dead-letter it if InfluxDB refuses the point.
    sources: list[Message] = field(default_factory=list)
    dead_letters: list[bytes] = field(default_factory=list)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    started: float = 0.0

    def __len__(self) -> int:
        return len(self.lines) + len(self.dead_letters)

    def is_empty(self) -> bool:
        return not self.next_offsets


class DbConnector:
    """Loads the data, join-result and dead-letter topics into InfluxDB until `stop` is set."""

    def __init__(self, settings: DbConnectorSettings, stop: StopSignal | None = None) -> None:
        self.settings = settings
        self.stop = stop or StopSignal()
        self.counters = DbConnectorCounters()
        self._levels = PowerLevels.parse(settings.level_thresholds)
        static_membership = {"group.instance.id": settings.group_instance_id} if settings.group_instance_id else {}
        self._consumer = Consumer(consumer_config(settings.kafka_bootstrap_servers, settings.group_id,
                                                  **{"client.id": STAGE}, **static_membership))
        self._producer = Producer(producer_config(settings.kafka_bootstrap_servers))
        self._writer = InfluxWriter(influx_client(settings), settings.influxdb_database,
                                    retry_max_s=settings.retry_max_s, should_stop=self.stop.is_set,
                                    while_waiting=self._wait_polling)
        self._batch = _Batch()
        self._flushing = False
        self._assignment_changed = False
        # Messages a paused consumer still handed out while InfluxDB was down: processed next.
        self._held_back: list[Message] = []
        self._delivery_failures: list[str] = []
        self._progress: ProgressReporter | None = None

    def run(self) -> None:
        settings = self.settings
        progress = self._progress = ProgressReporter.for_stage(
            STAGE, self.counters, settings, observe=self._observe, logger=log,
            labels={"records_out": "points written"})
        try:
            self._writer.ensure_database()
            # A topic that does not exist yet would only show as consumer warnings: wait for all of them, or
            # end the start with a clear message.
            admin = admin_client(settings.kafka_bootstrap_servers)
            for topic in (settings.data_topic, settings.out_topic, settings.dlq_topic):
                partition_count(admin, topic, settings.kafka_startup_deadline_s)
            self._consumer.subscribe([settings.data_topic, settings.out_topic, settings.dlq_topic],
                                     on_assign=self._on_assign, on_revoke=self._on_revoke)
            announce_ready(log, f"db_connector: {settings.data_topic}, {settings.out_topic}, {settings.dlq_topic} "
                                f"-> InfluxDB {settings.influxdb_host}:{settings.influxdb_port}/"
                                f"{settings.influxdb_database}")
            while not self.stop.is_set():
                self._consume_once()
                now = time.monotonic()
                if len(self._batch) >= settings.batch_size or (
                        not self._batch.is_empty() and now - self._batch.started >= settings.flush_interval_s):
                    self._flush()
                progress.maybe_report(now)
            self._flush()
        except WriteAborted as aborted:
            log.warning("%s: %d uncommitted records are read again on the next start", aborted, len(self._batch))
        finally:
            progress.close()
            self._consumer.close()
            self._producer.flush(10)

    # -- consuming --------------------------------------------------------------------------------

    def _consume_once(self) -> None:
        if self._held_back:
            messages, self._held_back = self._held_back, []
        else:
            timeout = self.settings.flush_interval_s
            if not self._batch.is_empty():
                timeout = max(0.0, self._batch.started + self.settings.flush_interval_s - time.monotonic())
            wanted = max(1, min(_CONSUME_CHUNK, self.settings.batch_size - len(self._batch)))
            messages = self._consumer.consume(wanted, min(timeout, 0.5))
        for message in messages:
            self._add(message)

    def _add(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", error)
            return
        batch = self._batch
        if batch.is_empty():
            batch.started = time.monotonic()
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        batch.next_offsets[(topic, partition)] = offset + 1
        self.counters.records_in += 1
        payload = message.value()
        settings = self.settings
        if topic == settings.dlq_topic:
            timestamp_ms = message.timestamp()[1]
            batch.lines.append(deadletter_point(settings.deadletter_measurement, payload, timestamp_ms, partition,
                                                offset))
            batch.sources.append(message)
            return
        try:
            if payload is None:
                raise InvalidRecord("record without a value (a tombstone)")
            record = decode_record(_as_text(payload))
            if topic == settings.out_topic:
                line = joined_point(settings.joined_measurement, record, self._levels)
            else:
                line = data_point(settings.data_measurement, record)
        except InvalidRecord as error:
            batch.dead_letters.append(dead_letter(str(error), payload, STAGE, topic=topic,
                                                  partition=partition, offset=offset))
            return
        batch.lines.append(line)
        batch.sources.append(message)

    # -- writing and committing -------------------------------------------------------------------

    def _flush(self) -> None:
        batch = self._batch
        if batch.is_empty():
            return
        self._flushing = True
        try:
            rejected = self._writer.write(batch.lines)
        finally:
            self._flushing = False
        dead_letters = list(batch.dead_letters)
        for point in rejected:
            source = batch.sources[point.index]
            if source.topic() == self.settings.dlq_topic:
                # Never dead-letter a dead letter: that could loop. It stays in machine.dlq regardless.
                log.error("InfluxDB refused the count of dead letter %s[%d]@%d: %s", source.topic(),
                          source.partition(), source.offset(), point.reason)
                continue
            dead_letters.append(dead_letter(f"InfluxDB refused the point: {point.reason}", source.value(),
                                            STAGE, topic=source.topic(), partition=source.partition(),
                                            offset=source.offset()))
        self._produce_dead_letters(dead_letters)
        self.counters.records_out += len(batch.lines) - len(rejected)
        self.counters.dead_letters += len(dead_letters)
        self.counters.batches += 1
        if self._assignment_changed:
            # Partitions were revoked while InfluxDB was down: they are re-read from the last commit
            # (re-writing the same points), so this batch's offsets must not be committed.
            self._assignment_changed = False
        else:
            self._consumer.commit(offsets=[TopicPartition(topic, partition, offset) for (topic, partition), offset
                                           in batch.next_offsets.items()], asynchronous=False)
        self._batch = _Batch()
        self._resume()

    def _produce_dead_letters(self, dead_letters: list[bytes]) -> None:
        if not dead_letters:
            return
        for envelope in dead_letters:
            self._producer.produce(self.settings.dlq_topic, envelope, on_delivery=self._on_delivery)
            self._producer.poll(0)
        remaining = self._producer.flush(60)
        if remaining or self._delivery_failures:
            # Raising keeps the offsets uncommitted: a restart re-reads and re-sends these records.
            raise RuntimeError(f"dead letters not delivered to {self.settings.dlq_topic}: "
                               f"{remaining} pending, errors {self._delivery_failures[:3]}")

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self._delivery_failures.append(str(error))

    # -- outages and rebalances -------------------------------------------------------------------

    def _wait_polling(self, seconds: float) -> None:
        """Wait between write retries while serving the consumer group, with fetching paused."""
        assignment = self._consumer.assignment()
        if assignment:
            self._consumer.pause(assignment)
        end = time.monotonic() + seconds
        while not self.stop.is_set() and (remaining := end - time.monotonic()) > 0:
            message = self._consumer.poll(min(remaining, 0.5))
            if message is not None:
                self._held_back.append(message)
            if self._progress is not None:
                self._progress.maybe_report()  # the lag grows while InfluxDB is down: keep saying so

    def _resume(self) -> None:
        assignment = self._consumer.assignment()
        if assignment:
            self._consumer.resume(assignment)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Whatever is not committed is re-read by the next owner; dropping it here loses nothing.
        self._held_back.clear()
        if self._flushing:
            self._assignment_changed = True
        else:
            self._batch = _Batch()
        log.info("revoked %d partitions", len(partitions))

    # -- progress ---------------------------------------------------------------------------------

    def _observe(self) -> Observation:
        return Observation(lag=self.lag(), values={"influxdb_requests": self._writer.requests,
                                                   "influxdb_retries": self._writer.retries})

    def lag(self) -> int | None:
        """Records of the assigned partitions not read yet: their ends as the consumer last fetched them
        (cached, so this never waits for the broker) minus its positions. None before it knows any."""
        assignment = self._consumer.assignment()
        if not assignment:
            return None
        lag, known = 0, False
        for position in self._consumer.position(assignment):
            if position.offset < 0:
                continue  # nothing fetched yet: neither end is known
            try:
                _low, high = self._consumer.get_watermark_offsets(position, cached=True)
            except KafkaException:
                continue
            if high >= 0:
                lag += max(high - position.offset, 0)
                known = True
        return lag if known else None


def _as_text(payload: bytes) -> str | bytes:
    """UTF-8 text when it is, so json.loads skips guessing the encoding of every record (a tenth of the
    time per record); anything else is passed on unchanged for decode_record to reject with its reason."""
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload
