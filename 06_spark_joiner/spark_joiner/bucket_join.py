"""The work of the job's stateful processor (``processor.BucketJoinProcessor``): one bucket's rows joined into
its state by the engine's keyed batch join, its idle releases, its key bound, and the records it emits.

Imported by the processor with its first rows, never when Spark only asks for the state schemas (see
``processor``). Input before the sink's committed position is joined first, in a call of its own whose outputs
are dropped, to rebuild the state (``processor``'s module doc says why the outputs kept are exactly the rest).
"""
from __future__ import annotations

import functools
import json
import logging
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from local_stream_buffer.clock import ClockCounters
from local_stream_buffer.clocked_batch import due_sides, held_records, is_clocked, next_due_ms, release_idle_side
from local_stream_buffer.eviction import eviction_reason, evicted_payload, evicted_records, keys_to_evict
from local_stream_buffer.keyed_batch import JoinKey, KeyedPairs, KeyedRows, KeyStates, StateKey, join_keyed_batch
from local_stream_buffer.reorder import is_reordered
from local_stream_buffer.spec_changes import fingerprint
from local_stream_buffer.specs import SpecBinding, SpecResolver
from pipeline_core.records import dead_letter, record_key

from .encode import STAGE, EncodedOutputs, encode_outputs
from .parse import unpack, worker_resolver
from .state_layout import STATE_CHUNKS_PER_BUCKET

log = logging.getLogger(__name__)

# The topic of an emitted record: a small int column, which Arrow builds from numpy without a Python
# object per record.
OUT = 0  # machine.out
DLQ = 1  # machine.dlq
# Not a record: what the clock rule did per machine in the batch (JSON: thing -> [outliers, steps back, jumps
# ahead]), for the driver's counters (local_stream_buffer.clock).
CLOCK = 2

# The records of ``processor.OUTPUT_SCHEMA``'s one column, as an Arrow IPC record batch.
EMITTED_ARROW_SCHEMA = pa.schema([
    pa.field("kind", pa.int8(), nullable=False),  # OUT or DLQ
    pa.field("key", pa.string()),
    pa.field("value", pa.binary(), nullable=False),
])
# A state chunk's keys (``processor.CHUNK_SCHEMA`` holds its IPC bytes).
CHUNK_ARROW_SCHEMA = pa.schema([
    pa.field("thing", pa.string(), nullable=False),
    pa.field("spec", pa.string(), nullable=False),
    pa.field("axis", pa.string(), nullable=False),
    pa.field("state", pa.binary(), nullable=False),
    pa.field("used_ms", pa.int64(), nullable=False),
])


