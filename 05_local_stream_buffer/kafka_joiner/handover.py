"""A thing's join state moved with its records, after the input topic grew (input partitioned by thing).

The stream connector places a thing's records by the topic's partition count (`pipeline_core.partitioning`). Once
machine.data grew from 5 to 8 partitions and the connector placed by 8 (it waits until the joiners read what it
placed by 5: `stream_connector.partition_switch`), most things' records go on in another partition, while what
their joins hold lies in the old one. Each record names the counts its writer placed by (`PLACEMENT_HEADER`), so
the join of the new partition knows where the thing's state lay. It hands the state over through a topic of its own
(`<state topic>.handover`, one partition per partition of the input), in three steps, each in a transaction:

1. **request**: the join of the new partition meets a record of a thing it knows nothing of, whose earlier
   counts put it elsewhere. It stops that partition before the record (its position stays there), and writes
   a request to the handover partition of the thing's earlier partition: the thing, where its first record lies,
   the counts it was placed by before.
2. **hand over**: the owner of the earlier partition reads the request. Once its join has read every record of
   the thing placed there (it looks ahead in its input for them: none may wait unread), it copies what its join
   holds of the thing into the new partition's changelog as adopted records (`changelog.adopted_key`: they are
   re-ingested before the thing's first record there), deletes them from its own changelog and its join, and
   writes `done` (found or not) to the new partition's handover partition.
3. **adopt**: the owner of the new partition reads `done`, and restores its join from its changelog, now with the
   adopted records: found or not, since an answer to an earlier request (one the partition's owner before a
   rebalance asked) may have put them there after this owner restored the partition. Not found, and the thing's
   state may lie under a count before: the request goes there next. It reads on from the stopped record.

A request is answered once the thing's records before its first record in the new partition are all read, and a
partition stops only at a record written after those, so two partitions never wait on each other. A request read
again (after a crash) is answered again: the state went already, so `done` says not found, which the new partition
ignores unless it waits for that thing. The handover partitions' positions are committed with the transactions.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pipeline_core.admission import key_text
from pipeline_core.kafka_clients import consumer_config
from pipeline_core.partitioning import placement_history

from .changelog import decode_clock

log = logging.getLogger(__name__)

# Requests and answers are small and read within moments; a week keeps one that waits for a partition's owner.
HANDOVER_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(7 * 24 * 3600 * 1000)}
_SCAN_BATCH = 10_000
# How long a look ahead in a partition may go without Kafka answering.
_SCAN_TIMEOUT_S = 30.0


def handover_topic_name(state_topic: str) -> str:
    return f"{state_topic.removesuffix('.state')}.handover"


def moved_clock(key: bytes, value: bytes, places: dict[int, int]) -> bytes:
    """A clock record (`changelog.decode_clock`) handed over with its thing: the held records its snapshot names
    (the records its clock rule sets aside, and those it holds in timelines a side left) renamed by `places`, their
    place where they lie now -> their place in the partition that adopts them. One that names none is unchanged."""
    *_, snapshot = decode_clock(key, value)
    moved = dict(snapshot)
    moved["aside"] = [[places.get(source, source) for source in sources] for sources in snapshot["aside"]]
    moved["left_lines"] = [{line: [places.get(source, source) for source in sources] for line, sources in lines.items()}
                           for lines in snapshot["left_lines"]]
    return json.dumps(moved, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Request:
    """A join asks for a thing's state: it lies in `to` from position `at` on, was placed by `counts` before."""

    thing: str
    to: int
    at: int
    counts: tuple[int, ...]

    def encode(self) -> bytes:
        return json.dumps({"request": self.thing, "to": self.to, "at": self.at, "counts": list(self.counts)}).encode()


@dataclass(frozen=True)
class Done:
    """The state of `thing` was handed over from partition `source` to the asker (`found`), or lay not there."""

    thing: str
    source: int
    found: bool

    def encode(self) -> bytes:
        return json.dumps({"done": self.thing, "from": self.source, "found": self.found}).encode()


def decode(value: bytes | None) -> Request | Done | None:
    """A message of the handover topic; None when it is none (only the joiner writes the topic: skipped)."""
    try:
        message = json.loads(value or b"")
        if "request" in message:
            counts = tuple(int(count) for count in message["counts"])
            return Request(str(message["request"]), int(message["to"]), int(message["at"]), counts)
        if "done" in message:
            return Done(str(message["done"]), int(message["from"]), bool(message["found"]))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        pass
    return None


@dataclass
class Awaited:
    """A thing a stopped partition waits for: where its first record lies, and the partitions left to ask."""

    at: int
    counts: tuple[int, ...]
    homes: list[int]
    requested: bool = False


