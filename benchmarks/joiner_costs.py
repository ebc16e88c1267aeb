"""Where the standalone joiner's time goes, per input record: its hot path taken apart into phases, each
run over a whole pre-loaded input by the joiner's own code and clients, with the CPU of each phase
(``time.process_time``: this process, client threads included).

The phases, in the order the joiner runs them per record: consume (its consumer, read_committed, the
consume batch it uses), route (``InputFrames``: the key's partition, the framed record), decode and
validate (``decode_record``, key and partition checks), engine (``KeyedJoiner.ingest`` and the changelog's
bookkeeping of held records; split into the join and its output records, the dicts with their UUID5 ids,
which are built again alone to time them), encode (the output's JSON and key), produce (each output into
the open transaction), changelog (the state changes of each transaction to the state topic), transaction
(offsets sent along and the commit, with the CPU the client's threads spend meanwhile delivering the
transaction's records).
Transactions span as many records as the joiner's did in the same run.
"""
from __future__ import annotations

import gc
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from pipeline_core.kafka_clients import admin_client, produce
from pipeline_core.partitioning import thing_partition
from pipeline_core.records import InvalidRecord, decode_record, encode_record, record_key
from pipeline_core.topics import TopicSpec, ensure_topics, partition_count

from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.cases import CASE_LABELS
from local_stream_buffer.output import OutputBuilder, is_finite_result, output_builder
from local_stream_buffer.specs import SpecResolver, load_join_specs
from local_stream_buffer.status import IngestStatus
from kafka_joiner.changelog import STATE_TOPIC_CONFIG, record_position
from kafka_joiner.clients import joiner_consumer, joiner_producer
from kafka_joiner.partition_join import PartitionJoin
from kafka_joiner.progress import JoinerStats
from kafka_joiner.repartition import InputFrames, ThingRouter
from kafka_joiner.service import CONSUME_BATCH
from kafka_joiner.settings import KafkaJoinerSettings
from kafka_joiner.transaction import KAFKA_TIMEOUT_S

ENGINE, OUTPUT_RECORDS = "engine: the join", "engine: output records"
PHASES = ("consume", "route", "decode and validate", ENGINE, OUTPUT_RECORDS, "encode", "produce", "changelog",
          "transaction")


