"""What the DB connector's Kafka loop needs of a store: the sink interface.

The loop (`connector.py`) consumes, batches, pauses its partitions while the sink cannot take a batch,
dead-letters what the sink cannot convert or refuses, and commits offsets only after `write` returned. A sink
converts one record into an item of its own and writes a batch of items; it keeps no batch and no offsets, and
never waits: when its store is away it raises `SinkUnavailable` and the loop retries the same items later.

Writing the same items twice must store them once (the loop re-writes a batch after an outage or a crash
before its commit): a sink's items are idempotent, as InfluxDB's points of one series and time are.
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

Item = TypeVar("Item")


class Source(enum.Enum):
    """Which topic a record came from: each is stored its own way."""

    DATA = "data"  # machine.data: raw quantities
    JOINED = "joined"  # machine.out: join results
    DEAD_LETTER = "dead_letter"  # machine.dlq: counted, whatever it holds


class Consumed(NamedTuple):
    """One Kafka record as a sink sees it: no client objects, only what it may store. (A tuple: one is made per
    record, and a frozen dataclass costs several times as much to make.)"""

    source: Source
    value: bytes | None
    timestamp_ms: int
    partition: int
    offset: int


@dataclass(frozen=True)
class Refused:
    """An item the store refused for itself (no retry can store it): dead-lettered with `reason`."""

    index: int  # position in the written batch
    reason: str


class SinkUnavailable(Exception):
    """The store cannot take the batch now (unreachable, failing, or asking to slow down): nothing of it may be
    committed; the loop pauses its partitions and writes the same items again after `retry_after_s`, or after
    its backoff's next pause when the store does not say."""

    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class Sink(ABC, Generic[Item]):
    """A store the DB connector writes into. `convert` runs for every record and raises
    `pipeline_core.records.InvalidRecord` for one the store cannot hold; `write` stores a batch."""

    # The store's name in logs and in the heartbeat's `waiting_for` while it is away.
    name: str

    def __str__(self) -> str:
        """Where the sink writes, for the stage's READY line."""
        return self.name

    def setup(self) -> None:
        """Make what the sink writes into (databases, tables), before the first record; raise
        `SinkUnavailable` while the store is away (the loop retries)."""

    @abstractmethod
    def convert(self, record: Consumed) -> Item:
        """The item that stores `record`; `InvalidRecord` (with the reason) for a record it cannot store."""

    @abstractmethod
    def write(self, items: Sequence[Item]) -> list[Refused]:
        """Store `items`; the ones the store refused for good, by index, each with the store's reason. Raises
        `SinkUnavailable` when the store could not be asked or failed: then the loop writes all of them again."""

    def health_values(self) -> Mapping[str, int]:
        """Figures of the sink for the stage's progress line and health point (requests, retries, ...)."""
        return {}
