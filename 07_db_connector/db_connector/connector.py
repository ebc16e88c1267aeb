"""The consume loop: Kafka records in, batched InfluxDB writes out, offsets committed after each write.

At-least-once into idempotent points: a batch's offsets are committed only after InfluxDB stored it and
its dead letters are in machine.dlq, so a crash or an outage re-writes points (which overwrite
themselves) instead of losing them.
"""
from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import REPORT_REQUEST_TIMEOUT_S, unfetched_lag
from pipeline_core.data_loss import WATERMARK_TIMEOUT_S, OffsetWatch
from pipeline_core.influx import influx_client
from pipeline_core.influx_retention import JOINED_POLICY, RAW_POLICY
from pipeline_core.kafka_clients import (ACCESS_ERRORS, admin_client, consumer_config, is_transient, produce,
                                         producer_config, refused_for_itself, security_config)
from pipeline_core.lifecycle import StopSignal
from pipeline_core.logs import announce_ready
from pipeline_core.progress import ConsumerCounters, Observation, ProgressReporter
from pipeline_core.records import InvalidRecord, dead_letter, payload_omitted
from pipeline_core.topics import partition_count

from .points import PowerLevels, deadletter_point, record_line
from .settings import DbConnectorSettings
from .writer import InfluxWriter, RejectedPoint, WriteAborted

log = logging.getLogger(__name__)

STAGE = "db_connector"
# Largest number of messages taken from the consumer per call.
_CONSUME_CHUNK = 10_000


# The commit's answer when the group rebalanced meanwhile: the partitions go (or went) to their next owner.
_GROUP_CHANGED = frozenset((KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                            KafkaError.UNKNOWN_MEMBER_ID))


@dataclass
class DbConnectorCounters(ConsumerCounters):
    """records in: consumed from the three topics; records out: points InfluxDB stored."""

    batches: int = 0


