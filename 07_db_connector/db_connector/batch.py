"""The batch: the records consumed since the last commit, each converted by the sink into its item, or into its
dead letter when the sink cannot convert it.

One `Batch.add` call per consumed chunk, its names bound once: this loop is the connector's per-record cost.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Message

from pipeline_core.records import InvalidRecord, dead_letter

from .sink import Consumed, Sink, Source

log = logging.getLogger(__name__)

STAGE = "db_connector"
# A named tuple's own constructor is Python code; tuple's makes the one per record at a third of the cost.
_consumed = tuple.__new__


class WriteAborted(Exception):
    """Stop was requested while the sink or Kafka was away; the batch was not (fully) written or committed."""


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
