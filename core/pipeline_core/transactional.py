"""The transactional producer of the exactly-once stages (both joiners): how each transactional call is made, asked
again, and given up on, defined once.

Every call is bounded (`call_bounded`): librdkafka may wait for ever while Kafka nodes return, so a call that
outlives its timeout by `WEDGED_AFTER_S` raises `KafkaCallWedged`, and the producer must go. A call unanswered for
`SLOW_CALL_S` means Kafka is away: `waiting_for` says "Kafka" (the stage's heartbeat shows it waits, not stalls)
until Kafka answers. A retriable answer is asked again with growing pauses, as confluent-kafka documents
(examples/eos_transactions.py), until the caller gives up: the standalone joiner when it is stopping, the Spark
job's sink at its transaction's timeout. A producer that can do no more (fenced, fatal, wedged, or its abort
refused) is let go on a thread of its own (`drop_producer`), and a new one with the same transactional id fences it
and aborts its open transaction, so nothing of it ever commits.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaException, Producer

from .kafka_clients import TRANSACTIONAL_CALL_TIMEOUT_S, call_bounded, drop_producer, is_transient
from .retry import Backoff

log = logging.getLogger(__name__)

# What a bounded call may take beyond the timeout it passes to librdkafka before it counts as wedged.
WEDGED_AFTER_S = 5.0
# A call unanswered this long means Kafka is away: the heartbeat says the stage waits for it.
SLOW_CALL_S = 5.0
# The first pause between two attempts of a call Kafka answered with a retriable error at once (asking again at
# once spun the caller's thread).
FIRST_RETRY_PAUSE_S = 0.1


class TransactionalProducer:
    """A stage's transactional producer and the policy of its calls (see the module doc).

    :param new_producer: a transactional producer of the stage's transactional id (a replacement too).
    :param call_timeout_s: the timeout each call passes to librdkafka.
    :param max_retry_pause_s: the longest pause between two attempts: how late the stage notices Kafka back.
    :param while_waiting: called while a call waits and between attempts (the stage's progress report).
    """

    def __init__(self, new_producer: Callable[[], Producer], *, call_timeout_s: float = TRANSACTIONAL_CALL_TIMEOUT_S,
                 max_retry_pause_s: float = 0.5, while_waiting: Callable[[], object] | None = None) -> None:
        self._new_producer = new_producer
        self.call_timeout_s = call_timeout_s
        self._backoff = Backoff(FIRST_RETRY_PAUSE_S, max_retry_pause_s)
        self.while_waiting = while_waiting
        self.producer: Producer | None = new_producer()
        self.waiting_for: str | None = None  # "Kafka" while a call goes unanswered or keeps failing
        self.replaced = 0  # producers let go of and made anew

    def call(self, call: Callable[[Producer], None], what: str, timeout_s: float | None = None) -> None:
        """One bounded attempt of ``call(producer)``, made with ``timeout_s`` (default: the call timeout); raises
        what Kafka answered, or `KafkaCallWedged` past the bound."""
        timeout_s = self.call_timeout_s if timeout_s is None else timeout_s
        producer = self.producer
        started = time.monotonic()

        def waiting() -> None:
            if self.waiting_for is None and time.monotonic() - started > SLOW_CALL_S:
                log.warning("%s: no answer from Kafka for %.0f s", what, time.monotonic() - started)
                self.waiting_for = "Kafka"
            if self.while_waiting is not None:
                self.while_waiting()

        call_bounded(lambda: call(producer), timeout_s + WEDGED_AFTER_S, what=what, while_waiting=waiting)
        self.waiting_for = None  # Kafka answered: a slow start under load is no wait that lasts

    def until_done(self, call: Callable[[Producer], None], what: str, *, stopping: Callable[[], bool] = lambda: False,
                   deadline: float | None = None) -> None:
        """``call(producer)``, asked again while Kafka answers a retriable error (a resumed commit_transaction goes
        on where it stopped) and the caller goes on: until it is ``stopping()``, or past ``deadline``
        (time.monotonic()). Raises the last answer then, an answer that requires an abort or is fatal at once,
        and `KafkaCallWedged` past a call's bound."""
        pauses_s = self._backoff.pauses_s()
        while True:
            try:
                self.call(call, what)
                return
            except KafkaException as exception:
                error = exception.args[0]
                if not is_transient(error) or error.txn_requires_abort() or stopping() or \
                        (deadline is not None and time.monotonic() > deadline):
                    raise
                if self.waiting_for is None:
                    log.warning("%s: %s; asking again until Kafka answers", what, error)
                self.waiting_for = "Kafka"
                if self.while_waiting is not None:
                    self.while_waiting()
            pause_s = next(pauses_s)
            time.sleep(pause_s if deadline is None else min(pause_s, max(deadline - time.monotonic(), 0.0)))

    def let_go(self) -> None:
        """Let go of a producer that can do no more; `renew` makes the next one."""
        if self.producer is not None:
            drop_producer(self.producer)
            self.producer = None
            self.replaced += 1

    def renew(self, init: Callable[[], None] | None = None) -> None:
        """A new producer with the stage's transactional id in place of the one let go of (or of the current one,
        let go of first), and its `init_transactions` (``init``, if given: the caller's own way to wait for Kafka;
        else asked until done), which fences the old one and aborts its open transaction."""
        self.let_go()
        self.producer = self._new_producer()
        try:
            if init is not None:
                init()
            else:
                self.until_done(lambda producer: producer.init_transactions(self.call_timeout_s), "init_transactions")
        except BaseException:
            # A producer whose init did not complete may still have it in flight: the next renew makes another.
            self.let_go()
            raise
        self.waiting_for = None
