"""The join of one partition of the co-partitioned topic: its state, where it commits, and how its frames
are joined into outputs and dead letters.

Per partition the joiner commits, in the transaction of its outputs, the processed position (the next
frame to process) as the partition's offset, and writes what changed in the records its join holds to the
changelog (see `changelog`). A restart restores the held records from the changelog and reads on from the
processed position: what it re-reads is bounded by one transaction, however long a record stays held.

A changelog that does not cover the committed offset has lost the state (its topic was deleted or
recreated): the partition is then read again from its beginning, its records up to the committed offset
rebuilding the state silently (their outputs and dead letters were committed before), and joined on from
there; the commit stays where it was until the rebuild is through.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping

from confluent_kafka import KafkaException, Message, TopicPartition

from pipeline_core.admission import refusal
from pipeline_core.partitioning import earlier_homes
from pipeline_core.kafka_clients import produce
from pipeline_core.records import (DEAD_LETTER_MAX_BYTES, InvalidRecord, dead_letter, decode_record, encode_record,
                                   payload_omitted, record_key)
from pipeline_core.validation import describe

from local_stream_buffer.eviction import evicted_payload
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.output import is_finite_result
from local_stream_buffer.rejections import Rejection
from local_stream_buffer.status import IngestStatus
from local_stream_buffer.specs import JoinSpec
from pipeline_core.spec_starts import read_starts, starts_now, with_starts, without_starts
from .changelog import (CLOCK_PREFIX, COVERAGE_KEY, StateChanges, StateRecord, adopted_feeds, clock_key,
                        coverage_value, decode_clock, decode_release, record_position, release_key)
from .cohorts import CohortJoiner, plan
from .handover import Awaited
from .progress import JoinerStats
from .repartition import FramedRecord
from .transaction import Transaction

STAGE = "kafka_joiner"
# Commits of the joiner's earlier format: the committed offset was the oldest frame still held and this
# metadata the processed position (the state was rebuilt from the input).
_EARLIER_FORMAT = "lsb1:processed="
# Records joined between two looks at whether the transaction is due: a batch of records that lie where
# they are joined never commits midway; large frames of the repartition topic commit between them.
_DUE_CHECK_RECORDS = 500
# A valid record's key: a thing and a quantity of at most 256 characters of up to 4 UTF-8 bytes each.
_MAX_LETTER_KEY_BYTES = 2 * 256 * 4 + 1
_ACCEPTED = IngestStatus.ACCEPTED
_REJECTED = IngestStatus.REJECTED
_LATE = IngestStatus.LATE


class PartitionJoin:
    """The keyed join of one co-partitioned partition, restored from the changelog on assignment.

    :param new_joiner: an empty keyed join (of the given specs: all when None) that calls the given hooks when it
        lets go of a record, when it evicts a key (see `local_stream_buffer.eviction`), and when its clock rule gives up
        a record it held (see `local_stream_buffer.clock`).
    :param committed: the committed offset, where processing resumes (None: nothing committed yet).
    :param metadata: the committed offset's metadata: where each spec started (`pipeline_core.spec_starts`).
    :param specs: the join specs run now, by fingerprint (`local_stream_buffer.spec_changes`).
    """

    __slots__ = ("topic", "partition", "joiner", "changes", "committed", "position", "replay_below", "rebuilding",
                 "covered", "evicted", "dropped", "dead_letters", "_new_joiner", "known", "awaiting", "stopped_at",
                 "adopting", "specs", "starts")

    def __init__(self, topic: str, partition: int, new_joiner: Callable[..., KeyedJoiner],
                 committed: int | None, metadata: str | None, specs: Mapping[str, JoinSpec] | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.changes = StateChanges()
        # Per evicted key, its held records and the reason: dead-lettered in the transaction that deletes them.
        self.evicted: list[tuple[list[tuple[dict, int]], str]] = []
        # Records held before and given up by the clock rule (outliers; set aside, then turned away): dead-lettered
        # in the transaction of the record that settled them (their changelog tombstones go with it).
        self.dropped: list[tuple[dict, str]] = []
        self._new_joiner = new_joiner
        # Where each spec started here: a spec added since the last commit starts at the committed offset.
        self.specs = dict(specs or {})
        self.starts = starts_now(read_starts(metadata), list(self.specs), committed)
        self.joiner = self._fresh_joiner()
        self.committed = committed
        self.position: int | None = None  # next offset to ingest, once a frame arrived
        # After an upgrade from the earlier format, frames up to its processed position rebuild the state
        # silently, once; they go to the changelog like any other held record.
        processed = _earlier_processed(metadata)
        self.replay_below = processed if processed is not None and committed is not None else -1
        self.rebuilding = False  # reading the partition from its beginning to rebuild a lost state
        self.covered = committed  # the position the changelog says the held records cover
        # Of changelog records that are no held record: dead letters for the next transaction, which also
        # writes their tombstones (in `changes`), so each is dead-lettered once.
        self.dead_letters: list[bytes] = []
        # After the input grew (`handover`): things whose state this join holds, or that it found to have none
        # elsewhere; those it waits for, stopped before the offset `stopped_at` (None: not stopped).
        self.known: set[str] = set()
        self.awaiting: dict[str, Awaited] = {}
        self.stopped_at: int | None = None
        self.adopting = False  # a thing it waited for was handed over: restored from the changelog before it goes on

    def _fresh_joiner(self, held: list[StateRecord] | None = None) -> KeyedJoiner | CohortJoiner:
        """An empty join of the specs run now: one keyed join, or one per cohort of specs that started at different
        places (`cohorts`), judged by the records it is to restore (`held`; None: it is to read the partition
        from its beginning)."""
        evict = lambda records, reason: self.evicted.append((records, reason))  # noqa: E731
        drop = lambda record, _position, reason: self.dropped.append((record, reason))  # noqa: E731
        feeds = [] if held is None else [adopted_feeds(record.key) for record in held
                                         if record.position is not None and record.position < 0]
        own = [] if held is None else [record.position for record in held
                                       if record.position is not None and record.position >= 0]
        cohorts = plan(self._start_positions(), own, [fed for fed in feeds if fed is not None], rebuilding=held is None)
        if len(cohorts) <= 1:
            return self._new_joiner(self.changes.released, evict, drop)
        return CohortJoiner(cohorts, self.specs, lambda release, specs: self._new_joiner(release, evict, drop, specs),
                            self.changes.released)

    def replace_state(self, held: list[StateRecord], state_topic: str, releases: list[StateRecord] = ()) -> int:
        """The join afresh from the changelog's records of this partition (after handing a thing over, or adopting
        one: `handover`), at the position it is at; returns how many held records it restored."""
        return self.restore(held, state_topic, releases)

    def feeds(self, record: StateRecord) -> frozenset[str] | None:
        """The specs a held record feeds here (None: all): those started at or before it."""
        if record.position is not None and record.position < 0:
            return adopted_feeds(record.key)
        fed = frozenset(fingerprint for fingerprint, start in self._start_positions().items()
                        if record.position is None or start <= record.position)
        return None if fed == frozenset(self.starts) else fed

    def _start_positions(self) -> dict[str, int]:
        """Where each spec started as a record's place (`changelog.record_position`), which the join knows records
        by: the starts are committed offsets, a spec started at the first record of that offset's frame."""
        return {fingerprint: record_position(start, 0) for fingerprint, start in self.starts.items()}

    def state_lost(self, covered: int | None, held: list[StateRecord]) -> bool:
        """Whether the changelog misses state the committed offset counts on: it covers less than the committed
        offset, or (a changelog from before coverage records) it names no coverage and holds nothing."""
        if not self.committed or self.replay_below >= 0:
            return False  # nothing committed, or an upgrade from the earlier format, which rebuilds from its input
        return covered < self.committed if covered is not None else not held

    def rebuild(self, held: list[StateRecord], releases: list[StateRecord] = ()) -> None:
        """Rebuild the lost state from the partition's beginning, silently up to the committed offset. Whatever
        the changelog still holds describes another state: it goes, by tombstones at the next commit (release
        records too: the rebuilt state knows no idle releases, see the package README)."""
        self.changes.deletes.extend(record.position if record.position is not None else record.key
                                    for record in (*held, *releases)
                                    if record.position is not None or record.key is not None)
        self.replay_below = self.committed
        self.rebuilding = True
        # The changelog covers nothing now: the rebuild's end is written as its coverage even where no record
        # follows the committed offset, or every restart would take the state for lost again.
        self.covered = None

    def restore(self, held: list[StateRecord], state_topic: str, releases: list[StateRecord] = ()) -> int:
        """Re-ingest the held records of the changelog, in their original order, silently, then apply its release
        records; returns how many held records. A changelog record that is none (a key that is no position, a
        value that is no record or release) is dropped with a dead letter and a tombstone, never stopping the
        assignment."""
        self.changes.adopted.clear()
        self.joiner = self._fresh_joiner(held)
        clocks = [record for record in releases if record.key is not None and record.key.startswith(CLOCK_PREFIX)]
        releases = [record for record in releases if record not in clocks]
        for record in clocks:
            try:
                thing, spec_name, axis, snapshot = decode_clock(record.key, record.value)
            except ValueError as error:
                self._reject(str(error), record, state_topic)
                continue
            if not self.joiner.restore_clock(thing, spec_name, axis, snapshot):
                self.changes.clocks[record.key] = None  # its join spec is gone, or has no clock rule any more
        ingest = self.joiner.restore_ingest
        restored = 0
        for record in held:
            try:
                if record.position is None:
                    raise InvalidRecord(f"changelog key {describe(record.key)} is no record position "
                                        "(8 bytes, big-endian)")
                decoded = decode_record(record.value)
            except InvalidRecord as error:
                self._reject(str(error), record, state_topic)
                continue
            if record.position < 0:  # adopted from another partition (`handover`): known by its key
                self.changes.adopted[record.position] = record.key
                fed = adopted_feeds(record.key)
                if fed is not None and isinstance(self.joiner, CohortJoiner):
                    self.joiner.feeds[record.position] = fed
            if isinstance(decoded.get("thing"), str):
                self.known.add(decoded["thing"])
            # What it lets go of again gets its tombstone at the next commit; so does a record it no longer takes
            # (a put whose tombstone compaction dropped, judged late behind a reorder buffer's watermark now).
            if ingest(decoded, record.position) is not _ACCEPTED:
                self.changes.released(record.position)
            restored += 1
        self.joiner.restored()
        for record in releases:
            try:
                release = decode_release(record.key, record.value)
            except ValueError as error:
                self._reject(str(error), record, state_topic)
                continue
            if not self.joiner.restore_release(*release):
                self.changes.deletes.append(record.key)  # its join spec is gone, or has no bound any more
        return restored

    def flush_state(self, produce_state: Callable[[int, bytes, bytes | None], None],
                    produce_dead_letter: Callable[[bytes], None]) -> None:
        """Hand what changed in the held records since the last commit (and what the clock rule changed), and the
        offset they cover, to `produce_state(partition, key, value)` (value None: a tombstone), and the dead letters
        of changelog records dropped on restore to `produce_dead_letter`."""
        for letter in self.dead_letters:
            produce_dead_letter(letter)
        self.dead_letters.clear()
        for thing, spec_name, axis, snapshot in self.joiner.clock_changes():
            self.changes.clocks[clock_key(thing, spec_name, axis)] = None if snapshot is None else json.dumps(
                snapshot, separators=(",", ":")).encode()
        self.changes.flush(lambda key, value: produce_state(self.partition, key, value))
        covered = self.coverage()
        if covered is not None:
            produce_state(self.partition, COVERAGE_KEY, coverage_value(covered))

    def release_idle(self) -> list[dict]:
        """Release the quiet streams of this partition's join (a spec's ``idle_release_s``): the output records
        that became certain; each release goes to the changelog with the next commit. Nothing while the state
        is being rebuilt: its arrivals are not the records' own."""
        if self.replaying:
            return []
        outputs, releases = self.joiner.release_idle()
        for release in releases:
            binding = release.binding
            self.changes.releases[release_key(release.thing, binding.spec.name, binding.axis, release.side)] = \
                repr(float(release.up_to_ms)).encode()
        return outputs

    def _reject(self, reason: str, record: StateRecord, state_topic: str) -> None:
        self.dead_letters.append(dead_letter(
            f"state record dropped: {reason}", record.value, STAGE, topic=state_topic, partition=self.partition,
            offset=record.offset, key=describe(record.key, limit=200) if record.key is not None else None))
        if record.position is not None and record.position >= 0:
            self.changes.deletes.append(record.position)
        elif record.key is not None:
            self.changes.deletes.append(record.key)

    @property
    def replaying(self) -> bool:
        start = 0 if self.rebuilding else self.committed or 0
        return (self.position if self.position is not None else start) < self.replay_below

    def coverage(self) -> int | None:
        """The offset the changelog's records cover once this commit is through, if it moved since the last."""
        if self.position is None or self.replaying or self.position == self.covered:
            return None
        self.covered = self.position
        return self.position

    def commit_position(self) -> TopicPartition | None:
        """The processed position to commit, if anything was processed, with where each spec started."""
        if self.position is None:
            return None
        if self.replaying:
            if self.rebuilding:  # no coverage is written meanwhile: a restart rebuilds from the beginning again
                return self._committing(self.committed)
            # Mid-replay after an upgrade: a restart must replay the same frames, so the commit stays as it was.
            return self._committing(self.committed, f"{_EARLIER_FORMAT}{self.replay_below}")
        return self._committing(self.position)

    def _committing(self, offset: int, metadata: str | None = None) -> TopicPartition:
        """`offset` to commit, its metadata naming where each spec started (`pipeline_core.spec_starts`)."""
        if self.starts:
            metadata = with_starts(metadata, self.starts)
        if metadata is None:
            return TopicPartition(self.topic, self.partition, offset)
        return TopicPartition(self.topic, self.partition, offset, metadata=metadata)