class BucketJoin:
    """One bucket's join: the processor's settings (``processor.BucketJoinProcessor``), its handle and state
    variables, and the join specs it reads from ``join_specs``."""

    def __init__(self, handle: Any, chunks: Any, key_count: Any, join_specs: Path | None, input_topic: str,
                 max_pending_per_side: int, committed: Mapping[int, int], max_join_keys: int | None,
                 spec_starts: Mapping[int, Mapping[str, int]] | None = None) -> None:
        self.handle = handle
        self.chunks = chunks
        self.key_count = key_count
        self.input_topic = input_topic
        self.max_pending_per_side = max_pending_per_side
        self.committed = committed
        self.max_join_keys = max_join_keys
        self.resolver: SpecResolver = worker_resolver(join_specs)
        self.spec_starts = spec_starts or {}
        idle = [spec.idle_release_s for spec in self.resolver.specs if spec.idle_release_s is not None]
        self.first_release_ms = round(min(idle) * 1000) if idle else None  # a new timer: the soonest release
        self._bindings: dict[tuple[str, str], SpecBinding | None] = {}

    def input_rows(self, rows: Iterator[pd.DataFrame], now_ms: int) -> Iterator[pd.DataFrame]:
        """Join a micro-batch's rows of the bucket (``now_ms``: its processing time); its one output row, if any."""
        data = started_rows(self.resolver, unpack(blob for frame in rows for blob in frame["rows"]), self.spec_starts)
        states = ChunkedStates(self.chunks)  # reads nothing until the join asks
        committed = committed_rows(data, self.committed)
        if committed is not None:
            # Their outputs are in Kafka: joined only to rebuild the state, before the rows that follow them.
            join_bucket(self.resolver, data.filter(committed), states, self.input_topic, self.max_pending_per_side,
                        arrived_ms=now_ms)
            data = data.filter(np.logical_not(committed))
        emitted = join_bucket(self.resolver, data, states, self.input_topic, self.max_pending_per_side,
                              arrived_ms=now_ms)
        self.store_states(states, emitted)
        if self.first_release_ms is not None and next(iter(self.handle.listTimers()), None) is None:
            # Rows arrived: their streams may go quiet. One timer per bucket; it sets the next when it fires.
            self.handle.registerTimer(now_ms + self.first_release_ms)
        if emitted:
            yield emitted.frame()

    def expired_timer(self, now_ms: int) -> Iterator[pd.DataFrame]:
        """Release the bucket's quiet streams (``processor``'s module doc) and set the timer for the next one due."""
        chunks = decode_chunks({int(chunk[0]): blob[0] for chunk, blob in self.chunks.iterator()})
        emitted = Emitted()
        changed: dict[int, Entries] = {}
        next_due: int | None = None
        for chunk, entries in chunks.items():
            for stored, (state, used) in entries.items():
                binding = self._binding(stored)
                if binding is None or not (is_reordered(state) or is_clocked(state)):
                    continue
                released = False
                for side in due_sides(state, now_ms, binding.idle_release_ms):
                    release = release_idle_side(state, side, binding.delta_time_ms, self.max_pending_per_side)
                    if release is None:
                        continue
                    state, pairs = release
                    released = True
                    if pairs.count:
                        joined = KeyedPairs(np.zeros(pairs.count, dtype=np.int64), pairs, np.empty(0, np.int64), [])
                        emitted.outputs(encode_outputs([(stored[0], binding)], joined, self.input_topic))
                if released:
                    entries[stored] = (state, used)
                    changed[chunk] = entries
                due = next_due_ms(state, binding.idle_release_ms)
                if due is not None:
                    next_due = due if next_due is None else min(next_due, due)
        for chunk, blob in encode_chunks(changed).items():
            self.chunks.updateValue((chunk,), (blob,))
        if next_due is not None:
            self.handle.registerTimer(max(next_due, now_ms + 1))
        if emitted:
            yield emitted.frame()

    def _binding(self, stored: StateKey) -> SpecBinding | None:
        """The binding of a stored key whose spec releases idle streams (None: its spec does not, or is gone)."""
        _, spec_name, axis = stored
        found = self._bindings.get((spec_name, axis), False)
        if found is False:
            spec = next((spec for spec in self.resolver.specs if spec.name == spec_name), None)
            found = spec.bind(axis) if spec is not None and spec.idle_release_s is not None else None
            self._bindings[(spec_name, axis)] = found
        return found

    def store_states(self, states: ChunkedStates, emitted: Emitted) -> None:
        """Write the keys the batch joined; evict the least recently used beyond the bound (their held records
        become dead letters in ``emitted``)."""
        states.store(int(time.time() * 1000))
        if not states.created:
            return
        counted = self.key_count.get()
        count = (counted[0] if counted is not None else 0) + states.created
        if self.max_join_keys is not None and count > self.max_join_keys:
            chunks = decode_chunks({int(chunk[0]): blob[0] for chunk, blob in self.chunks.iterator()})
            held = {stored: (chunk, used) for chunk, entries in chunks.items()
                    for stored, (_, used) in entries.items()}
            evicted = keys_to_evict(((stored, used) for stored, (_, used) in held.items()), len(held),
                                    self.max_join_keys)
            changed: dict[int, Entries] = {}
            for stored in evicted:
                chunk = held.pop(stored)[0]
                entries = changed[chunk] = chunks[chunk]
                letters = evicted_dead_letters(self.resolver, stored, entries.pop(stored)[0], self.input_topic,
                                               self.max_join_keys)
                emitted.dead_letters.extend(letters)
            kept = encode_chunks(changed)
            for chunk in changed:
                if chunk in kept:
                    self.chunks.updateValue((chunk,), (kept[chunk],))
                else:
                    self.chunks.removeKey((chunk,))
            count = len(held)
        self.key_count.update((count,))


