"""The one retry policy: capped exponential backoff with jitter (`pipeline_core.retry`)."""
from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline_core.retry import JITTER, Backoff, Retries


@given(first_s=st.floats(0.001, 10), factor=st.floats(1, 100), seed=st.integers(0, 2**32))
def test_each_pause_is_within_its_step_and_the_steps_double_up_to_the_bound(first_s: float, factor: float,
                                                                           seed: int) -> None:
    backoff = Backoff(first_s, first_s * factor)
    steps = [first_s]
    while len(steps) < 40:
        steps.append(min(steps[-1] * 2, backoff.max_s))
    pauses = list(itertools.islice(backoff.pauses_s(random.Random(seed)), 40))
    for pause, step in zip(pauses, steps):
        assert (1 - JITTER) * step <= pause <= step
    assert max(pauses) <= backoff.max_s


def test_clients_started_together_do_not_retry_in_step() -> None:
    backoff = Backoff(0.5, 30)
    one, other = (list(itertools.islice(backoff.pauses_s(random.Random(seed)), 5)) for seed in (1, 2))
    assert one != other


def test_a_reset_starts_again_from_the_first_pause() -> None:
    retries = Retries(Backoff(1, 64), random.Random(3))
    for _ in range(6):
        retries.next_pause_s()
    assert retries.next_pause_s() >= 32 * (1 - JITTER)
    retries.reset()
    assert retries.next_pause_s() <= 1


@pytest.mark.parametrize(("first_s", "max_s"), [(0, 1), (2, 1), (-1, 1)])
def test_a_backoff_without_a_sensible_bound_is_refused(first_s: float, max_s: float) -> None:
    with pytest.raises(ValueError):
        Backoff(first_s, max_s)
