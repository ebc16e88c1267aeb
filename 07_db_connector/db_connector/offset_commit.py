"""A written batch's offsets committed while the connector goes on serving its consumer group.

While Kafka restarts, its group coordinator answers with a transient error for a while (loading the group's
offsets): the commit is asked again. Once partitions were revoked (while the sink or Kafka was away) they are
re-read from the last commit by their next owner, re-writing the same points, so the batch's offsets must not
be committed: `assignment_changed` ends the attempt.
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pipeline_core.kafka_clients import is_transient
from pipeline_core.lifecycle import StopSignal
from pipeline_core.retry import Backoff, Retries

log = logging.getLogger(__name__)

# Largest number of messages taken from the consumer per call.
CONSUME_CHUNK = 10_000
# The commit's answer when the group rebalanced meanwhile: the partitions go (or went) to their next owner.
_GROUP_CHANGED = frozenset((KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION,
                            KafkaError.UNKNOWN_MEMBER_ID, KafkaError._ASSIGNMENT_LOST))
# The first pause of a wait for the coordinator; `--retry-max-s` caps the pauses.
_KAFKA_FIRST_PAUSE_S = 0.5
# A commit's answer comes in milliseconds when the coordinator is up; one slower is waited for with fetching
# paused. Each wait for it polls at most this long.
_COMMIT_ANSWER_DUE_S = 1.0
_COMMIT_POLL_S = 0.05
_UNANSWERED = object()


class OffsetCommit:
    """Commits offsets through `consumer`, whose `on_commit` callback must hand its answers to :meth:`on_commit`.
    Messages the consumer hands out meanwhile go to `hold_back`; `wait_polling(seconds, until)` waits serving
    the group with fetching paused."""

    def __init__(self, consumer: Consumer, retry_max_s: float, stop: StopSignal,
                 hold_back: Callable[[list[Message]], None],
                 wait_polling: Callable[[float, Callable[[], bool] | None], None]) -> None:
        self._consumer = consumer
        # Set on a revocation while a batch is written or committed: its offsets are not committed.
        self.assignment_changed = False
        self._retry_max_s = retry_max_s
        self._stop = stop
        self._hold_back = hold_back
        self._wait_polling = wait_polling
        # The answer to the last commit asked for (`_commit_serving_group`): None when committed.
        self._answer: KafkaError | None | object = _UNANSWERED
        self._asked: set[tuple[str, int, int]] = set()

    def commit(self, offsets: list[TopicPartition]) -> None:
        """Commit a written batch's offsets (see the module doc); returns when committed, when the group changed,
        or when stop is set while the coordinator errs."""
        # Bound: no deadline (the batch stays uncommitted, the group served); pauses up to `--retry-max-s`.
        retries = Retries(Backoff(min(_KAFKA_FIRST_PAUSE_S, self._retry_max_s), self._retry_max_s))
        try:
            while not self.assignment_changed:
                error = self._commit_serving_group(offsets)
                if error is None:
                    return
                if error.code() in _GROUP_CHANGED or self.assignment_changed:
                    break
                if not is_transient(error):
                    raise KafkaException(error)
                if self._stop.is_set():
                    log.warning("stopping with a batch uncommitted (%s): it is read again on the next start",
                                error.str())
                    return
                delay_s = retries.next_pause_s()
                log.warning("committing offsets failed (%s); retrying in %.1f s", error.str(), delay_s)
                self._wait_polling(delay_s, None)
            log.info("the group changed while the batch was written: its records are read again, not committed")
        finally:
            self.assignment_changed = False

    def _commit_serving_group(self, offsets: list[TopicPartition]) -> KafkaError | None:
        """Commit `offsets` and wait for the coordinator's answer (None: committed) while polling, so that this
        member goes on serving its group and reporting its progress; a revocation meanwhile ends the wait (the
        batch is read again whatever the answer). A synchronous commit serves neither: with the coordinator's
        host cut off it blocked for 49 s, and a rebalance meanwhile waited for this member while the other one
        held no partitions."""
        self._asked = {(p.topic, p.partition, p.offset) for p in offsets}
        self._answer = _UNANSWERED
        try:
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as refused:
            return refused.args[0]

        def answered() -> bool:
            return self._answer is not _UNANSWERED or self.assignment_changed

        # Pausing drops what the consumer fetched ahead: only an answer slower than usual is waited for paused.
        answer_due = time.monotonic() + _COMMIT_ANSWER_DUE_S
        while not answered() and time.monotonic() < answer_due:
            self._hold_back(self._consumer.consume(CONSUME_CHUNK, _COMMIT_POLL_S))
        if not answered():
            log.warning("committing offsets: no answer from the group coordinator in %.1f s; waiting for it with "
                        "fetching paused", _COMMIT_ANSWER_DUE_S)
            self._wait_polling(math.inf, answered)
        if self._answer is _UNANSWERED:  # revoked, or stopping: the answer no longer matters
            return KafkaError(KafkaError._TIMED_OUT, "the commit was not answered before the group changed or "
                                                     "the connector stopped")
        return self._answer

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        # The answer of a commit no longer waited for (revoked meanwhile) names other offsets: it is not this one's.
        if {(p.topic, p.partition, p.offset) for p in partitions} == self._asked:
            self._answer = error or next((p.error for p in partitions if p.error is not None), None)
