"""Placing records by a grown topic's new partition count, once nothing placed by the old count waits unread.

The connector writes every record of a thing to `thing_partition(thing, count)` (`pipeline_core.partitioning`).
Kafka lets an operator add partitions to machine.data at any time (the admin API, `kafka-topics --alter`); from
then on most things map to another partition, while their records placed by the old count may still wait,
unread, in the old one. A joiner that met a thing's new records first would see its stream out of order. So the
connector keeps placing records by the count it placed them with until the joiners have read every record it
placed so, and only then switches:

1. Every `check_interval_s` it reads the topic's partition count. A count above the one it places by is a
   growth; the topic cannot shrink (a smaller count means the topic was deleted and created anew: it places by
   that at once).
2. It holds the rows that arrive (unacknowledged, so MQTT QoS 1 keeps them safe; the broker sends at most its
   window of unacknowledged rows), waits until Kafka confirmed every record in flight, and notes where its own
   records end in each old partition: past the last one it wrote, and past what the topic held when it started
   (what an earlier run of it wrote).
3. It waits until each joiner's consumer group (`joiner_groups`) that has a position in the topic has read
   every record below those ends (`pipeline_core.group_offsets.unread_below`: what lies between is at most
   transaction markers and aborted records).
4. Read in time: it records the new count among the counts it has placed records with (`PlacementRecord`, in
   Kafka, before any record is placed by it), places the held rows and every later one by the new count. Not
   read within `max_pause_s`: it places the held rows by the old count, says why in its log and heartbeat, and
   tries again `retry_s` later.

Each instance does this for the things it serves, on its own: a thing's records come from one instance (its topic
filters), so a thing never has records placed by two counts unread at once. Every record names the counts its
writer has placed records with (`PLACEMENT_HEADER`), so a joiner knows where a thing's earlier records lie.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pipeline_core import group_offsets
from pipeline_core.partitioning import PLACEMENT_HEADER, placement_history, placement_value

log = logging.getLogger(__name__)

# The group whose commit metadata keeps an instance's counts: `<its MQTT client id>.partitioning`.
PLACEMENT_GROUP_SUFFIX = ".partitioning"
# Between two looks at whether the joiners have read what was placed by the old count, while rows are held.
CONSUMED_CHECK_INTERVAL_S = 0.25


def placement_group(mqtt_client_id: str) -> str:
    return mqtt_client_id + PLACEMENT_GROUP_SUFFIX


class PlacementRecord:
    """The partition counts an instance has placed records with, oldest first: its group's commit metadata on
    partition 0 of the data topic, so that a restart goes on with the count it placed by, never back."""

    def __init__(self, bootstrap_servers: str, mqtt_client_id: str, topic: str,
                 security: Mapping[str, str] | None = None) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._group = placement_group(mqtt_client_id)
        self._topic = topic
        self._security = dict(security or {})

    def read(self) -> tuple[int, ...] | None:
        client = group_offsets.group_client(self._bootstrap_servers, self._group, self._security)
        try:
            position = group_offsets.committed(client, self._topic, 1).get(0)
        finally:
            client.close()
        if position is None or not position.metadata:
            return None
        return placement_history([(PLACEMENT_HEADER, position.metadata.encode())])

    def write(self, history: tuple[int, ...]) -> None:
        client = group_offsets.group_client(self._bootstrap_servers, self._group, self._security)
        try:
            group_offsets.commit(client, [TopicPartition(self._topic, 0, 0, placement_value(history).decode())])
        finally:
            client.close()


@dataclass
class SwitchSettings:
    topic: str
    joiner_groups: tuple[str, ...]
    check_interval_s: float
    max_pause_s: float
    retry_s: float


class PartitionSwitch:
    """Which partition count the connector places records by, and the switch to a grown topic's new one (see the
    module doc). The connector calls `step` from its loop and `hold` for every row while `holding`."""

    def __init__(self, settings: SwitchSettings, bootstrap_servers: str, record: PlacementRecord,
                 history: tuple[int, ...], started_ends: Mapping[int, int],
                 security: Mapping[str, str] | None = None, reader_group: str = "stream-connector-tail",
                 clock=time.monotonic) -> None:
        self.settings = settings
        self._bootstrap_servers = bootstrap_servers
        self._record = record
        self._security = dict(security or {})
        self._reader_group = reader_group
        self._clock = clock
        self.history = history
        self.header = [(PLACEMENT_HEADER, placement_value(history))]
        # Where the topic ended when this run started: what earlier runs placed lies below.
        self._started_ends = dict(started_ends)
        # Per partition, past the last record this run wrote there (Kafka's confirmation says where).
        self.written_ends: dict[int, int] = {}
        self.topic_partitions = history[-1]
        self.held: deque = deque()
        self.holding_since: float | None = None
        self.note: str | None = None  # why the connector places by fewer partitions than the topic has
        now = clock()
        self._next_check_at = now + settings.check_interval_s
        self._next_try_at = now
        self._next_consumed_check_at = now
        self._groups: dict[str, Consumer] = {}
        self.switches = 0

    @classmethod
    def started(cls, settings: SwitchSettings, bootstrap_servers: str, mqtt_client_id: str, topic_partitions: int,
                started_ends: Mapping[int, int], security: Mapping[str, str] | None = None) -> PartitionSwitch:
        """The switch of a connector that starts: the counts it placed records with before (written down now if
        this is its first run, or the topic was created anew with fewer partitions), the topic's count now."""
        record = PlacementRecord(bootstrap_servers, mqtt_client_id, settings.topic, security)
        history = record.read()
        if history is None or history[-1] > topic_partitions:
            if history is not None:
                log.warning("%s has %d partitions, fewer than the %d this connector placed records by: the topic was "
                            "created anew; placing by %d", settings.topic, topic_partitions, history[-1],
                            topic_partitions)
            history = (topic_partitions,)
            record.write(history)
        switch = cls(settings, bootstrap_servers, record, history, started_ends, security)
        switch.observed(topic_partitions)
        return switch

    @property
    def partitions(self) -> int:
        """The partition count records are placed by now."""
        return self.history[-1]

    @property
    def holding(self) -> bool:
        return self.holding_since is not None

    def delivered(self, partition: int, offset: int) -> None:
        """Kafka confirmed a record of this run at `offset` of `partition`."""
        if offset >= self.written_ends.get(partition, 0):
            self.written_ends[partition] = offset + 1

    def observed(self, topic_partitions: int) -> None:
        """The topic's partition count, as just read."""
        if topic_partitions == self.topic_partitions:
            return
        if topic_partitions < self.partitions:
            log.warning("%s now has %d partitions, fewer than the %d records are placed by: the topic was created "
                        "anew; placing by %d", self.settings.topic, topic_partitions, self.partitions,
                        topic_partitions)
            self._adopt((topic_partitions,))
            self.topic_partitions = topic_partitions
            return
        if topic_partitions > self.topic_partitions:
            log.info("%s grew from %d to %d partitions: records go on being placed by %d until the joiners have read "
                     "every record placed so", self.settings.topic, self.topic_partitions, topic_partitions,
                     self.partitions)
        self.topic_partitions = topic_partitions
        self._next_try_at = self._clock()

    def check_due(self) -> bool:
        """Whether the topic's partition count is due to be read (and noted as read)."""
        now = self._clock()
        if now < self._next_check_at:
            return False
        self._next_check_at = now + self.settings.check_interval_s
        return True

    def should_hold(self) -> bool:
        """Whether a switch is due: the connector then holds the rows that arrive (`hold`)."""
        if self.holding or self.topic_partitions <= self.partitions or self._clock() < self._next_try_at:
            return False
        self.holding_since = self._clock()
        self._next_consumed_check_at = self.holding_since
        log.info("holding new rows while the joiners read what was placed by %d partitions of %s (at most %g s)",
                 self.partitions, self.settings.topic, self.settings.max_pause_s)
        return True

    def hold(self, message: object) -> None:
        self.held.append(message)

    def step(self, in_flight: bool, producer_knows: Callable[[int], bool] = lambda count: True) -> bool:
        """While holding: once nothing is in flight (`in_flight` False), look whether the joiners have read what
        was placed by the old count; switch when they have (and the producer knows the new partitions:
        `producer_knows(count)`, which asks Kafka again), give up when they have not within the pause. True when the
        held rows are to be placed now (`release`)."""
        if not self.holding:
            return False
        now = self._clock()
        waited_s = now - self.holding_since
        if not in_flight and now >= self._next_consumed_check_at:
            self._next_consumed_check_at = now + CONSUMED_CHECK_INTERVAL_S
            unread = self._unread()
            if unread is None and not producer_knows(self.topic_partitions):
                unread = f"the producer does not know {self.topic_partitions} partitions of {self.settings.topic} yet"
            if unread is None:
                self._switch(waited_s)
                return True
            if waited_s >= self.settings.max_pause_s:
                self._give_up(unread, waited_s)
                return True
            return False
        if waited_s >= self.settings.max_pause_s:
            self._give_up("records of this connector were still on their way to Kafka", waited_s)
            return True
        return False

    def release(self) -> list:
        """The held rows, in the order they came; holding ends."""
        rows = list(self.held)
        self.held.clear()
        self.holding_since = None
        return rows

    def abandon(self) -> None:
        """The MQTT connection or Kafka client was started afresh: the broker sends the held rows again (they were
        never acknowledged), and the switch is tried again."""
        self.held.clear()
        if self.holding_since is not None:
            self.holding_since = None
            self._next_try_at = self._clock()

    def ends(self) -> dict[int, int]:
        """Per partition placed by the count now, past every record placed there so far."""
        return {partition: max(self._started_ends.get(partition, 0), self.written_ends.get(partition, 0))
                for partition in range(self.partitions)}

    def _unread(self) -> str | None:
        """Why records placed by the count now may still wait unread by a joiner, or None when none does."""
        ends = {partition: end for partition, end in self.ends().items() if end > 0}
        with_position = 0
        try:
            for group in self.settings.joiner_groups:
                client = self._groups.get(group)
                if client is None:
                    client = self._groups[group] = group_offsets.group_client(self._bootstrap_servers, group,
                                                                               self._security)
                committed = group_offsets.committed(client, self.settings.topic, self.partitions)
                if not committed:
                    continue  # a joiner that never ran here (the other joiner)
                with_position += 1
                starts = {partition: position.offset for partition, position in committed.items()}
                unread = group_offsets.unread_below(self._bootstrap_servers, self._reader_group, self.settings.topic,
                                                    starts, ends, self._security)
                if unread is None:
                    return "Kafka did not answer in time"
                if unread:
                    partition, offset = min(unread.items())
                    return (f"group {group} has not read partition {partition} from offset {offset:,} "
                            f"(records were placed there up to {ends[partition]:,})")
        except KafkaException as error:
            return f"Kafka did not answer: {error.args[0]}"
        if not with_position:
            return (f"none of the joiner groups {', '.join(self.settings.joiner_groups) or '(none set)'} has a "
                    f"position in {self.settings.topic} yet")
        return None

    def _switch(self, waited_s: float) -> None:
        history = (*self.history, self.topic_partitions)
        try:
            self._record.write(history)
        except KafkaException as error:
            self._give_up(f"the new count could not be recorded in Kafka ({error.args[0]})", waited_s)
            return
        previous = self.partitions
        self._adopt(history)
        self.switches += 1
        self._close_groups()
        log.info("placing records by %d partitions of %s from now on (before: %d): the joiners had read every record "
                 "placed by %d, %.2f s after the rows were held", self.partitions, self.settings.topic, previous,
                 previous, waited_s)

    def _give_up(self, why: str, waited_s: float) -> None:
        self._next_try_at = self._clock() + self.settings.retry_s
        self._close_groups()
        self.note = (f"places records by {self.partitions} of the {self.topic_partitions} partitions of "
                     f"{self.settings.topic} until the joiners have read every record placed so: {why}; "
                     f"next try in {self.settings.retry_s:g} s")
        log.warning("not switching to %d partitions of %s after holding rows for %.1f s: %s; placing them by %d and "
                    "trying again in %g s", self.topic_partitions, self.settings.topic, waited_s, why,
                    self.partitions, self.settings.retry_s)

    def _adopt(self, history: tuple[int, ...]) -> None:
        self.history = history
        self.header = [(PLACEMENT_HEADER, placement_value(history))]
        self.written_ends = {}
        self._started_ends = {}
        self.note = None

    def _close_groups(self) -> None:
        for client in self._groups.values():
            client.close()
        self._groups.clear()

    def close(self) -> None:
        self._close_groups()