class ChunkedStates:
    """A bucket's key states (:class:`KeyStates`) in its map state, a chunk of keys per entry: the chunks a
    join call needs are read with one state call each; :meth:`store` writes back the chunks whose keys it
    changed.

    Column by column: a chunk stays the Arrow record batch it is stored as, keys are looked up by their
    names (:func:`key_names`) with one Arrow call over all of them, and a written chunk is its batch with
    the written states put in place and new keys appended. With 100,000 machines nearly every key is read
    and written in every micro-batch; a Python object per stored key and field was most of the cost."""

    def __init__(self, chunks: Any) -> None:
        self._chunks = chunks
        self._read: set[int] = set()  # chunks read (holding keys or not)
        self._batches: dict[int, pa.RecordBatch] = {}  # the chunks read that hold keys
        self._written: dict[StateKey, bytes] = {}
        self.created = 0  # keys stored that the map state did not hold (counted by store)

    def read_many(self, keys: Sequence[StateKey]) -> list[bytes | None]:
        self._load({chunk_of(stored) for stored in keys})
        batches = list(self._batches.values())
        if batches:
            stored = pa.Table.from_batches(batches, schema=CHUNK_ARROW_SCHEMA).combine_chunks()
            found = pc.index_in(key_names(keys), value_set=stored_names(stored))
            states = stored.column("state").take(found).to_pylist()
        else:
            states = [None] * len(keys)
        if self._written:  # a second join call of the micro-batch sees the first's states
            written = self._written
            states = [written.get(stored, state) for stored, state in zip(keys, states)]
        return states

    def write_many(self, states: Mapping[StateKey, bytes]) -> None:
        """Keep the states of keys :meth:`read_many` read."""
        self._written.update(states)

    def store(self, used_ms: int) -> None:
        """Write the chunks of the keys written, each of those keys marked used at ``used_ms``."""
        if not self._written:
            return
        keys = list(self._written)
        names = key_names(keys)
        written_states = pa.array(list(self._written.values()), pa.binary())
        chunk_of_key = np.fromiter(map(chunk_of, keys), dtype=np.int64, count=len(keys))
        changed = np.unique(chunk_of_key).tolist()
        held = [self._batches[chunk] for chunk in changed if chunk in self._batches]
        columns: list[list[pa.Array]] = [[] for _ in CHUNK_ARROW_SCHEMA]
        order_chunk, order_row = [], []  # per row: its chunk, and its place there
        is_new = np.ones(len(keys), dtype=bool)
        held_rows = 0
        if held:
            old = pa.Table.from_batches(held, schema=CHUNK_ARROW_SCHEMA).combine_chunks()
            old_names = stored_names(old)
            # The stored keys keep their place; those written take their new state and time of use.
            replaced = pc.index_in(old_names, value_set=names)
            is_written = replaced.is_valid()
            for index in range(3):  # thing, spec, axis
                columns[index].append(old.column(index).chunk(0))
            columns[3].append(pc.if_else(is_written, written_states.take(replaced), old.column("state")).chunk(0))
            columns[4].append(pc.if_else(is_written, pa.scalar(used_ms, pa.int64()), old.column("used_ms")).chunk(0))
            sizes = [batch.num_rows for batch in held]
            order_chunk.append(np.repeat([chunk for chunk in changed if chunk in self._batches], sizes))
            order_row.append(np.concatenate([np.arange(size) for size in sizes]))
            held_rows = old.num_rows
            is_new = ~pc.is_in(names, value_set=old_names).to_numpy(zero_copy_only=False)
        new = np.flatnonzero(is_new)
        if len(new):
            things, specs, axes = zip(*(keys[index] for index in new.tolist()))
            columns[0].append(pa.array(things, pa.string()))
            columns[1].append(pa.array(specs, pa.string()))
            columns[2].append(pa.array(axes, pa.string()))
            columns[3].append(written_states.take(pa.array(new)))
            columns[4].append(pa.array(np.full(len(new), used_ms, dtype=np.int64)))
            order_chunk.append(chunk_of_key[new])
            order_row.append(held_rows + new)  # after every stored key of the chunk, in the order written
        self.created += len(new)
        # Chunk after chunk, each one's stored keys first, then its new ones.
        chunk_order, row_order = np.concatenate(order_chunk), np.concatenate(order_row)
        order = np.lexsort((row_order, chunk_order))
        table = pa.Table.from_arrays([pa.concat_arrays(parts) for parts in columns], schema=CHUNK_ARROW_SCHEMA)
        batch = table.take(pa.array(order)).combine_chunks().to_batches()[0]
        chunk_order = chunk_order[order]
        starts = np.flatnonzero(np.diff(chunk_order, prepend=-1)).tolist()
        for start, end in zip(starts, [*starts[1:], len(chunk_order)]):
            chunk = int(chunk_order[start])
            self._batches[chunk] = part = batch.slice(start, end - start)
            self._chunks.updateValue((chunk,), (part.serialize().to_pybytes(),))
        self._written.clear()

    def _load(self, chunks: set[int]) -> None:
        for chunk in chunks.difference(self._read):
            value = self._chunks.getValue((chunk,))
            self._read.add(chunk)
            if value is not None:
                self._batches[chunk] = pa.ipc.read_record_batch(pa.py_buffer(value[0]), CHUNK_ARROW_SCHEMA)


