"""The Spark processor's join state in chunks: a key's state written in one micro-batch is read in the next,
a chunk holds the keys of its things, and a batch costs one state read and write per chunk it touches."""
from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from spark_joiner.bucket_join import ChunkedStates, chunk_of, decode_chunks, encode_chunks
from spark_joiner.state_layout import STATE_CHUNKS_PER_BUCKET


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
    written.store(used_ms=1_700_000_000_000)
    assert written.created == len(keys)
    assert len(chunks.values) == STATE_CHUNKS_PER_BUCKET
    assert chunks.calls == {"get": STATE_CHUNKS_PER_BUCKET, "update": STATE_CHUNKS_PER_BUCKET}

    chunks.calls.clear()
    read = ChunkedStates(chunks)
    assert read.read_many(keys) == [f"state {number}".encode() for number in range(len(keys))]
    assert chunks.calls == {"get": STATE_CHUNKS_PER_BUCKET}
    read.write_many({keys[0]: b"changed"})
    read.store(used_ms=1_700_000_000_500)
    assert read.created == 0
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


# A few things over a few chunks, with specs and axes that share text, so keys differ in one field only.
_KEYS = st.tuples(st.sampled_from(["M1", "M2", "M1\u2028", "Ä ☃", "M10", "M100"]),
                  st.sampled_from(["power", "pow", "power\x00C11"]), st.sampled_from(["", "C11", "C1"]))
_BATCH = st.lists(st.tuples(_KEYS, st.one_of(st.none(), st.binary(max_size=12))), max_size=12)


@given(st.lists(_BATCH, min_size=1, max_size=6))
def test_chunks_hold_what_a_dict_of_keys_holds_in_the_order_written(batches: list) -> None:
    """Micro-batch after micro-batch (each a ChunkedStates of its own over the same map state): reading keys, then
    writing some, gives what a dict per chunk gives, stored keys keeping their place and new ones appended."""
    chunks = CountingMapState()
    model: dict[int, dict] = {}
    for used_ms, batch in enumerate(batches):
        states = ChunkedStates(chunks)
        keys = list(dict.fromkeys(stored for stored, _ in batch))
        expected = [model.get(chunk_of(stored), {}).get(stored, (None, 0))[0] for stored in keys]
        assert states.read_many(keys) == expected
        written = {stored: state for stored, state in batch if state is not None}
        states.write_many(written)
        states.store(used_ms)
        created = 0
        for stored, state in written.items():
            entries = model.setdefault(chunk_of(stored), {})
            created += stored not in entries
            entries[stored] = (state, used_ms)
        assert states.created == created
        stored_chunks = decode_chunks({chunk: value[0] for (chunk,), value in chunks.values.items()})
        assert {chunk: list(entries.items()) for chunk, entries in stored_chunks.items()} == \
            {chunk: list(entries.items()) for chunk, entries in model.items()}
