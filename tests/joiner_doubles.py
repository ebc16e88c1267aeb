"""Both joiners' per-batch steps driven without Kafka or Spark, on records as the Kafka client hands them over:
the standalone joiner's `FrameJoiner` (with its producer replaced by a list) and the Spark joiner's router and
bucket join (as `mapInArrow` and `transformWithStateInPandas` run them)."""
from __future__ import annotations

import pyarrow as pa

from kafka_joiner.partition_join import FrameJoiner, PartitionJoin
from kafka_joiner.progress import JoinerStats
from kafka_joiner.repartition import Forwarder, InputFrames, ThingRouter, repartitioned_frame
from kafka_joiner.transaction import Transaction
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.keyed_batch import StateDict
from local_stream_buffer.specs import SpecResolver, load_join_specs
from spark_joiner.parse import RecordRouter, unpack
from spark_joiner.bucket_join import DLQ, join_bucket, unpack_emitted

INPUT_TOPIC, OUTPUT_TOPIC, DLQ_TOPIC, STATE_TOPIC = "machine.data", "machine.out", "machine.dlq", "joiner.state"
RESOLVER = SpecResolver(load_join_specs(None))
PARTITIONS = 5
MAX_PENDING_PER_SIDE = 100


class KafkaRecord:
    """A consumed record as confluent-kafka hands it over (its Message cannot be made outside the client)."""

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: list | None = None, timestamp_ms: int = 1_700_000_000_000) -> None:
        self._fields = (topic, partition, offset, key, value, headers, timestamp_ms)

    def topic(self): return self._fields[0]
    def partition(self): return self._fields[1]
    def offset(self): return self._fields[2]
    def key(self): return self._fields[3]
    def value(self): return self._fields[4]
    def headers(self): return self._fields[5]
    def timestamp(self): return 1, self._fields[6]
    def error(self): return None


class ProducedRecords:
    """Stands in for the joiner's transactional producer: what it was handed, per topic."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | str | None]] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | str | None = None, **_options) -> None:
        self.records.append((topic, value, key))

    def poll(self, _timeout: float) -> int:
        return 0

    def on(self, topic: str) -> list[bytes | None]:
        return [value for produced_topic, value, _key in self.records if produced_topic == topic]


def frame_joiner(producer: ProducedRecords, frame_of) -> tuple[FrameJoiner, dict[int, PartitionJoin], JoinerStats]:
    stats = JoinerStats()
    transaction = Transaction(lambda: producer, None, stats, interval_s=3600, max_records=10**9)
    joins = {partition: PartitionJoin(INPUT_TOPIC, partition,
                                      lambda on_release, on_evict, on_dead_letter: KeyedJoiner(
                                          RESOLVER, max_pending_per_side=MAX_PENDING_PER_SIDE, on_release=on_release,
                                          on_evict=on_evict, on_dead_letter=on_dead_letter), None, None)
             for partition in range(PARTITIONS)}
    return (FrameJoiner(transaction, stats, INPUT_TOPIC, OUTPUT_TOPIC, DLQ_TOPIC, frame_of, PARTITIONS),
            joins, stats)


def consumed(records: list) -> list[KafkaRecord]:
    """(key, value, headers, partition) of each record, in the order read -> the records, offsets counting up."""
    return [KafkaRecord(INPUT_TOPIC, partition, offset, key, value, headers)
            for offset, (key, value, headers, partition) in enumerate(records)]


def routed(key: bytes | None) -> bool:
    """Whether the joiners read a record under `key` (the admission rule's step 1)."""
    return ThingRouter(RESOLVER, PARTITIONS).partition(key) is not None


def standalone_joiner_where_it_lies(messages: list[KafkaRecord]) -> ProducedRecords:
    """What the standalone joiner writes joining input partitioned by thing where it lies."""
    producer = ProducedRecords()
    joiner, joins, _ = frame_joiner(producer, InputFrames(ThingRouter(RESOLVER, PARTITIONS), JoinerStats()).frame)
    handled = 0
    while handled < len(messages):
        handled += joiner.join(messages[handled:], joins)
    return producer


def standalone_joiner_repartitioned(messages: list[KafkaRecord]) -> ProducedRecords:
    """What the standalone joiner writes forwarding its input to the repartition topic first, then joining the
    frames read back."""
    forwarder = Forwarder(INPUT_TOPIC, ThingRouter(RESOLVER, PARTITIONS), JoinerStats())
    assert forwarder.forward(messages) == []
    frames: list[KafkaRecord] = []
    forwarder.flush(lambda partition, frame: frames.append(
        KafkaRecord("by-thing", partition, len(frames), None, frame)))
    producer = ProducedRecords()
    joiner, joins, _ = frame_joiner(producer, repartitioned_frame)
    handled = 0
    while handled < len(frames):
        handled += joiner.join(frames[handled:], joins)
    return producer


def spark_joiner_records(messages: list[KafkaRecord], buckets: int = 3) -> tuple[list[bytes], list[bytes]]:
    """What the Spark joiner writes for one micro-batch of `messages`: (machine.out's values, machine.dlq's)."""
    batch = pa.RecordBatch.from_arrays([
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([m.partition() for m in messages], pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64())], names=["key", "value", "partition", "offset"])
    outputs: list[bytes] = []
    letters: list[bytes] = []
    for packed in RecordRouter(None, buckets)(iter([batch])):
        for blob in packed.column("rows").to_pylist():
            emitted = join_bucket(RESOLVER, unpack([blob]), StateDict(), INPUT_TOPIC, MAX_PENDING_PER_SIDE)
            if emitted:
                rows = unpack_emitted(emitted.frame()["records"])
                for kind, value in zip(rows.column("kind").to_pylist(), rows.column("value").to_pylist()):
                    (letters if kind == DLQ else outputs).append(value)
    return outputs, letters


def spark_joiner_letters(messages: list[KafkaRecord], buckets: int = 3) -> list[bytes]:
    """The Spark joiner's dead letters of one micro-batch of `messages`."""
    return spark_joiner_records(messages, buckets)[1]
