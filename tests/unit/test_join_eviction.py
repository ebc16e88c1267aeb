"""The bound on join keys (local_stream_buffer.eviction) and on the route cache: distinct things, quantity
names and axes cost bounded memory; within the bound the join is the unbounded one, beyond it the least
recently used keys are evicted and every record they held is handed over (dead-lettered) and released."""
from __future__ import annotations

import gc
import resource

import numpy as np

from conftest import EVENTS_FILE
from kafka_joiner_support import rows_as_records
from kafka_joiner.changelog import StateChanges
from kafka_joiner.repartition import ThingRouter
from local_stream_buffer.eviction import keys_to_evict
from local_stream_buffer.keyed import KeyedJoiner
from local_stream_buffer.reorder import join_reordered
from local_stream_buffer.specs import ROUTE_CACHE_SIZE, JoinSpec, SpecResolver
from pipeline_core.record_keys import record_key
from spark_joiner.bucket_join import evicted_dead_letters


def machine(thing: str, axis: int, start_ms: int, ticks: int) -> list[dict]:
    """Speed and torque of one axis, in time order, torque 10 ms after speed."""
    return [{"thing": thing, "quantity": quantity, "phenomenonTime": start_ms + tick * 100 + shift, "result": value}
            for tick in range(ticks)
            for quantity, shift, value in ((f"actSpeed_C{axis}", 0, 1000.0 + tick), (f"vaTorque_C{axis}", 10, 2.5))]


def test_keys_to_evict_takes_the_least_recently_used_down_to_nine_tenths() -> None:
    used = [(f"k{index}", float(index % 7) + index / 1000) for index in range(21)]
    assert keys_to_evict(used, 20, 20) == []  # within the bound
    evicted = keys_to_evict(used, 21, 20, keep=["k0"])
    assert len(evicted) == 21 - 18 and "k0" not in evicted
    assert evicted == [key for key, _ in sorted(used[1:], key=lambda item: item[1])][:3]


def test_within_the_bound_the_join_is_the_unbounded_one() -> None:
    records = rows_as_records(EVENTS_FILE, time_order=True)
    bounded, unbounded = KeyedJoiner(max_join_keys=3), KeyedJoiner(max_join_keys=None)
    outputs = [[output for record in records for output in joiner.ingest(record).outputs]
               for joiner in (bounded, unbounded)]
    assert bounded.key_count() == 3  # three machines, one axis each: exactly at the bound
    assert outputs[0] == outputs[1] and len(outputs[0]) == 2_748
    assert bounded.counters.evicted_keys == 0


def test_evicted_keys_hand_over_and_release_every_record_they_held() -> None:
    released: list[object] = []
    evicted: list[tuple[dict, object, str]] = []
    joiner = KeyedJoiner(max_join_keys=10, on_release=released.append,
                         on_evict=lambda records, reason: evicted.extend((r, s, reason) for r, s in records))
    sources = iter(range(1_000_000))
    for index in range(100):
        for record in machine(f"m{index}", 11, 1_700_000_000_000, 3):
            joiner.ingest(record, next(sources))
        assert joiner.key_count() <= 10
    counters = joiner.counters
    assert counters.evicted_keys == 100 - joiner.key_count()
    assert counters.evicted == len(evicted) > 0
    # Every record is either still held, or was released exactly once (paired off, or evicted).
    assert sorted([*released, *joiner.held_sources()]) == list(range(600))
    assert {source for _, source, _ in evicted} <= set(released)
    record, _, reason = evicted[0]
    assert reason.startswith("evicted: join key m0/power/11 ")
    assert record["thing"] == "m0" and record["quantity"] in ("actSpeed_C11", "vaTorque_C11")
    # A later record of an evicted key starts it afresh, and joins.
    assert joiner.ingest(machine("m0", 11, 1_800_000_000_000, 1)[0]).status.name == "ACCEPTED"


def test_a_recently_used_key_outlives_a_flood_of_new_ones() -> None:
    joiner = KeyedJoiner(max_join_keys=50)
    steady = machine("steady", 1, 1_700_000_000_000, 2_000)
    outputs = []
    for index in range(2_000):
        outputs += joiner.ingest(steady[2 * index]).outputs + joiner.ingest(steady[2 * index + 1]).outputs
        joiner.ingest(machine(f"flood{index}", 1, 1_700_000_000_000, 1)[0])  # one new key per tick
    reference = KeyedJoiner(max_join_keys=None)
    expected = [output for record in steady for output in reference.ingest(record).outputs]
    assert outputs == expected
    assert joiner.counters.evicted_keys > 1_900