@dataclass
class Pending:
    """A request read and not yet answered: answered once the partition read past `last` (None: nothing of the
    thing waits unread there)."""

    offset: int  # in the handover partition
    request: Request
    last: int | None


@dataclass
class HandoverPartition:
    """What one owned partition's handover partition holds in hand."""

    position: int | None = None  # the next message to read (None: from the committed offset)
    pending: list[Pending] = field(default_factory=list)

    def commit_position(self) -> int | None:
        """Up to where it may be committed: before the first request not yet answered."""
        if self.pending:
            return min(pending.offset for pending in self.pending)
        return self.position


class Handover:
    """The handover partitions of the owned partitions: reads them, and says which requests are due.

    :param topic: the handover topic; `input_topic`: where the things' records lie.
    :param joinable_thing: the thing of a record key a join needs (the spec resolver's).
    """

    def __init__(self, bootstrap_servers: str, group_id: str, topic: str, input_topic: str, joinable_thing,
                 security: Mapping[str, str] | None = None) -> None:
        self.topic = topic
        self._input_topic = input_topic
        self._joinable_thing = joinable_thing
        self._config = consumer_config(bootstrap_servers, f"{group_id}.handover", **(security or {}),
                                       **{"enable.partition.eof": True, "fetch.wait.max.ms": 10})
        self._consumer = Consumer(self._config)
        self._scanner = Consumer(self._config)
        self.partitions: dict[int, HandoverPartition] = {}
        self.requests_sent = 0
        self.handed_over = 0

    def assign(self, committed: Iterable[TopicPartition]) -> None:
        """Read the handover partitions of newly owned partitions from their committed offsets."""
        for position in committed:
            self.partitions[position.partition] = HandoverPartition()
        self._reassign(committed)

    def reset(self, committed: Iterable[TopicPartition]) -> None:
        """Back to the committed positions (after an aborted transaction): what was read since is read again."""
        self.partitions.clear()
        self.assign(committed)

    def revoke(self, partitions: Iterable[int]) -> None:
        for partition in partitions:
            self.partitions.pop(partition, None)
        self._reassign([])

    def _reassign(self, committed: Iterable[TopicPartition]) -> None:
        starts = {position.partition: position.offset for position in committed}
        wanted = []
        for partition, state in self.partitions.items():
            offset = state.position if state.position is not None else starts.get(partition, OFFSET_BEGINNING)
            wanted.append(TopicPartition(self.topic, partition, offset if offset >= 0 else OFFSET_BEGINNING))
        self._consumer.assign(wanted)

    def poll(self) -> list[tuple[int, int, Request | Done]]:
        """The messages that came since the last poll: (partition, offset, message), in order per partition."""
        if not self.partitions:
            return []
        found = []
        for message in self._consumer.consume(500, 0):
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    if error.fatal():
                        raise KafkaException(error)
                    log.warning("reading %s: %s", self.topic, error)
                continue
            state = self.partitions.get(message.partition())
            if state is None:
                continue
            state.position = message.offset() + 1
            decoded = decode(message.value())
            if decoded is None:
                log.warning("%s [%d] offset %d is no handover message: skipped", self.topic, message.partition(),
                            message.offset())
                continue
            found.append((message.partition(), message.offset(), decoded))
        return found

    def positions(self) -> list[TopicPartition]:
        """The handover partitions' positions to commit."""
        found = []
        for partition, state in self.partitions.items():
            position = state.commit_position()
            if position is not None:
                found.append(TopicPartition(self.topic, partition, position))
        return found

    def last_unread(self, partition: int, start: int | None, request: Request) -> int | None:
        """The offset of the last record of `request.thing` placed in `partition` by one of its earlier counts (or by
        a writer that names no counts) that lies at or after `start` (the join's position); None when none does."""
        start_offset = start if start is not None and start >= 0 else OFFSET_BEGINNING
        self._scanner.assign([TopicPartition(self._input_topic, partition, start_offset)])
        last = None
        deadline = time.monotonic() + _SCAN_TIMEOUT_S
        try:
            while True:
                # A short wait per call: consume() waits for a full batch or its timeout, and the end comes sooner.
                messages = self._scanner.consume(_SCAN_BATCH, 0.05)
                if not messages and time.monotonic() > deadline:
                    raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"no answer reading {self._input_topic} "
                                                                           f"[{partition}] for a handover"))
                ended = False
                for message in messages:
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            ended = True
                        elif error.fatal():
                            raise KafkaException(error)
                        continue
                    text = key_text(message.key())
                    if text is None or self._joinable_thing(text) != request.thing:
                        continue
                    history = placement_history(message.headers())
                    if history is None or history[-1] in request.counts:
                        last = message.offset()
                if ended:
                    return last
        finally:
            self._scanner.unassign()

    def close(self) -> None:
        self._consumer.close()
        self._scanner.close()
