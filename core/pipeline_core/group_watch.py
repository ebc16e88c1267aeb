"""Whether a consumer takes part in its group, told from librdkafka's statistics, and what to do when it cannot.

A consumer's group handler that is not "up" has no group coordinator: it cannot join, heartbeat or commit.
During a Kafka outage that is expected, and it comes back with Kafka. librdkafka (2.16) can also stay there with
Kafka back: after the broker was frozen while the DB connector waited for a commit, the consumer's coordinator
lookup sat in the queue of a connection that never came up again ("GroupCoordinator: Timed out 0 in-flight,
0 retry-queued, 1 out-queue", every 11 s), the session expired, the partitions were revoked and never assigned
again, and the process lived on reporting a lag of "?" without storing anything; a SIGTERM then hung in the
consumer's close. Nothing was lost (the batch stayed uncommitted), but nothing moved either.

The watch tells the two apart by asking Kafka about the group from an admin client of its own: a consumer still
outside its group `SERVED_GRACE_S` after Kafka answered for the group is wedged, and its process ends with
`WEDGED_CONSUMER_EXIT_CODE` so that supervision starts it again with a fresh consumer. The grace covers a
consumer's own way back after an outage (its reconnect back-off is at most 10 s), so an outage of any length ends
with the consumer rejoining, never with an exit.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from .lifecycle import end_process

log = logging.getLogger(__name__)

# How often librdkafka hands the consumer's statistics to `GroupWatch.on_statistics` (`statistics.interval.ms`).
STATISTICS_INTERVAL_MS = 5_000
# Outside its group this long, the consumer's process asks Kafka whether it serves the group...
PROBE_AFTER_S = 30.0
# ...at most this often...
PROBE_INTERVAL_S = 5.0
# ...and ends when the consumer is still outside this long after the first answer.
SERVED_GRACE_S = 30.0
PROBE_TIMEOUT_S = 10.0
# EX_TEMPFAIL: a fresh start is expected to work.
WEDGED_CONSUMER_EXIT_CODE = 75
# librdkafka's name of a group handler state with its coordinator known and connected.
_UP = "up"


@dataclass(frozen=True)
class GroupHandlerState:
    """librdkafka's consumer group handler, as its statistics give it (the `cgrp` object)."""

    state: str  # "up" once the coordinator is known and connected; "query-coord", "wait-coord", ... before
    state_age_ms: int  # since the last change of `state`


def group_handler_state(statistics_json: str) -> GroupHandlerState | None:
    """The group handler of one statistics document, or None when it has none (not a group consumer) or is not
    readable."""
    try:
        group = json.loads(statistics_json).get("cgrp")
        return GroupHandlerState(str(group["state"]), int(group["stateage"]))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class ConsumerWedged(RuntimeError):
    """The consumer stayed outside its group while Kafka served the group to another client."""


class Probe(Protocol):
    """Asks Kafka whether it answers for the group (`ask`), and tells the answer once it came back (`answer`)."""

    def ask(self) -> None: ...

    def answer(self) -> bool | None: ...


class GroupProbe:
    """Whether Kafka answers for a group, asked through an admin client of its own (never the consumer's) and
    without blocking: the loop that asks goes on serving its consumer and its reports while Kafka is away, where a
    request waits out its whole timeout."""

    def __init__(self, group_id: str, new_admin: Callable[[], AdminClient]) -> None:
        self._group_id = group_id
        self._new_admin = new_admin
        self._admin: AdminClient | None = None
        self._asked: Future | None = None

    def ask(self) -> None:
        """Send a request for the group, unless one is on its way."""
        if self._asked is not None:
            return
        if self._admin is None:
            self._admin = self._new_admin()
        self._asked = self._admin.describe_consumer_groups([self._group_id],
                                                           request_timeout=PROBE_TIMEOUT_S)[self._group_id]

    def answer(self) -> bool | None:
        """Whether Kafka answered the last request for the group, once it came back (then forgotten); None while
        it is on its way or none was sent."""
        if self._asked is None or not self._asked.done():
            return None
        asked, self._asked = self._asked, None
        try:
            asked.result()
        except KafkaException as error:
            log.info("Kafka did not answer for group %s: %s", self._group_id, error.args[0])
            self._admin = None  # a fresh client next time, with fresh metadata
            return False
        return True