def _moved(join: PartitionJoin, thing: str, placement: tuple[int, ...], position: int) -> bool:
    """Whether `thing`'s state may lie in another partition (it was placed by other counts before, which put it
    elsewhere): it is then awaited (`handover`). Otherwise the join knows the thing from now on."""
    homes = earlier_homes(thing, placement)
    if not homes:
        join.known.add(thing)
        return False
    join.awaiting[thing] = Awaited(position, placement[:-1], homes)
    return True


def _await_moved(join: PartitionJoin, frame: list[FramedRecord], frame_offset: int) -> None:
    """A frame of a stopped partition: the things among its records whose state may lie elsewhere are asked for
    too, so that one handover brings the things of many records."""
    for slot, framed in enumerate(frame):
        placement = framed.placement
        if placement is None or len(placement) < 2:
            continue
        try:
            thing = decode_record(framed.value)["thing"]
        except InvalidRecord:
            continue
        if thing not in join.known and thing not in join.awaiting:
            _moved(join, thing, placement, record_position(frame_offset, slot))


def _earlier_processed(metadata: str | None) -> int | None:
    metadata = without_starts(metadata)
    if not metadata or not metadata.startswith(_EARLIER_FORMAT):
        return None
    try:
        return int(metadata[len(_EARLIER_FORMAT):])
    except ValueError:
        return None


