"""The standalone exactly-once Kafka joiner: machine.data -> keyed join -> machine.out (and machine.dlq).

The Kafka adapter at the edge of the pure join engine. Run it with ``python -m kafka_joiner``
(``--help`` lists the settings); benchmark it with ``python -m benchmarks.kafka_joiner``.
"""
from .service import KafkaJoiner
from .settings import KafkaJoinerSettings

__all__ = ["KafkaJoiner", "KafkaJoinerSettings"]