def phase_costs(settings: KafkaJoinerSettings, records: int, records_per_transaction: int) -> dict[str, float]:
    """CPU seconds of each phase (`PHASES`) over the `records` pre-loaded in ``settings.input_topic``, its
    outputs and state changes produced in transactions of `records_per_transaction` input records to
    ``settings.output_topic`` and ``settings.state_topic_name()`` (created here).

    The cyclic garbage collector is off meanwhile: each phase keeps its results for the next, hundreds of
    thousands of objects that the joiner, handling records one by one, never holds, and which each of the
    collector's passes would walk (records form no cycles; the joiner's own collector costs little, see
    ``pipeline_core.runtime.tune_gc_for_streaming``)."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return _phase_costs(settings, records, records_per_transaction)
    finally:
        if enabled:
            gc.enable()


def _phase_costs(settings: KafkaJoinerSettings, records: int, records_per_transaction: int) -> dict[str, float]:
    cpu: dict[str, float] = dict.fromkeys(PHASES, 0.0)
    clock = time.process_time
    bootstrap = settings.kafka_bootstrap_servers
    admin = admin_client(bootstrap)
    partitions = partition_count(admin, settings.input_topic)
    state_topic = settings.state_topic_name()
    ensure_topics(admin, (TopicSpec(state_topic, partitions, STATE_TOPIC_CONFIG),))

    consumer = joiner_consumer(settings, lambda _statistics: None)
    consumer.assign([TopicPartition(settings.input_topic, partition, OFFSET_BEGINNING)
                     for partition in range(partitions)])
    messages = []
    began = clock()
    while len(messages) < records:
        messages.extend(message for message in consumer.consume(CONSUME_BATCH, 1.0) if message.error() is None)
    cpu["consume"] = clock() - began

    resolver = SpecResolver(load_join_specs(settings.join_specs))
    frame_of = InputFrames(ThingRouter(resolver, partitions), JoinerStats()).frame
    began = clock()
    framed = [(message.partition(), message.offset(), frame_of(message)) for message in messages]
    cpu["route"] = clock() - began

    began = clock()
    decoded = []
    for partition, offset, frame in framed:
        for slot, record in enumerate(frame):
            try:
                fields = decode_record(record.value)
                thing = fields["thing"]
                if record.key != record_key(thing, fields["quantity"]).encode():
                    raise InvalidRecord("key does not match")
                if thing_partition(thing, partitions) != partition:
                    raise InvalidRecord("misrouted")
            except InvalidRecord:
                continue
            decoded.append((partition, record_position(offset, slot), fields, record.value))
    cpu["decode and validate"] = clock() - began

    # The engine, transaction by transaction: what each one's changelog carries is what its records changed.
    joins = {partition: PartitionJoin(settings.input_topic, partition, lambda *hooks: KeyedJoiner(
        resolver, max_pending_per_side=settings.max_pending_per_side, on_release=hooks[0], on_evict=hooks[1],
        on_dead_letter=hooks[2]), None, None)
        for partition in range(partitions)}
    per_transaction = max(1, records_per_transaction)
    transactions: list[tuple[list, list]] = []  # per transaction: its outputs, its state changes
    outputs: list = []
    accepted = IngestStatus.ACCEPTED
    began = clock()
    for index, (partition, position, fields, value) in enumerate(decoded, 1):
        join = joins[partition]
        status, completed, _reason = join.joiner.ingest(fields, position)
        if status is accepted:
            join.changes.puts[position] = value
        outputs.extend(completed)
        if index % per_transaction == 0 or index == len(decoded):
            changes: list = []
            for each in joins.values():
                each.changes.flush(lambda key, state, partition=each.partition: changes.append((partition, key, state)))
            transactions.append((outputs, changes))
            outputs = []
    cpu[ENGINE] = clock() - began
    # Of the engine's time, its output records (the dict and its UUID5 id): each built again from its pair
    # alone, by the builder the engine uses, and taken out of the engine's figure.
    builders: dict[tuple[str, str], OutputBuilder] = {}
    cases = {label: code for code, label in enumerate(CASE_LABELS)}
    pairs = []
    for outputs, _ in transactions:
        for output in outputs:
            thing, quantity = output["thing"], output["quantity"]
            build = builders.get((thing, quantity))
            if build is None:
                build = builders[thing, quantity] = output_builder(thing, resolver.binding_for_output(quantity))
            left, right = output["left"], output["right"]
            pairs.append((build, cases[output["case"]], left["phenomenonTime"], left["result"],
                          right["phenomenonTime"], right["result"]))
    began = clock()
    for build, case, left_time, left_value, right_time, right_value in pairs:
        build(case, left_time, left_value, right_time, right_value)
    cpu[OUTPUT_RECORDS] = clock() - began
    cpu[ENGINE] = max(cpu[ENGINE] - cpu[OUTPUT_RECORDS], 0.0)

    began = clock()
    encoded = [[(encode_record(output), record_key(output["thing"], output["quantity"]))
                for output in outputs if is_finite_result(output)] for outputs, _ in transactions]
    cpu["encode"] = clock() - began

    producer = joiner_producer(settings, f"{settings.transactional_id_prefix}.costs.{uuid.uuid4().hex[:8]}")
    producer.init_transactions(KAFKA_TIMEOUT_S)
    output_topic = settings.output_topic
    offsets = [TopicPartition(settings.input_topic, partition, 0) for partition in range(partitions)]
    last_offset = {}
    consumed = 0
    per_message = max(1, len(messages) // max(1, len(transactions)))
    for number, (payloads, (_, changes)) in enumerate(zip(encoded, transactions)):
        producer.begin_transaction()
        began = clock()
        produce_one = producer.produce
        for payload, key in payloads:
            try:
                produce_one(output_topic, payload, key)
            except BufferError:
                produce(producer, output_topic, payload, key)
        cpu["produce"] += clock() - began
        began = clock()
        for partition, key, state in changes:
            produce(producer, state_topic, state, key, partition=partition)
        cpu["changelog"] += clock() - began
        # The input positions this transaction reaches, as the joiner commits them.
        for message in messages[consumed:consumed + per_message if number < len(transactions) - 1 else None]:
            last_offset[message.partition()] = message.offset() + 1
        consumed += per_message
        began = clock()
        producer.send_offsets_to_transaction(
            [TopicPartition(settings.input_topic, partition, offset) for partition, offset in last_offset.items()]
            or offsets, consumer.consumer_group_metadata(), KAFKA_TIMEOUT_S)
        producer.commit_transaction(KAFKA_TIMEOUT_S)
        cpu["transaction"] += clock() - began
    consumer.close()
    producer.flush(KAFKA_TIMEOUT_S)
    return cpu
