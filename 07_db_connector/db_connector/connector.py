"""The consume loop: Kafka records in, batched writes into a sink out, offsets committed after each write.

At-least-once into idempotent items: a batch's offsets are committed only after the sink (`sink.Sink`; the
shipped one is InfluxDB, `influx_sink`) stored it and its dead letters are in machine.dlq, so a crash or an
outage re-writes items (which overwrite themselves) instead of losing them. The loop knows no store: what a
record becomes, and how it is written, is the sink's.
"""
from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.consumer_lag import REPORT_REQUEST_TIMEOUT_S, unfetched_lag
from pipeline_core.data_loss import WATERMARK_TIMEOUT_S, OffsetWatch
from pipeline_core.group_watch import STATISTICS_INTERVAL_MS, ConsumerWedged, GroupWatch, end_wedged_process
from pipeline_core.kafka_clients import (ACCESS_ERRORS, admin_client, consumer_config, is_fatal, is_transient, produce,
                                         producer_config, refused_for_itself, security_config)
from pipeline_core.lifecycle import StopSignal
from pipeline_core.logs import announce_ready
from pipeline_core.progress import ConsumerCounters, Observation, ProgressReporter
from pipeline_core.records import InvalidRecord, dead_letter, payload_omitted
from pipeline_core.retry import Backoff, Retries
from pipeline_core.topics import partition_count

from .settings import DbConnectorSettings
from .sink import Consumed, Refused, Sink, SinkUnavailable, Source

log = logging.getLogger(__name__)

STAGE = "db_connector"
T = TypeVar("T")
# Largest number of messages taken from the consumer per call.
_CONSUME_CHUNK = 10_000


# The commit's answer when the group rebalanced meanwhile: the partitions go (or went) to their next owner.
_GROUP_CHANGED = frozenset((KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                            KafkaError.UNKNOWN_MEMBER_ID, KafkaError._ASSIGNMENT_LOST))


# A named tuple's own constructor is Python code; tuple's makes the one per record at a third of the cost.
_consumed = tuple.__new__
# The first pause of each wait for the sink, and for Kafka (a commit, dead letters); `--retry-max-s` caps both.
_SINK_FIRST_PAUSE_S = 0.1
_KAFKA_FIRST_PAUSE_S = 0.5
# A commit's answer comes in milliseconds when the coordinator is up; one slower is waited for with fetching
# paused. Each wait for it polls at most this long.
_COMMIT_ANSWER_DUE_S = 1.0
_COMMIT_POLL_S = 0.05
_UNANSWERED = object()


class WriteAborted(Exception):
    """Stop was requested while the sink or Kafka was away; the batch was not (fully) written or committed."""


@dataclass
class DbConnectorCounters(ConsumerCounters):
    """records in: consumed from the three topics; records out: items the sink stored."""

    batches: int = 0