# Joins a stored key's fields into one name: a byte no UTF-8 text holds, so the name is one key's alone, whatever
# its thing, axis and spec's name hold (a name may hold any character, NUL included).
_NAME_SEPARATOR = b"\xff"
_NAME = _NAME_SEPARATOR.join([b"%s"] * 3)


def key_names(keys: Sequence[StateKey]) -> pa.Array:
    """Each stored key as one name (bytes), as :func:`stored_names` names the keys of a chunk."""
    name = _NAME
    return pa.array([name % (thing.encode(), axis.encode(), spec.encode()) for thing, spec, axis in keys], pa.binary())


def stored_names(chunk: pa.Table | pa.RecordBatch) -> pa.Array:
    """The names (:func:`key_names`) of the keys a chunk holds."""
    names = pc.binary_join_element_wise(*(chunk.column(field).cast(pa.binary()) for field in ("thing", "axis", "spec")),
                                        _NAME_SEPARATOR)
    return names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names


Entries = dict[StateKey, tuple[bytes, int]]  # a chunk's keys: engine state and processing time (ms) of last use


@functools.lru_cache(maxsize=1 << 17)  # 100,000 machines fit
def chunk_of(stored: StateKey) -> int:
    """The state chunk of a join key within its bucket: by its thing, so a machine's keys share one."""
    return zlib.crc32(stored[0].encode("utf-8", "surrogatepass")) % STATE_CHUNKS_PER_BUCKET


