"""`python -m benchmarks.capacity_passthrough`: the whole pipeline's ceiling stage, in place of the joiner.

The standalone joiner's consumer, transactional producer, transactions and loop (`benchmarks.passthrough`, built
from the joiner's own parts) with no join: each speed record (`actSpeed_C1<axis>`, told by its key) becomes one
record shaped as a join result of the axis, so the DB connector downstream meets as many join results as the join
of the soak's plant gives and writes them as points; every other record is consumed and left. Its heartbeat
(--progress-file) carries its lag, as a stage's does.
"""
from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Iterable

import orjson
from confluent_kafka import Message, TopicPartition

from pipeline_core.logs import configure_logging
from pipeline_core.progress import Observation, ProgressReporter, StageCounters
from pipeline_core.settings import load_settings

from benchmarks.passthrough import PassThrough
from kafka_joiner.settings import KafkaJoinerSettings

log = logging.getLogger("benchmarks.capacity_passthrough")

SPEED = b".actSpeed_C1"


class JoinShapedPassThrough(PassThrough):
    """Consumes every record; writes, for each speed record, one join-shaped record of its axis."""

    def _outputs(self, message: Message) -> Iterable[tuple[bytes | None, bytes | None]]:
        key = message.key() or b""
        at = key.rfind(SPEED)
        if at < 0 or not key[at + len(SPEED):].isdigit():
            return ()
        record = orjson.loads(message.value())
        axis = key[at + len(SPEED):].decode()
        side = {"quantity": record["quantity"], "phenomenonTime": record["phenomenonTime"], "result": record["result"]}
        output = {"thing": record["thing"], "quantity": f"vaPower_C1{axis}", "phenomenonTime": record["phenomenonTime"],
                  "result": record["result"], "left": side, "right": {**side, "quantity": f"vaTorque_C1{axis}"},
                  "case": "same_time"}
        return ((orjson.dumps(output), key),)


def main(argv: list[str] | None = None) -> int:
    configure_logging()
    settings = load_settings(KafkaJoinerSettings, argv, prog="python -m benchmarks.capacity_passthrough")
    stage = JoinShapedPassThrough(settings)
    counters = StageCounters()

    def observe() -> Observation:
        counters.records_in, counters.records_out = stage.stats.records_in, stage.stats.records_out
        lag = 0
        consumer = stage._consumer
        for partition in consumer.assignment():
            low, high = consumer.get_watermark_offsets(partition, cached=True)
            [position] = consumer.position([TopicPartition(partition.topic, partition.partition)])
            if high >= 0 and position.offset >= 0:
                lag += max(0, high - position.offset)
        return Observation(lag=lag)

    reporter = ProgressReporter("pass_through", counters, interval_s=settings.progress_interval_s, observe=observe,
                                heartbeat_file=settings.progress_file, logger=log)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))
    stage.start()
    log.info("READY: the pass-through runs in place of the joiner")

    def until(_stage: PassThrough) -> bool:
        reporter.maybe_report()
        return bool(stopping)

    stage.run(until)
    reporter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
