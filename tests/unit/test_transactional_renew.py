"""A transactional producer whose init did not complete is no producer: the Spark sink's resume past its start-up
deadline kept one, and the next resume met its init still in flight (Kafka answered _CONFLICT on every call)."""
from __future__ import annotations

import pytest

from pipeline_core.transactional import TransactionalProducer


class Producer:
    """Stands for a client made by the factory; only its identity matters here."""


def test_a_producer_whose_init_raised_is_let_go_of_and_the_next_renew_makes_another(monkeypatch) -> None:
    dropped: list[Producer] = []
    monkeypatch.setattr("pipeline_core.transactional.drop_producer", dropped.append)
    made: list[Producer] = []

    def new_producer() -> Producer:
        made.append(Producer())
        return made[-1]

    kafka = TransactionalProducer(new_producer)

    def init_past_its_deadline() -> None:
        raise SystemExit("Kafka still answered after the start-up deadline")

    with pytest.raises(SystemExit):
        kafka.renew(init_past_its_deadline)
    assert kafka.producer is None, "a producer whose init raised was kept"
    assert dropped == made[:2], "the first producer and the one whose init raised are let go of"

    kafka.renew(lambda: None)
    assert kafka.producer is made[2] and len(made) == 3