@dataclass
class _Batch:
    lines: list[str] = field(default_factory=list)
    policies: list[str] = field(default_factory=list)  # per line: the retention policy it goes into
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
                                                  **security_config(settings), **{"client.id": STAGE,
                                                     "session.timeout.ms": settings.session_timeout_ms},
                                                  **static_membership))
        # The ends of partitions not read from (`lag`).
        self._broker_offsets = BrokerOffsets(settings.kafka_bootstrap_servers, REPORT_REQUEST_TIMEOUT_S,
                                             security=security_config(settings))
        self._producer = self._new_producer()
        self._watch = OffsetWatch(self._consumer, self.counters, log)
        self._writer = InfluxWriter(influx_client(settings), settings.influxdb_database, settings,
                                    retry_max_s=settings.retry_max_s, should_stop=self.stop.is_set,
                                    while_waiting=self._wait_polling)
        self._batch = _Batch()
        self._flushing = False
        self._assignment_changed = False
        # Messages a paused consumer still handed out while InfluxDB was down: processed next.
        self._held_back: list[Message] = []
        # Fetching paused while a write or commit waits. Every assignment is set to it (_on_assign): librdkafka
        # keeps a partition's pause through its revocation, so one paused, revoked and given back after the
        # resume would stay paused for good.
        self._fetch_paused = False
        # Dead letters Kafka did not take in the last round of deliveries: (envelope, sent without its
        # payload already, error).
        self._refused: list[tuple[bytes, bool, KafkaError]] = []
        self._progress: ProgressReporter | None = None

    def _new_producer(self) -> Producer:
        # No delivery timeout: dead letters wait out a Kafka outage (their batch stays uncommitted).
        return Producer(producer_config(self.settings.kafka_bootstrap_servers, **security_config(self.settings),
                                        **{"message.timeout.ms": 0}))

    def run(self) -> None:
        settings = self.settings
        progress = self._progress = ProgressReporter.for_stage(
            STAGE, self.counters, settings, observe=self._observe, logger=log,
            labels={"records_out": "points written"}, progress_counters=("batches",))
        try:
            self._writer.ensure_database()
            # A topic that does not exist yet would only show as consumer warnings: wait for all of them, or
            # end the start with a clear message.
            admin = admin_client(settings.kafka_bootstrap_servers, **security_config(settings))
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
        self._watch.consumed([message for message in messages if message.error() is None])
        for message in messages:
            self._add(message)

    def _add(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF and not self._watch.consumer_error(error, message.topic()):
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
            batch.policies.append(RAW_POLICY)
            batch.sources.append(message)
            return
        try:
            if topic == settings.out_topic:
                line, policy = record_line(payload, settings.joined_measurement, self._levels), JOINED_POLICY
            else:
                line, policy = record_line(payload, settings.data_measurement), RAW_POLICY
        except InvalidRecord as error:
            batch.dead_letters.append(dead_letter(str(error), payload, STAGE, topic=topic,
                                                  partition=partition, offset=offset))
            return
        except Exception as error:  # noqa: BLE001 - a defect this record shows: dead-letter it, never stop on it
            log.exception("could not convert %s[%d]@%d; dead-lettering it", topic, partition, offset)
            batch.dead_letters.append(dead_letter(f"the DB connector could not convert the record: {error!r}"[:1000],
                                                  payload, STAGE, topic=topic, partition=partition, offset=offset))
            return
        batch.lines.append(line)
        batch.policies.append(policy)
        batch.sources.append(message)

    # -- writing and committing -------------------------------------------------------------------

    def _flush(self) -> None:
        batch = self._batch
        if batch.is_empty():
            return
        # Both steps may wait out an outage while serving the group: a revocation meanwhile is noted.
        self._flushing = True
        try:
            rejected = self._write(batch)
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
        finally:
            self._flushing = False
        self.counters.records_out += len(batch.lines) - len(rejected)
        self.counters.dead_letters += len(dead_letters)
        self.counters.batches += 1
        self._commit([TopicPartition(topic, partition, offset) for (topic, partition), offset
                      in batch.next_offsets.items()])
        self._batch = _Batch()
        self._resume()

    def _write(self, batch: _Batch) -> list[RejectedPoint]:
        """One write per retention policy; the refused points by their index in the batch."""
        indices_by_policy: dict[str, list[int]] = {}
        for index, policy in enumerate(batch.policies):
            indices_by_policy.setdefault(policy, []).append(index)
        rejected = []
        for policy, indices in indices_by_policy.items():
            for point in self._writer.write([batch.lines[index] for index in indices], policy):
                rejected.append(RejectedPoint(indices[point.index], point.reason))
        return sorted(rejected, key=lambda point: point.index)

    def _commit(self, offsets: list[TopicPartition]) -> None:
        """Commit a written batch's offsets. While Kafka restarts, its group coordinator answers with a
        transient error for a while (loading the group's offsets): ask again, serving the group meanwhile.
        Once partitions were revoked (while InfluxDB or Kafka was away) they are re-read from the last
        commit, re-writing the same points, so this batch's offsets must not be committed."""
        delay_s = 0.5
        while not self._assignment_changed:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=False)
                return
            except KafkaException as exception:
                error: KafkaError = exception.args[0]
                if error.code() in _GROUP_CHANGED:
                    break
                if not is_transient(error):
                    raise
                if self.stop.is_set():
                    log.warning("stopping with a batch uncommitted (%s): it is read again on the next start",
                                error.str())
                    return
                log.warning("committing offsets failed (%s); retrying in %.1f s", error.str(), delay_s)
            self._flushing = True  # a revocation while waiting is noted
            try:
                self._wait_polling(delay_s)
            finally:
                self._flushing = False
            delay_s = min(delay_s * 2, self.settings.retry_max_s)
        self._assignment_changed = False
        log.info("the group changed while the batch was written: its records are read again, not committed")

    def _produce_dead_letters(self, dead_letters: list[bytes]) -> None:
        """Deliver the batch's dead letters before its offsets are committed. While Kafka is away this
        waits (serving the consumer group); a dead letter Kafka refuses for its size goes again
        without its payload; after any other failure a fresh producer sends the letters again."""
        waiting = [(envelope, False) for envelope in dead_letters]
        retry_delay_s = 0.5
        while waiting:
            self._refused = []
            for envelope, omitted in waiting:
                refused = produce(self._producer, self.settings.dlq_topic, envelope,
                                  on_delivery=functools.partial(self._on_delivery, omitted))
                if refused is not None:  # the client refused it at once: as if Kafka had on delivery
                    self._refused.append((envelope, omitted, refused))
            while self._producer.flush(0.5):
                if self.stop.is_set():
                    raise WriteAborted(f"stopped while dead letters waited for Kafka ({self.settings.dlq_topic})")
                self._wait_polling(0.5)
            waiting = []
            for envelope, omitted, error in self._refused:
                if error.code() in ACCESS_ERRORS:
                    raise SystemExit(f"Kafka refused access to {self.settings.dlq_topic} ({error.str()}): grant the "
                                     "DB connector's principal Write on it, then start it again")
                if refused_for_itself(error) and omitted:
                    raise SystemExit(f"Kafka refuses even a dead letter without payload on {self.settings.dlq_topic} "
                                     f"({error.str()}): raise that topic's max.message.bytes, then start again")
                if refused_for_itself(error):
                    waiting.append((payload_omitted(envelope, error.str(), STAGE), True))
                else:
                    waiting.append((envelope, omitted))
            if any(not refused_for_itself(error) for _, _, error in self._refused):
                log.error("dead letters not delivered (%s): sending them again with a fresh producer in %.1f s",
                          self._refused[0][2].str(), retry_delay_s)
                self._wait_polling(retry_delay_s)
                retry_delay_s = min(retry_delay_s * 2, self.settings.retry_max_s)
                self._producer = self._new_producer()

    def _on_delivery(self, omitted: bool, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._refused.append((message.value() or b"", omitted, error))

    # -- outages and rebalances -------------------------------------------------------------------

    def _wait_polling(self, seconds: float) -> None:
        """Wait between write retries while serving the consumer group, with fetching paused."""
        assignment = self._consumer.assignment()
        self._fetch_paused = True
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
        self._fetch_paused = False
        if assignment:
            self._consumer.resume(assignment)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing")
        if partitions:
            (consumer.pause if self._fetch_paused else consumer.resume)(partitions)
        try:
            committed = consumer.committed(partitions, timeout=WATERMARK_TIMEOUT_S)
        except KafkaException as error:
            log.warning("committed offsets unknown (%s): a reset to the earliest offset now is not counted",
                        error.args[0])
            for partition in partitions:
                self._watch.sought(TopicPartition(partition.topic, partition.partition))  # from wherever it resumes
            return
        self._watch.assigned(committed)

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
        # In hand: the batch being written (or due, its offsets uncommitted), and what a paused consumer handed
        # out meanwhile. A batch still collecting within its flush interval is no work held up.
        batch = self._batch
        due = self._flushing or (not batch.is_empty()
                                 and time.monotonic() - batch.started >= self.settings.flush_interval_s)
        return Observation(lag=self.lag(), values={"influxdb_requests": self._writer.requests,
                                                   "influxdb_retries": self._writer.retries},
                           pending=(len(batch) if due else 0) + len(self._held_back),
                           # Also before any record: a database it cannot create, credentials InfluxDB refuses.
                           waiting_for="InfluxDB" if self._writer.failing else None)

    def lag(self) -> int | None:
        """Records of the assigned partitions not read yet. Of a partition read from since its assignment: its
        end as the consumer last fetched it (cached) minus its position. Of one not: asked of the broker (see
        `pipeline_core.consumer_lag`), since a partition the consumer does not fetch has a cached end that
        stopped moving. None before it knows any."""
        assignment = self._consumer.assignment()
        if not assignment:
            return None
        lag, known = 0, False
        unread = []
        for position in self._consumer.position(assignment):
            if position.offset < 0:
                unread.append(position)
                continue
            try:
                _low, high = self._consumer.get_watermark_offsets(position, cached=True)
            except KafkaException:
                continue
            if high >= 0:
                lag += max(high - position.offset, 0)
                known = True
        unread_lag = unfetched_lag(self._consumer, unread, self._broker_offsets) if unread else None
        if unread_lag is not None:
            lag += unread_lag
            known = True
        return lag if known else None
