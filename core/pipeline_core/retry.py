"""The one retry policy of every retry and reconnect loop: capped exponential backoff with jitter.

Each loop keeps its own bound (first pause, longest pause, and whether it gives up at a deadline) and states
it where it uses a `Backoff`; this module only says how the pauses grow. Jitter draws each pause from the
upper half of its step, so stages restarted together (a Kafka or InfluxDB outage ends for all of them at
once) do not knock again in step, while no pause is ever longer than the loop's bound.
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

# Each pause is drawn from [(1 - JITTER) · step, step]: at most half of it is given up to spread the clients.
JITTER = 0.5


@dataclass(frozen=True)
class Backoff:
    """Pauses that start at `first_s` and double up to `max_s`, each shortened by a random part of up to
    `JITTER` of it."""

    first_s: float
    max_s: float

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise ValueError(f"a backoff needs 0 < first_s <= max_s, not {self.first_s} and {self.max_s}")

    def pauses_s(self, rng: random.Random | None = None) -> Iterator[float]:
        """The pauses of one series of retries, endless: start a new series when the call succeeded."""
        draw = (rng or random).random
        step_s = self.first_s
        while True:
            yield step_s * (1.0 - JITTER * draw())
            step_s = min(step_s * 2, self.max_s)


class Retries:
    """One series of retries of a loop that lives long (a connection, a write): `next_pause_s()` for the pause
    before the next attempt, `reset()` once an attempt succeeded (cheap when nothing was retried: it may run once
    per record)."""

    def __init__(self, backoff: Backoff, rng: random.Random | None = None) -> None:
        self.backoff = backoff
        self._rng = rng
        self._pauses = backoff.pauses_s(rng)
        self._retried = False

    def next_pause_s(self) -> float:
        self._retried = True
        return next(self._pauses)

    def reset(self) -> None:
        if self._retried:
            self._pauses = self.backoff.pauses_s(self._rng)
            self._retried = False