class FrameJoiner:
    """Joins frames of the co-partitioned topic into their partition's join; produces the outputs and dead
    letters of records processed for the first time into the open transaction.

    :param frame_of: the records of a message of the co-partitioned topic (a frame, or one input record). Read
        as the join reaches the message: a batch the transaction interrupts is handed over again from there.
    :param partitions: partitions of the co-partitioned topic (a record lies in its thing's partition); `counts`
        holds every count it is known to have had, which a record that names none of its own is judged by.
    :param dead_letter_max_bytes: the largest dead letter the DLQ topic takes (`topics.dead_letter_limit`).
    """

    def __init__(self, transaction: Transaction, stats: JoinerStats, input_topic: str,
                 output_topic: str, dlq_topic: str, frame_of: Callable[[Message], list[FramedRecord]],
                 partitions: int, dead_letter_max_bytes: int = DEAD_LETTER_MAX_BYTES) -> None:
        self._transaction = transaction  # and its producer, which a failure may replace
        self._stats = stats
        self._input_topic = input_topic
        self._output_topic = output_topic
        self._dlq_topic = dlq_topic
        self._frame_of = frame_of
        self.counts: tuple[int, ...] = (partitions,)
        self._dead_letter_max_bytes = dead_letter_max_bytes

    def join(self, messages: list[Message], joins: dict[int, PartitionJoin]) -> int:
        """Join the frames among `messages` in order, each into its partition's join, until the transaction
        is due (checked every few hundred records); returns how many messages were handled.

        Each record is held as its place in the partition (`changelog.record_position`); what the join still
        holds at the commit goes to the changelog. Outputs and dead letters come from records processed for
        the first time (all of them, except while replaying after an upgrade). (One loop over all records of
        the batch: it is the hot path, run once per input record.)
        """
        transaction = self._transaction
        append_times = transaction.append_times
        producer = transaction.producer
        produce_output = producer.produce
        output_topic = self._output_topic
        counts = self.counts
        joined = rebuilt = records_since_check = 0
        join: PartitionJoin | None = None
        current = -1  # the partition `join` belongs to
        frame_of = self._frame_of
        for index, message in enumerate(messages):
            frame = frame_of(message)
            partition = message.partition()
            if partition != current:
                current = partition
                join = joins.get(partition)
                if join is not None:
                    ingest = join.joiner.ingest
                    held_since_commit = join.changes.puts
                    replay_below = join.replay_below
            if join is None:
                continue  # not ours (any more): whoever owns the partition reads it
            frame_offset = message.offset()
            if join.stopped_at is not None:
                _await_moved(join, frame, frame_offset)  # read again once the things it waits for are there
                continue
            replay = frame_offset < replay_below
            first_position = record_position(frame_offset, 0)
            for slot, framed in enumerate(frame):
                records_since_check += 1
                # The admission rule (`pipeline_core.admission`): what its key skips never reaches this point.
                placement = framed.placement
                try:
                    record = decode_record(framed.value)
                    refused = refusal(framed.key, record, partition, counts,
                                      placement[-1] if placement is not None else None)
                except InvalidRecord as error:
                    refused = str(error)
                if refused is not None:
                    if not replay:
                        self._dead_letter(refused, framed)
                    continue
                position = first_position + slot
                if placement is not None and len(placement) > 1 and record["thing"] not in join.known \
                        and _moved(join, record["thing"], placement, position):
                    join.stopped_at = frame_offset  # its state lies elsewhere: this frame waits for it
                    break
                status, outputs, reason = ingest(record, position)
                if status is _ACCEPTED:
                    held_since_commit[position] = framed.value
                if join.dropped:
                    self._dead_letter_dropped(join, produce=not replay)
                if replay:
                    rebuilt += 1
                    continue
                joined += 1
                if status is not _ACCEPTED:
                    if status is _REJECTED:
                        self._dead_letter(reason or "rejected", framed)
                    elif status is _LATE:
                        self._dead_letter(reason or Rejection.LATE.reason(), framed)
                for output in outputs:
                    if not is_finite_result(output):
                        self._dead_letter(Rejection.NOT_FINITE.reason(), framed,
                                          output=json.dumps(output, default=repr))
                        continue
                    payload = encode_record(output)
                    key = record_key(output["thing"], output["quantity"])
                    try:
                        produce_output(output_topic, payload, key)
                    except BufferError:  # local queue full: the shared helper waits for deliveries to drain it
                        refused = produce(producer, output_topic, payload, key)
                        if refused is not None:  # an output record is a few kB: never expected
                            raise KafkaException(refused) from None
                    append_times.append(framed.append_time)
            if join.stopped_at is not None:
                continue
            # Past the frame as soon as it is joined: whenever the transaction commits, its offsets cover
            # exactly the frames whose outputs and state changes it holds.
            join.position = frame_offset + 1
            if records_since_check >= _DUE_CHECK_RECORDS:
                transaction.records += records_since_check
                records_since_check = 0
                if transaction.due():
                    index += 1
                    break
        else:
            index = len(messages)
        for evicting in joins.values():
            if evicting.evicted:
                self._dead_letter_evicted(evicting)
        transaction.records += records_since_check
        self._stats.joined_in += joined
        self._stats.rebuilt += rebuilt
        return index

    def release_idle(self, joins: dict[int, PartitionJoin]) -> int:
        """Release the quiet streams of every join (see `PartitionJoin.release_idle`) and produce their outputs into
        the transaction, begun here if something was released; returns how many outputs."""
        produced = 0
        for join in joins.values():
            outputs = join.release_idle()
            if not join.changes.releases:
                continue
            if not self._transaction.open:
                self._transaction.begin()
            for output in outputs:
                if not is_finite_result(output):
                    payload = json.dumps(output, default=repr).encode()
                    self.produce_dead_letter(dead_letter(Rejection.NOT_FINITE.reason(), payload, STAGE,
                                                         self._dead_letter_max_bytes, topic=self._output_topic))
                    continue
                refused = produce(self._transaction.producer, self._output_topic, encode_record(output),
                                  record_key(output["thing"], output["quantity"]))
                if refused is not None:  # an output record is a few kB: never expected
                    raise KafkaException(refused)
                # Counted, and its latency measured, from the release: no input record completed it.
                self._transaction.append_times.append(int(time.time() * 1000))
                produced += 1
        return produced

    def _dead_letter_dropped(self, join: PartitionJoin, produce: bool) -> None:
        """The records the clock rule gave up after holding them (`local_stream_buffer.clock`): dead-lettered as
        the Spark joiner writes them (no partition or offset: they are from earlier frames), unless replaying."""
        if produce:
            for record, reason in join.dropped:
                key = record_key(record["thing"], record["quantity"])
                self.produce_dead_letter(dead_letter(reason, evicted_payload(record), STAGE,
                                                     self._dead_letter_max_bytes, topic=self._input_topic, key=key),
                                         key.encode())
        join.dropped.clear()

    def _dead_letter_evicted(self, join: PartitionJoin) -> None:
        """The records held by keys the key bound evicted: given up, so dead-lettered (their changelog
        tombstones go in the same transaction)."""
        for records, reason in join.evicted:
            for record, _position in records:
                key = record_key(record["thing"], record["quantity"])
                self.produce_dead_letter(dead_letter(reason, evicted_payload(record), STAGE,
                                                     self._dead_letter_max_bytes, topic=self._input_topic, key=key),
                                         key.encode())
            self._stats.evicted += len(records)
        join.evicted.clear()

    def _dead_letter(self, reason: str, framed: FramedRecord, **context: object) -> None:
        key = framed.key
        envelope = dead_letter(reason, framed.value, STAGE, self._dead_letter_max_bytes, topic=self._input_topic,
                               partition=framed.partition, offset=framed.offset,
                               key=key.decode("utf-8", "replace") if key is not None else None, **context)
        # Keyed like the record, unless its key is larger than any record key of the pipeline.
        self.produce_dead_letter(envelope, key if key is not None and len(key) <= _MAX_LETTER_KEY_BYTES else None)

    def produce_dead_letter(self, envelope: bytes, key: bytes | None = None) -> None:
        """Produce a dead letter into the open transaction. None is larger than the DLQ topic takes: one the broker
        refused would abort the transaction on every try. A letter made larger (`PartitionJoin.restore`'s), or one
        the client refuses all the same, goes without its payload."""
        if len(envelope) > self._dead_letter_max_bytes:
            envelope = payload_omitted(envelope, f"larger than the {self._dlq_topic} limit", STAGE)
        producer = self._transaction.producer
        refused = produce(producer, self._dlq_topic, envelope, key)
        if refused is not None:
            refused = produce(producer, self._dlq_topic, payload_omitted(envelope, refused.str(), STAGE), key)
        if refused is not None:
            raise KafkaException(refused)
        self._stats.dead_letters += 1
