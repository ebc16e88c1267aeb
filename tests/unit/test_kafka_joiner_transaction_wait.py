"""The standalone joiner's heartbeat says it waits for Kafka while a transactional call goes unanswered, and no
longer once Kafka answered: an init_transactions slow under load (a fresh broker, two busy cores) left an idle
joiner named `stuck: waiting for Kafka` for good, since only a commit or an abort cleared it."""
from __future__ import annotations

import time

from kafka_joiner.progress import JoinerStats
from kafka_joiner.transaction import Transaction
from pipeline_core import transactional


class SlowToInitialise:
    """A producer whose init_transactions answers after `delay_s`."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def init_transactions(self, _timeout_s: float) -> None:
        time.sleep(self.delay_s)


def test_a_slow_init_transactions_that_answered_leaves_no_wait_behind(monkeypatch) -> None:
    monkeypatch.setattr(transactional, "SLOW_CALL_S", 0.05)
    seen_waiting = []
    transaction = Transaction(lambda: SlowToInitialise(0.6), None, JoinerStats(), interval_s=3600,
                              max_records=10**9, while_waiting=lambda: seen_waiting.append(transaction.waiting_for))
    transaction.initialise()
    assert "Kafka" in seen_waiting  # while it waited, the heartbeat said so
    assert transaction.waiting_for is None