def encode_chunks(chunks: Mapping[int, Entries]) -> dict[int, bytes]:
    """Each non-empty chunk's keys, engine states and last use as one Arrow IPC record batch (built together)."""
    stored = [key for entries in chunks.values() for key in entries]
    if not stored:
        return {}
    things, specs, axes = zip(*stored)
    states, used = zip(*(entry for entries in chunks.values() for entry in entries.values()))
    columns = [pa.array(things, pa.string()), pa.array(specs, pa.string()), pa.array(axes, pa.string()),
               pa.array(states, pa.binary()), pa.array(used, pa.int64())]
    batch = pa.RecordBatch.from_arrays(columns, schema=CHUNK_ARROW_SCHEMA)
    encoded, start = {}, 0
    for chunk, entries in chunks.items():
        if entries:
            encoded[chunk] = batch.slice(start, len(entries)).serialize().to_pybytes()
            start += len(entries)
    return encoded


def decode_chunks(blobs: Mapping[int, bytes | None]) -> dict[int, Entries]:
    """The entries of chunks :func:`encode_chunks` wrote (None: a chunk not written yet)."""
    batches = {chunk: pa.ipc.read_record_batch(pa.py_buffer(blob), CHUNK_ARROW_SCHEMA)
               for chunk, blob in blobs.items() if blob is not None}
    decoded: dict[int, Entries] = {chunk: {} for chunk in blobs}
    if not batches:
        return decoded
    table = pa.Table.from_batches(batches.values(), schema=CHUNK_ARROW_SCHEMA)
    thing, spec, axis, state, used = (table.column(index).to_pylist() for index in range(5))
    stored, entries = list(zip(thing, spec, axis)), list(zip(state, used))
    start = 0
    for chunk, batch in batches.items():
        end = start + batch.num_rows
        decoded[chunk] = dict(zip(stored[start:end], entries[start:end]))
        start = end
    return decoded


def evicted_dead_letters(resolver: SpecResolver, stored: StateKey, state: bytes, input_topic: str,
                         max_join_keys: int) -> list[bytes]:
    """The dead letters of what an evicted key held (``local_stream_buffer.eviction``), as the standalone
    joiner writes them."""
    thing, spec_name, axis = stored
    spec = next((spec for spec in resolver.specs if spec.name == spec_name), None)
    if spec is None:
        # A spec removed from the file since: nothing of it can pair any more, and its quantities are unknown.
        log.warning("evicted join key %s of a join spec no longer in the spec file: its records are not "
                    "dead-lettered", stored)
        return []
    binding = spec.bind(axis)
    held = held_records(state)  # reorder buffers and what the clock rule sets aside hold records too
    reason = eviction_reason(thing, binding, max_join_keys)
    return [dead_letter(reason, evicted_payload(record), STAGE, topic=input_topic,
                        key=record_key(record["thing"], record["quantity"]))
            for record in evicted_records(thing, binding, held)]