class GroupWatch:
    """Follows a consumer's group handler through its statistics (`on_statistics` as the consumer's `stats_cb`,
    with `STATISTICS_INTERVAL_MS`) and, from the loop that polls the consumer, `check` raises `ConsumerWedged`
    once it stays outside its group while `probe` says Kafka answers for the group (see the module's
    description)."""

    def __init__(self, group_id: str, probe: Probe, clock: Callable[[], float] = time.monotonic) -> None:
        self._group_id = group_id
        self._probe = probe
        self._clock = clock
        self._outside_since: float | None = None  # None: inside its group, or not known yet
        self._state = "unknown"
        self._served_since: float | None = None  # the first answer for the group since the consumer left it
        self._next_probe = 0.0

    @classmethod
    def asking(cls, group_id: str, new_admin: Callable[[], AdminClient]) -> GroupWatch:
        """A watch that asks Kafka through admin clients made by `new_admin`."""
        return cls(group_id, GroupProbe(group_id, new_admin))

    def on_statistics(self, statistics_json: str) -> None:
        handler = group_handler_state(statistics_json)
        if handler is None:
            return
        self._state = handler.state
        if handler.state == _UP:
            self._outside_since = self._served_since = None
        elif self._outside_since is None:
            self._outside_since = self._clock() - handler.state_age_ms / 1000

    def outside_s(self) -> float:
        """Seconds the consumer has been outside its group by its latest statistics; 0 while inside."""
        return 0.0 if self._outside_since is None else self._clock() - self._outside_since

    def check(self) -> None:
        """Raise `ConsumerWedged` when the consumer has been outside its group for `SERVED_GRACE_S` since Kafka
        first answered for the group. Cheap while the consumer is in its group; while it has been outside for
        `PROBE_AFTER_S`, asks Kafka at most every `PROBE_INTERVAL_S` and never waits for the answer."""
        answer = self._probe.answer()
        if self.outside_s() < PROBE_AFTER_S:
            return  # an answer asked for before the consumer came back says nothing now
        now = self._clock()
        if answer is None:
            if now >= self._next_probe:
                self._next_probe = now + PROBE_INTERVAL_S
                self._probe.ask()
            return
        if not answer:
            self._served_since = None  # Kafka away: the consumer waits for it, as it should
            return
        if self._served_since is None:
            self._served_since = now
            log.warning("the consumer has been outside group %s for %.0f s (its handler: %s) while Kafka answers for "
                        "the group; it is given %.0f s to rejoin", self._group_id, self.outside_s(), self._state,
                        SERVED_GRACE_S)
        elif now - self._served_since >= SERVED_GRACE_S:
            raise ConsumerWedged(f"the consumer has been outside group {self._group_id} for {self.outside_s():.0f} s "
                                 f"(its handler: {self._state}) while Kafka answered for the group for "
                                 f"{now - self._served_since:.0f} s")


def end_wedged_process(wedged: ConsumerWedged, report_last: Callable[[], None]) -> None:
    """Give the stage's last report (`report_last`), then end this process at once with `WEDGED_CONSUMER_EXIT_CODE`,
    so that supervision starts it again with a fresh consumer. Not through the consumer's close nor the
    interpreter's exit: both wait for the wedged client's group handler, without end. What the process had not
    committed is read again by the fresh consumer."""
    report_last()
    end_process(WEDGED_CONSUMER_EXIT_CODE, f"{wedged}: ending the process (exit status {WEDGED_CONSUMER_EXIT_CODE}) "
                "so that supervision starts it with a fresh consumer; what it had not committed is read again")