@dataclass
class Batch:
    """The records consumed since the last commit: the sink's items, and the dead letters of the others."""

    items: list = field(default_factory=list)
    # Per item: the message it came from, to dead-letter it if the store refuses the item.
    sources: list[Message] = field(default_factory=list)
    dead_letters: list[bytes] = field(default_factory=list)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    started: float = 0.0

    def __len__(self) -> int:
        return len(self.items) + len(self.dead_letters)

    def is_empty(self) -> bool:
        return not self.next_offsets

    def add(self, messages: Sequence[Message], sources: Mapping[str, Source], sink: Sink) -> None:
        """Each of `messages` (none an error) as its item, or its dead letter when the sink cannot convert it; `sources`
        tells each topic's records apart. A record of machine.dlq the sink cannot convert is logged and left:
        dead-lettering a dead letter could loop.

        One call per consumed chunk, its names bound once: this loop is the connector's per-record cost."""
        if messages and self.is_empty():
            self.started = time.monotonic()
        convert, next_offsets = sink.convert, self.next_offsets
        append_item, append_source = self.items.append, self.sources.append
        for message in messages:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            next_offsets[(topic, partition)] = offset + 1
            source = sources[topic]
            try:
                item = convert(_consumed(Consumed, (source, message.value(), message.timestamp()[1], partition,
                                                    offset)))
            except InvalidRecord as error:
                self._refuse(message, source, str(error), sink)
                continue
            except Exception as error:  # noqa: BLE001 - a defect this record shows: dead-letter it, never stop on it
                log.exception("could not convert %s[%d]@%d; dead-lettering it", topic, partition, offset)
                self._refuse(message, source, f"the DB connector could not convert the record: {error!r}"[:1000], sink)
                continue
            append_item(item)
            append_source(message)

    def _refuse(self, message: Message, source: Source, reason: str, sink: Sink) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        if source is Source.DEAD_LETTER:
            log.error("%s cannot store dead letter %s[%d]@%d: %s", sink.name, topic, partition, offset, reason)
            return
        self.dead_letters.append(dead_letter(reason, message.value(), STAGE, topic=topic, partition=partition,
                                             offset=offset))


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
        self._producer = self._new_producer()
        self._watch = OffsetWatch(self._consumer, self.counters, log)
        self._sink_waiting = False  # the last write (or set-up) found the sink away: work waits on it
        self._batch = Batch()
        self._flushing = False
        self._assignment_changed = False
        # The answer to the last commit asked for (`_commit_serving_group`): None when committed.
        self._commit_answer: KafkaError | None | object = _UNANSWERED
        self._commit_asked: set[tuple[str, int, int]] = set()
        # Messages a paused consumer still handed out while the sink was away: processed next.
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
        # Both steps may wait out an outage while serving the group: a revocation meanwhile is noted.
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
            self._produce_dead_letters(dead_letters)
        finally:
            self._flushing = False
        self.counters.records_out += len(batch.items) - len(rejected)
        self.counters.dead_letters += len(dead_letters)
        self.counters.batches += 1
        self._commit([TopicPartition(topic, partition, offset) for (topic, partition), offset
                      in batch.next_offsets.items()])
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

    def _commit(self, offsets: list[TopicPartition]) -> None:
        """Commit a written batch's offsets. While Kafka restarts, its group coordinator answers with a
        transient error for a while (loading the group's offsets): ask again, serving the group meanwhile.
        Once partitions were revoked (while the sink or Kafka was away) they are re-read from the last
        commit, re-writing the same points, so this batch's offsets must not be committed."""
        # Bound: no deadline (the batch stays uncommitted, the group served); pauses up to `--retry-max-s`.
        retries = Retries(Backoff(min(_KAFKA_FIRST_PAUSE_S, self.settings.retry_max_s), self.settings.retry_max_s))
        self._flushing = True  # a revocation while waiting is noted
        try:
            while not self._assignment_changed:
                error = self._commit_serving_group(offsets)
                if error is None:
                    return
                if error.code() in _GROUP_CHANGED or self._assignment_changed:
                    break
                if not is_transient(error):
                    raise KafkaException(error)
                if self.stop.is_set():
                    log.warning("stopping with a batch uncommitted (%s): it is read again on the next start",
                                error.str())
                    return
                delay_s = retries.next_pause_s()
                log.warning("committing offsets failed (%s); retrying in %.1f s", error.str(), delay_s)
                self._wait_polling(delay_s)
            log.info("the group changed while the batch was written: its records are read again, not committed")
        finally:
            self._flushing = False
            self._assignment_changed = False

    def _commit_serving_group(self, offsets: list[TopicPartition]) -> KafkaError | None:
        """Commit `offsets` and wait for the coordinator's answer (None: committed) while polling, so that this
        member goes on serving its group and reporting its progress; a revocation meanwhile ends the wait (the
        batch is read again whatever the answer). A synchronous commit serves neither: with the coordinator's
        host cut off it blocked for 49 s, and a rebalance meanwhile waited for this member while the other one
        held no partitions."""
        self._commit_asked = {(p.topic, p.partition, p.offset) for p in offsets}
        self._commit_answer = _UNANSWERED
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as refused:
            return refused.args[0]

        def answered() -> bool:
            return self._commit_answer is not _UNANSWERED or self._assignment_changed

        # Pausing drops what the consumer fetched ahead: only an answer slower than usual is waited for paused.
        answer_due = time.monotonic() + _COMMIT_ANSWER_DUE_S
        while not answered() and time.monotonic() < answer_due:
            self._held_back.extend(self._consumer.consume(_CONSUME_CHUNK, _COMMIT_POLL_S))
        if not answered():
            log.warning("committing offsets: no answer from the group coordinator in %.1f s; waiting for it with "
                        "fetching paused", _COMMIT_ANSWER_DUE_S)
            self._wait_polling(math.inf, until=answered)
        if self._commit_answer is _UNANSWERED:  # revoked, or stopping: the answer no longer matters
            return KafkaError(KafkaError._TIMED_OUT, "the commit was not answered before the group changed or "
                                                     "the connector stopped")
        return self._commit_answer

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        # The answer of a commit no longer waited for (revoked meanwhile) names other offsets: it is not this one's.
        if {(p.topic, p.partition, p.offset) for p in partitions} == self._commit_asked:
            self._commit_answer = error or next((p.error for p in partitions if p.error is not None), None)

    def _produce_dead_letters(self, dead_letters: list[bytes]) -> None:
        """Deliver the batch's dead letters before its offsets are committed. While Kafka is away this
        waits (serving the consumer group); a dead letter Kafka refuses for its size goes again
        without its payload; after any other failure a fresh producer sends the letters again."""
        waiting = [(envelope, False) for envelope in dead_letters]
        # Bound: no deadline (the batch stays uncommitted meanwhile); a fresh producer after pauses up to
        # `--retry-max-s`.
        retries = Retries(Backoff(min(_KAFKA_FIRST_PAUSE_S, self.settings.retry_max_s), self.settings.retry_max_s))
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
                retry_delay_s = retries.next_pause_s()
                log.error("dead letters not delivered (%s): sending them again with a fresh producer in %.1f s",
                          self._refused[0][2].str(), retry_delay_s)
                self._wait_polling(retry_delay_s)
                self._producer = self._new_producer()

    def _on_delivery(self, omitted: bool, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._refused.append((message.value() or b"", omitted, error))

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
            self._assignment_changed = True
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