def started_rows(resolver: SpecResolver, data: pa.Table, spec_starts: Mapping[int, Mapping[str, int]]) -> pa.Table:
    """The routed rows of specs that had started where their record lies: a spec added on a running stack joins the
    records from its start in each partition on (`pipeline_core.spec_starts`); rows the router rejected stay."""
    later = {partition: starts for partition, starts in spec_starts.items() if any(starts.values())}
    if not later or not data.num_rows:
        return data
    quantities, codes = np.unique(data.column("quantity").fill_null("").to_numpy(zero_copy_only=False),
                                  return_inverse=True)
    route = data.column("route").to_numpy()
    width = int(route.max()) + 2
    pairs, pair_codes = np.unique(codes * width + route + 1, return_inverse=True)
    known = {spec.name: fingerprint(spec) for spec in resolver.specs}
    fingerprint_of = [known[resolver.routes(quantities[pair // width])[pair % width - 1].binding.spec.name]
                      if pair % width else None for pair in pairs.tolist()]
    partitions = data.column("partition").to_numpy().astype(np.int64)
    # Per (spec route, partition): where that spec started there; a row joins from its start on.
    table = np.zeros((len(pairs), max(int(partitions.max()), max(later)) + 1), dtype=np.int64)
    for partition, starts in later.items():
        table[:, partition] = [starts.get(found, 0) if found else 0 for found in fingerprint_of]
    keep = data.column("offset").to_numpy() >= table[pair_codes, partitions]
    return data if keep.all() else data.filter(pa.array(keep))


def committed_rows(data: pa.Table, committed: Mapping[int, int]) -> np.ndarray | None:
    """Which rows lie before their partition's committed offset (a boolean mask); None when none does."""
    if not committed or not data.num_rows:
        return None
    partitions = data.column("partition").to_numpy()
    limits = np.zeros(max(max(committed), int(partitions.max())) + 1, dtype=np.int64)
    limits[list(committed)] = list(committed.values())
    mask = data.column("offset").to_numpy() < limits[partitions]
    return mask if mask.any() else None


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list]:
    """Dictionary codes of a string column and the distinct values they index."""
    encoded = column.combine_chunks().dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()


def keyed_rows(resolver: SpecResolver, data: pa.Table) -> KeyedRows:
    """The engine's view of routed rows: each row's join key (thing and the binding its route names)."""
    quantity_codes, quantities = _codes(data.column("quantity"))
    thing_codes, things = _codes(data.column("thing"))
    route = data.column("route").to_numpy().astype(np.int64)
    width = int(route.max()) + 1
    # A row's binding from (quantity, route index); its key from (thing, binding).
    routes, route_codes = np.unique(quantity_codes * width + route, return_inverse=True)
    route_bindings = [resolver.routes(quantities[code // width])[code % width].binding for code in routes.tolist()]
    bindings = list(dict.fromkeys(route_bindings))
    binding_of_route = np.array([bindings.index(binding) for binding in route_bindings], dtype=np.int64)
    codes, key = np.unique(thing_codes * len(bindings) + binding_of_route[route_codes], return_inverse=True)
    keys = [(things[code // len(bindings)], bindings[code % len(bindings)]) for code in codes.tolist()]
    return KeyedRows(keys, key.astype(np.int64), data.column("side").to_numpy(), stream_order(data),
                     data.column("offset").to_numpy(), data.column("time").to_numpy(),
                     data.column("result").to_numpy())


# Above every partition number Kafka gives a topic: a row's place in its stream ranks its placement count first.
_PARTITIONS_BELOW = 1 << 31


def stream_order(data: pa.Table) -> np.ndarray:
    """Per routed row, what orders its stream before its offset: the partition count it was placed by, then its
    partition (`parse`: after the input grew, a thing's records placed by the new count, in another partition,
    follow those placed by the old one)."""
    return (data.column("placement").to_numpy().astype(np.int64) * _PARTITIONS_BELOW
            + data.column("partition").to_numpy().astype(np.int64))


Encoder = Callable[[Sequence[JoinKey], KeyedPairs, str], EncodedOutputs]


def join_bucket(resolver: SpecResolver, data: pa.Table, states: KeyStates, input_topic: str,
                max_pending_per_side: int, encode: Encoder = encode_outputs, arrived_ms: int = 0) -> Emitted:
    """Join a bucket's routed rows (in any row order) into ``states`` with the engine; the records to emit.

    ``states`` maps each join key to its engine state as bytes and is updated in place. Rows the router
    rejected, and rows the engine finds out of order, become dead letters with their reasons; ``encode``
    turns the pairs into records.
    """
    emitted = Emitted()
    invalid = pc.is_valid(data.column("reason"))
    if data.column("reason").null_count < data.num_rows:
        rejected = data.filter(invalid)
        for payload, reason, partition, offset, key in zip(*(rejected.column(name).to_pylist() for name in
                                                             ("payload", "reason", "partition", "offset", "key"))):
            emitted.dead_letter(reason, payload, input_topic, partition, offset,
                                key.decode("utf-8", "replace") if key is not None else None)
        data = data.filter(pc.invert(invalid))
    if not data.num_rows:
        return emitted
    rows = keyed_rows(resolver, data)
    joined = join_keyed_batch(states, rows, max_pending_per_side, arrived_ms)
    payloads = data.column("payload")
    things, quantities = data.column("thing"), data.column("quantity")
    partitions = data.column("partition")
    for row, reason in zip(joined.rejected.tolist(), joined.reasons):
        emitted.dead_letter(reason, payloads[row].as_py(), input_topic, partitions[row].as_py(), rows.offset[row],
                            record_key(things[row].as_py(), quantities[row].as_py()))
    for dropped in joined.dropped:
        # Held from an earlier batch and given up by the clock rule: as its reading, as the standalone joiner writes it.
        thing, binding = rows.keys[dropped.key]
        record, = evicted_records(thing, binding, [(dropped.side, dropped.time, dropped.result)])
        key = record_key(record["thing"], record["quantity"])
        emitted.dead_letters.append(dead_letter(dropped.reason, evicted_payload(record), STAGE, topic=input_topic,
                                                key=key))
    for code, counters in joined.clock.items():
        emitted.clock_faults.setdefault(rows.keys[code][0], ClockCounters()).add(counters)
    if joined.count:
        emitted.outputs(encode(rows.keys, joined, input_topic))
    return emitted


class Emitted:
    """The records of one bucket and micro-batch: dead letters (few) and output records (as arrays)."""

    def __init__(self) -> None:
        self.dead_letters: list[bytes] = []
        self.keys: list[pa.Array] = []
        self.values: list[pa.Array] = []
        self.clock_faults: dict[str, ClockCounters] = {}  # per machine, what the clock rule did

    def __len__(self) -> int:
        return len(self.dead_letters) + sum(map(len, self.values)) + bool(self.clock_faults)

    def dead_letter(self, reason: str, payload: bytes | None, topic: str, partition: int, offset: int,
                    key: str | None) -> None:
        # payload None: a record without a value (a tombstone); key None: a record without a key.
        self.dead_letters.append(dead_letter(reason, payload, STAGE, topic=topic, partition=int(partition),
                                             offset=int(offset), key=key))

    def outputs(self, encoded: EncodedOutputs) -> None:
        self.keys.append(encoded.keys)
        self.values.append(encoded.values)
        self.dead_letters.extend(encoded.dead_letters)

    def frame(self) -> pd.DataFrame:
        """The records as the processor's one output row: machine.dlq's, then machine.out's, then the clock rule's
        counts if it counted anything."""
        outputs = sum(map(len, self.values))
        kinds = np.full(len(self.dead_letters) + outputs, OUT, np.int8)
        kinds[:len(self.dead_letters)] = DLQ
        keys = pa.concat_arrays([pa.nulls(len(self.dead_letters), pa.string()), *self.keys])
        values = pa.concat_arrays([pa.array(self.dead_letters, pa.binary()), *self.values])
        if self.clock_faults:
            kinds = np.append(kinds, np.int8(CLOCK))
            keys = pa.concat_arrays([keys, pa.nulls(1, pa.string())])
            counts = {thing: counters.as_tuple() for thing, counters in self.clock_faults.items()}
            values = pa.concat_arrays([values, pa.array([json.dumps(counts).encode()], pa.binary())])
        records = pa.RecordBatch.from_arrays([pa.array(kinds), keys, values], schema=EMITTED_ARROW_SCHEMA)
        return pd.DataFrame({"records": [records.serialize().to_pybytes()]})


def unpack_emitted(blobs: Iterable[bytes]) -> pa.Table:
    """The records of the processor's output rows, as one table of kind, key and value."""
    return pa.Table.from_batches([pa.ipc.read_record_batch(pa.py_buffer(blob), EMITTED_ARROW_SCHEMA)
                                  for blob in blobs], schema=EMITTED_ARROW_SCHEMA)
