"""The Spark processor's join state in chunks: a key's state written in one micro-batch is read in the next,
a chunk holds the keys of its things, and a batch costs one state read and write per chunk it touches."""
from __future__ import annotations

from collections import Counter

from spark_joiner.processor import STATE_CHUNKS_PER_BUCKET, ChunkedStates, chunk_of, decode_chunks, encode_chunks


class CountingMapState:
    """Spark's map state as its server keeps it, counting the calls (each a round trip to the JVM)."""

    def __init__(self) -> None:
        self.values: dict[tuple, tuple] = {}
        self.calls: Counter = Counter()

    def getValue(self, key: tuple) -> tuple | None:  # noqa: N802 (Spark's names)
        self.calls["get"] += 1
        return self.values.get(tuple(key))

    def updateValue(self, key: tuple, value: tuple) -> None:  # noqa: N802
        self.calls["update"] += 1
        self.values[tuple(key)] = value


def test_states_written_in_one_batch_are_read_in_the_next_a_chunk_at_a_time() -> None:
    chunks = CountingMapState()
    keys = [(f"M{machine:05d}", spec, "C11") for machine in range(1_000) for spec in ("power", "ratio")]
    written = ChunkedStates(chunks)
    assert written.read_many(keys) == [None] * len(keys)
    written.write_many({stored: f"state {number}".encode() for number, stored in enumerate(keys)})
    assert written.read_many(keys[:1]) == [b"state 0"]  # a second join call of the batch sees the first's
    assert written.created == len(keys)
    written.store(used_ms=1_700_000_000_000)
    assert len(chunks.values) == STATE_CHUNKS_PER_BUCKET
    assert chunks.calls == {"get": STATE_CHUNKS_PER_BUCKET, "update": STATE_CHUNKS_PER_BUCKET}

    chunks.calls.clear()
    read = ChunkedStates(chunks)
    assert read.read_many(keys) == [f"state {number}".encode() for number in range(len(keys))]
    assert chunks.calls == {"get": STATE_CHUNKS_PER_BUCKET}
    read.write_many({keys[0]: b"changed"})
    assert read.created == 0
    read.store(used_ms=1_700_000_000_500)
    assert chunks.calls["update"] == 1  # only the chunk of the key written
    chunk = chunk_of(keys[0])
    entries = decode_chunks({chunk: chunks.values[(chunk,)][0]})[chunk]
    assert entries[keys[0]] == (b"changed", 1_700_000_000_500)
    assert entries[keys[1]] == (b"state 1", 1_700_000_000_000)  # same machine, same chunk
    assert all(chunk_of(stored) == chunk_of(keys[0]) for stored in entries)


def test_chunks_keep_any_thing_name_and_state_bytes() -> None:
    chunks = {3: {("Ä\u2028 ☃", "power", ""): (b"\x00\xff" * 3, -1), ("M1", "ratio", "C11"): (b"", 2**62)},
              0: {("M2", "power", "C11"): (b"x" * 1000, 0)}, 5: {}}
    encoded = encode_chunks(chunks)
    assert set(encoded) == {0, 3}  # an empty chunk is not written
    assert decode_chunks({**encoded, 7: None}) == {0: chunks[0], 3: chunks[3], 7: {}}
    assert encode_chunks({}) == {} and decode_chunks({}) == {}
