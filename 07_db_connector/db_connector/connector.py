"""The consume loop: Kafka records in, batched writes into a sink out, offsets committed after each write.

At-least-once into idempotent items: a batch's offsets are committed only after the sink (`sink.Sink`; the
shipped one is InfluxDB, `influx_sink`) stored it and its dead letters are in machine.dlq, so a crash or an
outage re-writes items (which overwrite themselves) instead of losing them. The loop knows no store: what a
record becomes, and how it is written, is the sink's.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import REPORT_REQUEST_TIMEOUT_S
from pipeline_core.data_loss import WATERMARK_TIMEOUT_S, OffsetWatch
from pipeline_core.group_watch import STATISTICS_INTERVAL_MS, ConsumerWedged, GroupWatch, end_wedged_process
from pipeline_core.kafka_clients import admin_client, consumer_config, is_fatal, security_config
from pipeline_core.lifecycle import StopSignal
from pipeline_core.logs import announce_ready
from pipeline_core.progress import ConsumerCounters, Observation, ProgressReporter
from pipeline_core.records import dead_letter
from pipeline_core.retry import Backoff, Retries
from pipeline_core.topics import partition_count

from .batch import STAGE, Batch, WriteAborted
from .dead_letters import DeadLetterDelivery
from .lag import assigned_lag
from .offset_commit import CONSUME_CHUNK, OffsetCommit
from .settings import DbConnectorSettings
from .sink import Refused, Sink, SinkUnavailable, Source

log = logging.getLogger(__name__)

T = TypeVar("T")
# The first pause of each wait for the sink; `--retry-max-s` caps them.
_SINK_FIRST_PAUSE_S = 0.1


@dataclass
class DbConnectorCounters(ConsumerCounters):
    """records in: consumed from the three topics; records out: items the sink stored."""

    batches: int = 0


class DbConnector:
    """Loads the data, join-result and dead-letter topics into `sink` until `stop` is set."""

    def __init__(self, settings: DbConnectorSettings, sink: Sink, stop: StopSignal | None = None) -> None:
        self.settings = settings
        self.stop = stop or StopSignal()
        self.counters = DbConnectorCounters()
        self._sink = sink
        self._sources = {settings.data_topic: Source.DATA, settings.out_topic: Source.JOINED,
                         settings.dlq_topic: Source.DEAD_LETTER}
        static_membership = {"group.instance.id": settings.group_instance_id} if settings.group_instance_id else {}
        self._group_watch = GroupWatch.asking(
            settings.group_id, lambda: admin_client(settings.kafka_bootstrap_servers, **security_config(settings)))
        self._consumer = Consumer(consumer_config(settings.kafka_bootstrap_servers, settings.group_id,
                                                  **security_config(settings), **{"client.id": STAGE,
                                                     "session.timeout.ms": settings.session_timeout_ms,
                                                     "on_commit": self._on_commit,
                                                     "statistics.interval.ms": STATISTICS_INTERVAL_MS,
                                                     "stats_cb": self._group_watch.on_statistics},
                                                  **static_membership))
        # The ends of partitions not read from (`lag`).
        self._broker_offsets = BrokerOffsets(settings.kafka_bootstrap_servers, REPORT_REQUEST_TIMEOUT_S,
                                             security=security_config(settings))
        self._dead_letters = DeadLetterDelivery(settings, self.stop, self._wait_polling)
        self._watch = OffsetWatch(self._consumer, self.counters, log)
        self._sink_waiting = False  # the last write (or set-up) found the sink away: work waits on it
        self._batch = Batch()
        self._flushing = False
        # Messages a paused consumer still handed out while the sink was away: processed next.
        self._held_back: list[Message] = []
        # Fetching paused while a write or commit waits. Every assignment is set to it (_on_assign): librdkafka
        # keeps a partition's pause through its revocation, so one paused, revoked and given back after the
        # resume would stay paused for good.
        self._fetch_paused = False
        self._offset_commit = OffsetCommit(self._consumer, settings.retry_max_s, self.stop,
                                           lambda messages: self._held_back.extend(messages), self._wait_polling)
        self._progress: ProgressReporter | None = None

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        self._offset_commit.on_commit(error, partitions)  # the consumer exists before its committer

    def run(self) -> None:
        settings = self.settings
        progress = self._progress = ProgressReporter.for_stage(
            STAGE, self.counters, settings, observe=self._observe, logger=log,
            labels={"records_out": "points written"}, progress_counters=("batches",))
        try:
            self._until_sink_answers(self._sink.setup, "set up")
            # A topic that does not exist yet would only show as consumer warnings: wait for all of them, or
            # end the start with a clear message.
            admin = admin_client(settings.kafka_bootstrap_servers, **security_config(settings))
            for topic in (settings.data_topic, settings.out_topic, settings.dlq_topic):
                partition_count(admin, topic, settings.kafka_startup_deadline_s)
            self._consumer.subscribe([settings.data_topic, settings.out_topic, settings.dlq_topic],
                                     on_assign=self._on_assign, on_revoke=self._on_revoke)
            announce_ready(log, f"db_connector: {settings.data_topic}, {settings.out_topic}, {settings.dlq_topic} "
                                f"-> {self._sink}")
            while not self.stop.is_set():
                self._consume_once()
                self._group_watch.check()
                now = time.monotonic()
                if len(self._batch) >= settings.batch_size or (
                        not self._batch.is_empty() and now - self._batch.started >= settings.flush_interval_s):
                    self._flush()
                progress.maybe_report(now)
            self._flush()
        except WriteAborted as aborted:
            log.warning("%s: %d uncommitted records are read again on the next start", aborted, len(self._batch))
        except ConsumerWedged as wedged:
            end_wedged_process(wedged, progress.close)  # does not return: the consumer's close below would wait
        finally:
            progress.close()
            self._consumer.close()
            self._dead_letters.close(10)

    # -- consuming --------------------------------------------------------------------------------

    def _consume_once(self) -> None:
        if self._held_back:
            messages, self._held_back = self._held_back, []
        else:
            timeout = self.settings.flush_interval_s
            if not self._batch.is_empty():
                timeout = max(0.0, self._batch.started + self.settings.flush_interval_s - time.monotonic())
            wanted = max(1, min(CONSUME_CHUNK, self.settings.batch_size - len(self._batch)))
            messages = self._consumer.consume(wanted, min(timeout, 0.5))
        records = [message for message in messages if message.error() is None]
        self._watch.consumed(records)
        if len(records) < len(messages):
            for message in messages:
                error = message.error()
                if error is not None and is_fatal(error):
                    # The consumer serves nothing any more: exit, and supervision starts the connector again, with
                    # a new consumer taking its partitions back; its uncommitted batch is read again.
                    raise KafkaException(error)
                if error is not None and error.code() != KafkaError._PARTITION_EOF and not self._watch.consumer_error(
                        error, message.topic()):
                    log.warning("consumer error: %s", error)
        self.counters.records_in += len(records)
        self._batch.add(records, self._sources, self._sink)

    # -- writing and committing -------------------------------------------------------------------

    def _flush(self) -> None:
        batch = self._batch
        if batch.is_empty():
            return
        # Every step may wait out an outage while serving the group: a revocation meanwhile is noted.
        self._flushing = True
        try:
            rejected = self._write(batch) if batch.items else []
            dead_letters = list(batch.dead_letters)
            for point in rejected:
                source = batch.sources[point.index]
                if source.topic() == self.settings.dlq_topic:
                    # Never dead-letter a dead letter: that could loop. It stays in machine.dlq regardless.
                    log.error("%s refused the count of dead letter %s[%d]@%d: %s", self._sink.name, source.topic(),
                              source.partition(), source.offset(), point.reason)
                    continue
                dead_letters.append(dead_letter(f"{self._sink.name} refused the point: {point.reason}", source.value(),
                                                STAGE, topic=source.topic(), partition=source.partition(),
                                                offset=source.offset()))
            self._dead_letters.deliver(dead_letters)
            self.counters.records_out += len(batch.items) - len(rejected)
            self.counters.dead_letters += len(dead_letters)
            self.counters.batches += 1
            self._offset_commit.commit([TopicPartition(topic, partition, offset) for (topic, partition), offset
                                        in batch.next_offsets.items()])
        finally:
            self._flushing = False
        self._batch = Batch()
        self._resume()

    def _write(self, batch: Batch) -> list[Refused]:
        """The batch's items into the sink; the refused ones by their index in the batch."""
        return self._until_sink_answers(lambda: self._sink.write(batch.items), f"write {len(batch.items)} records")

    def _until_sink_answers(self, call: Callable[[], T], what: str) -> T:
        """`call()`, asked again while the sink is away, for as long as it stays away (nothing is committed
        meanwhile, so waiting loses nothing), with fetching paused while the group is served. Bound: the pauses
        grow from _SINK_FIRST_PAUSE_S to `--retry-max-s`, or are what the sink asks for (back-pressure)."""
        retries = Retries(Backoff(min(_SINK_FIRST_PAUSE_S, self.settings.retry_max_s), self.settings.retry_max_s))
        while True:
            try:
                answer = call()
                self._sink_waiting = False
                return answer
            except SinkUnavailable as unavailable:
                self._sink_waiting = True
                pause_s = unavailable.retry_after_s
                if pause_s is None:
                    pause_s = retries.next_pause_s()
                log.warning("%s: could not %s (%s); retrying in %.1f s", self._sink.name, what, unavailable, pause_s)
            if self.stop.is_set():
                raise WriteAborted(f"stopped while trying to {what} in {self._sink.name}")
            self._wait_polling(pause_s)
            if self.stop.is_set():
                raise WriteAborted(f"stopped while trying to {what} in {self._sink.name}")

    # -- outages and rebalances -------------------------------------------------------------------

    def _wait_polling(self, seconds: float, until: Callable[[], bool] | None = None) -> None:
        """Wait between write retries (or, with `until`, until it holds) while serving the consumer group, with
        fetching paused."""
        assignment = self._consumer.assignment()
        self._fetch_paused = True
        if assignment:
            self._consumer.pause(assignment)
        end = time.monotonic() + seconds
        while not self.stop.is_set() and (remaining := end - time.monotonic()) > 0 and not (until and until()):
            message = self._consumer.poll(min(remaining, 0.5))
            if message is not None:
                self._held_back.append(message)
            self._group_watch.check()  # a wait for the sink or a commit may outlast a consumer wedged meanwhile
            if self._progress is not None:
                self._progress.maybe_report()  # the lag grows while the sink is away: keep saying so

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
            self._offset_commit.assignment_changed = True
        else:
            self._batch = Batch()
        log.info("revoked %d partitions", len(partitions))

    # -- progress ---------------------------------------------------------------------------------

    def _observe(self) -> Observation:
        # In hand: the batch being written (or due, its offsets uncommitted), and what a paused consumer handed
        # out meanwhile. A batch still collecting within its flush interval is no work held up.
        batch = self._batch
        due = self._flushing or (not batch.is_empty()
                                 and time.monotonic() - batch.started >= self.settings.flush_interval_s)
        return Observation(lag=self.lag(), values=dict(self._sink.health_values()),
                           pending=(len(batch) if due else 0) + len(self._held_back),
                           # Also before any record: a database it cannot create, credentials it refuses.
                           waiting_for=self._sink.name if self._sink_waiting else None)

    def lag(self) -> int | None:
        """Records of the assigned partitions not read yet (`lag.assigned_lag`); None before it knows any."""
        return assigned_lag(self._consumer, self._broker_offsets, fetch_paused=self._fetch_paused)