def _rss_bytes() -> int:
    """The process's resident memory now (not its peak)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def _measure(joiner: KeyedJoiner, changelog: dict[bytes, bytes], changes: StateChanges, first: int,
             last: int) -> None:
    """Feed machines `first`..`last`-1, each on an axis of its own (a new quantity name), and commit the
    state changes into a compacted changelog (a dict: the latest value per key) every 1,000 machines."""
    position = first * 10
    for index in range(first, last):
        axis = 1_000_000 + index
        for record in machine(f"thing-{index}", axis, 1_700_000_000_000, 2):
            position += 1
            if joiner.ingest(record, position).status.name == "ACCEPTED":
                changes.puts[position] = b"x" * 100
        if index % 1_000 == 999:
            changes.flush(lambda key, value: compact(changelog, key, value))


def compact(changelog: dict[bytes, bytes], key: bytes, value: bytes | None) -> None:
    """What a compacted topic keeps: the latest value per key, none after a tombstone."""
    if value is None:
        changelog.pop(key, None)
    else:
        changelog[key] = value


def test_memory_state_and_changelog_stay_bounded_over_100_000_distinct_keys() -> None:
    resolver = SpecResolver()
    changes = StateChanges()
    joiner = KeyedJoiner(resolver, max_join_keys=2_000, on_release=changes.released)
    changelog: dict[bytes, bytes] = {}
    sizes = []
    for first, last in ((0, 50_000), (50_000, 100_000)):
        _measure(joiner, changelog, changes, first, last)
        gc.collect()
        sizes.append((_rss_bytes(), joiner.key_count(), joiner.held_count(), len(changelog), len(resolver._routes),
                      len(resolver._bindings)))
    (memory_50k, *state_50k), (memory_100k, *state_100k) = sizes
    assert joiner.counters.evicted_keys >= 100_000 - 2_000  # 100,000 distinct keys went through
    for keys, held, changelog_records, routes, bindings in (state_50k, state_100k):
        assert keys <= 2_000 and held <= 4 * keys and changelog_records <= held
        assert routes <= ROUTE_CACHE_SIZE and bindings <= ROUTE_CACHE_SIZE
    # Twice the distinct keys, no more memory. Unbounded, the second 50,000 keys alone took about 100 MB.
    assert memory_100k - memory_50k < 16 * 2**20, sizes


def test_the_route_cache_stays_bounded_over_100_000_distinct_quantity_names() -> None:
    resolver = SpecResolver()
    router = ThingRouter(resolver, 5)
    for index in range(100_000):
        # Things with dots, quantities of new axes, and names no spec joins.
        assert router.partition(record_key(f"site.{index}.line", f"actSpeed_C{index}").encode()) is not None
        assert router.partition(record_key(f"site.{index}", f"junk_{index}").encode()) is None
        resolver.routes(f"vaTorque_C{index}")
    assert len(resolver._routes) <= ROUTE_CACHE_SIZE and len(resolver._bindings) <= ROUTE_CACHE_SIZE
    assert resolver.routes("actSpeed_C7")[0].binding.output_quantity == "vaPower_C7"  # resolved again
    assert resolver.joinable_thing(record_key("a.b", "vaTorque_C3")) == "a.b"
    assert resolver.joinable_thing("a.b.vaTorque_C3") is None  # thing "a", quantity "b.vaTorque_C3"


def test_an_evicted_key_under_a_reorder_bound_hands_over_its_buffered_records_too() -> None:
    """With max_out_of_orderness, a key holds records in its reorder buffers as well as in its join: eviction
    gives up both, on the per-record path and in the batch state the Spark joiner keeps."""
    bounded = JoinSpec("power", "actSpeed_C{axis}", "vaTorque_C{axis}", "vaPower_C{axis}", "power",
                       delta_time_s=1.0, max_out_of_orderness_s=2.0)
    released: list[object] = []
    evicted: list[dict] = []
    joiner = KeyedJoiner([bounded], max_join_keys=10, on_release=released.append,
                         on_evict=lambda records, reason: evicted.extend(record for record, _ in records))
    sources = iter(range(1_000_000))
    for index in range(30):
        for record in machine(f"m{index}", 11, 1_700_000_000_000, 3):  # 0.2 s apart: all behind the bound
            joiner.ingest(record, next(sources))
    assert joiner.counters.evicted_keys == 30 - joiner.key_count() > 0
    # Every record is either still held or was released exactly once, and each evicted key gave up its six.
    assert sorted([*released, *joiner.held_sources()]) == list(range(180))
    assert len(evicted) == 6 * joiner.counters.evicted_keys
    # The batch path (the Spark joiner's state bytes): eviction reads the reorder buffers as well.
    times = np.array([1_700_000_000_000.0, 1_700_000_000_100.0, 1_700_000_000_200.0])
    state, _, _ = join_reordered(None, times, np.array([1000.0, 1001.0, 1002.0]), times + 10, np.full(3, 2.5),
                                 2_000.0, delta_time_ms=1_000.0)
    letters = evicted_dead_letters(SpecResolver([bounded]), ("m0", "power", "11"), state, "machine.data", 10)
    assert len(letters) == 6  # all six still wait behind the watermark
