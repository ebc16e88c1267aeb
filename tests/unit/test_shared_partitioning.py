"""Partitioning by thing: Kafka's own murmur2, so any client's default partitioner keyed by the thing agrees."""
from __future__ import annotations

import pytest

from pipeline_core.partitioning import murmur2, thing_partition


@pytest.mark.parametrize("text, signed", [
    # The expected values of Kafka's own UtilsTest.testMurmur2.
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
])
def test_murmur2_equals_kafkas(text: str, signed: int) -> None:
    assert murmur2(text.encode()) == signed & 0xFFFFFFFF


def test_every_quantity_of_a_thing_shares_a_partition_and_things_spread() -> None:
    assert thing_partition("R0815", 5) == (murmur2(b"R0815") & 0x7FFFFFFF) % 5
    spread = {thing_partition(f"machine-{index}", 5) for index in range(50)}
    assert spread == set(range(5))
    assert 0 <= thing_partition("Maschine-\u00fc", 7) < 7
