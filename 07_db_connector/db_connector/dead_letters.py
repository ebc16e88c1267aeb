"""The DB connector's dead letters delivered to machine.dlq before their batch's offsets are committed.

While Kafka is away the delivery waits (the connector goes on serving its consumer group meanwhile); a dead
letter Kafka refuses for its size goes again without its payload; after any other failure a fresh producer
sends the letters again. Nothing is given up: the batch stays uncommitted until every letter is delivered.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, Producer

from pipeline_core.kafka_clients import ACCESS_ERRORS, produce, producer_config, refused_for_itself, security_config
from pipeline_core.lifecycle import StopSignal
from pipeline_core.records import payload_omitted
from pipeline_core.retry import Backoff, Retries

from .batch import STAGE, WriteAborted
from .settings import DbConnectorSettings

log = logging.getLogger(__name__)

_KAFKA_FIRST_PAUSE_S = 0.5  # the first pause before a fresh producer; `--retry-max-s` caps the pauses
_FLUSH_WAIT_S = 0.5


class DeadLetterDelivery:
    """Delivers dead letters to `settings.dlq_topic`; `wait_polling(seconds)` waits serving the group."""

    def __init__(self, settings: DbConnectorSettings, stop: StopSignal,
                 wait_polling: Callable[[float], None]) -> None:
        self._settings = settings
        self._stop = stop
        self._wait_polling = wait_polling
        self._producer = self._new_producer()
        # Dead letters Kafka did not take in the last round of deliveries: (envelope, sent without its
        # payload already, error).
        self._refused: list[tuple[bytes, bool, KafkaError]] = []

    def _new_producer(self) -> Producer:
        # No delivery timeout: dead letters wait out a Kafka outage (their batch stays uncommitted).
        return Producer(producer_config(self._settings.kafka_bootstrap_servers, **security_config(self._settings),
                                        **{"message.timeout.ms": 0}))

    def deliver(self, dead_letters: list[bytes]) -> None:
        """Every one of `dead_letters` delivered; raises WriteAborted when stop is set while Kafka is away, and
        SystemExit when Kafka refuses the topic to this principal or even a letter without its payload."""
        settings = self._settings
        waiting = [(envelope, False) for envelope in dead_letters]
        # Bound: no deadline (the batch stays uncommitted meanwhile); a fresh producer after pauses up to
        # `--retry-max-s`.
        retries = Retries(Backoff(min(_KAFKA_FIRST_PAUSE_S, settings.retry_max_s), settings.retry_max_s))
        while waiting:
            self._refused = []
            for envelope, omitted in waiting:
                refused = produce(self._producer, settings.dlq_topic, envelope,
                                  on_delivery=functools.partial(self._on_delivery, omitted))
                if refused is not None:  # the client refused it at once: as if Kafka had on delivery
                    self._refused.append((envelope, omitted, refused))
            while self._producer.flush(_FLUSH_WAIT_S):
                if self._stop.is_set():
                    raise WriteAborted(f"stopped while dead letters waited for Kafka ({settings.dlq_topic})")
                self._wait_polling(_FLUSH_WAIT_S)
            waiting = []
            for envelope, omitted, error in self._refused:
                if error.code() in ACCESS_ERRORS:
                    raise SystemExit(f"Kafka refused access to {settings.dlq_topic} ({error.str()}): grant the "
                                     "DB connector's principal Write on it, then start it again")
                if refused_for_itself(error) and omitted:
                    raise SystemExit(f"Kafka refuses even a dead letter without payload on {settings.dlq_topic} "
                                     f"({error.str()}): raise that topic's max.message.bytes, then start again")
                if refused_for_itself(error):
                    waiting.append((payload_omitted(envelope, error.str(), STAGE), True))
                else:
                    waiting.append((envelope, omitted))
            if any(not refused_for_itself(error) for _, _, error in self._refused):
                retry_delay_s = retries.next_pause_s()
                log.error("dead letters not delivered (%s): sending them again with a fresh producer in %.1f s",
                          self._refused[0][2].str(), retry_delay_s)
                self._wait_polling(retry_delay_s)
                self._producer = self._new_producer()

    def close(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for what is still on its way."""
        self._producer.flush(timeout_s)

    def _on_delivery(self, omitted: bool, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._refused.append((message.value() or b"", omitted, error))
