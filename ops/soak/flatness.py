"""Flat over time: the live phase's first window against its last, from the soak's own samples.

* memory: no program's resident memory (its whole process tree) grows more than `RSS_GROWTH` (median of each
  window's samples);
* latency: the last window's p99 within `LATENCY_GROWTH` times the first's;
* state that must stay bounded (the Spark checkpoint, the standalone joiner's state topic, Kafka's compacted
  offsets and transaction logs): the last window's median within `BOUNDED_GROWTH` of the first's;
* data that grows with the records (Kafka's topics, InfluxDB's shards): the bytes each record adds in the last
  window within `PER_RECORD_GROWTH` times those of the first, and the size each would reach at the plant's live
  rate after its retention.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .schedule import Windows

RSS_GROWTH = 0.10
LATENCY_GROWTH = 1.5
BOUNDED_GROWTH = 1.25
PER_RECORD_GROWTH = 1.5
MIN_LATENCY_SAMPLES = 50
BOUNDED_TOPIC_SUFFIXES = (".state",)
BOUNDED_TOPICS = ("__consumer_offsets", "__transaction_state")
TIME_SERIES_TOPICS = ("machine.data", "machine.out", "machine.dlq")


@dataclass
class FlatVerdict:
    what: str  # "rss lsb-joiner", "latency p99", ...
    first: float | None
    last: float | None
    limit: str  # the rule, in words
    holds: bool | None  # None: not judged (why in `note`)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"what": self.what, "first": self.first, "last": self.last, "limit": self.limit, "holds": self.holds,
                "note": self.note}


def _in(samples: Sequence[Mapping[str, Any]], window: tuple[float, float]) -> list[Mapping[str, Any]]:
    return [sample for sample in samples if window[0] <= sample["at"] <= window[1]]


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def rss_verdicts(samples: Sequence[Mapping[str, Any]], windows: Windows) -> list[FlatVerdict]:
    if windows.first is None or windows.last is None:
        return [FlatVerdict("rss", None, None, f"+{RSS_GROWTH:.0%}", None, windows.reason or "")]
    first, last = _in(samples, windows.first), _in(samples, windows.last)
    programs = sorted({name for sample in first + last for name in sample.get("usage", {})})
    verdicts = []
    for program in programs:
        before = _median([s["usage"][program]["rss_bytes"] for s in first if program in s.get("usage", {})])
        after = _median([s["usage"][program]["rss_bytes"] for s in last if program in s.get("usage", {})])
        if before is None or after is None:
            verdicts.append(FlatVerdict(f"rss {program}", before, after, f"+{RSS_GROWTH:.0%}", None,
                                        "not running in both windows"))
            continue
        verdicts.append(FlatVerdict(f"rss {program}", before, after, f"at most +{RSS_GROWTH:.0%}",
                                    after <= before * (1 + RSS_GROWTH)))
    return verdicts


def latency_verdict(latencies: Sequence[tuple[float, float]], windows: Windows) -> FlatVerdict:
    rule = f"p99 at most {LATENCY_GROWTH}x"
    if windows.first is None or windows.last is None:
        return FlatVerdict("latency p99", None, None, rule, None, windows.reason or "")
    first = [latency for sent_at, latency in latencies if windows.first[0] <= sent_at <= windows.first[1]]
    last = [latency for sent_at, latency in latencies if windows.last[0] <= sent_at <= windows.last[1]]
    if min(len(first), len(last)) < MIN_LATENCY_SAMPLES:
        return FlatVerdict("latency p99", None, None, rule, None,
                           f"{len(first)} and {len(last)} timed rows: fewer than {MIN_LATENCY_SAMPLES} in a window")
    before, after = float(np.percentile(first, 99)), float(np.percentile(last, 99))
    return FlatVerdict("latency p99", before, after, rule, after <= LATENCY_GROWTH * before)


def _disk_series(samples: Sequence[Mapping[str, Any]], value: Callable[[Mapping[str, Any]], float | None]
                 ) -> list[tuple[float, float]]:
    series = []
    for sample in samples:
        disk = sample.get("disk")
        if disk:
            found = value(disk)
            if found is not None:
                series.append((sample["at"], found))
    return series


def bounded_verdicts(samples: Sequence[Mapping[str, Any]], windows: Windows) -> list[FlatVerdict]:
    """The state that must not grow with the records: the Spark checkpoint (bytes and files), the compacted
    topics."""
    rule = f"at most {BOUNDED_GROWTH}x"
    if windows.first is None or windows.last is None:
        return [FlatVerdict("bounded state", None, None, rule, None, windows.reason or "")]
    topics = sorted({topic for sample in samples for topic in (sample.get("disk") or {}).get("topics", {})
                     if topic.endswith(BOUNDED_TOPIC_SUFFIXES) or topic in BOUNDED_TOPICS})
    items: list[tuple[str, Callable[[Mapping[str, Any]], float | None]]] = [
        ("spark checkpoint bytes", lambda disk: disk.get("checkpoint")),
        ("spark checkpoint files", lambda disk: disk.get("checkpoint_files")),
    ] + [(f"topic {topic} bytes", lambda disk, topic=topic: disk.get("topics", {}).get(topic)) for topic in topics]
    verdicts = []
    for what, value in items:
        series = _disk_series(samples, value)
        before = _median([v for at, v in series if windows.first[0] <= at <= windows.first[1]])
        after = _median([v for at, v in series if windows.last[0] <= at <= windows.last[1]])
        if before is None or after is None:
            continue
        verdicts.append(FlatVerdict(what, before, after, rule, after <= BOUNDED_GROWTH * max(before, 1.0)))
    return verdicts


def per_record_verdicts(samples: Sequence[Mapping[str, Any]], windows: Windows) -> list[FlatVerdict]:
    """Kafka's time-series topics and InfluxDB's data: the bytes each record written adds, first window against
    last (Kafka: records of the topic; InfluxDB: records of machine.data and machine.out, one point each)."""
    rule = f"bytes per record at most {PER_RECORD_GROWTH}x"
    if windows.first is None or windows.last is None:
        return [FlatVerdict("disk per record", None, None, rule, None, windows.reason or "")]
    verdicts = []
    growing = [(f"kafka {topic}", lambda s, topic=topic: (s.get("disk") or {}).get("topics", {}).get(topic),
                lambda s, topic=topic: (s.get("offsets") or {}).get(topic)) for topic in TIME_SERIES_TOPICS]
    growing.append(("influxdb data", lambda s: (s.get("disk") or {}).get("data", {}).get("influxdb"),
                    lambda s: sum((s.get("offsets") or {}).get(topic) or 0 for topic in TIME_SERIES_TOPICS[:2])))
    for what, size, records in growing:
        rates, still = [], False
        for window in (windows.first, windows.last):
            inside = [s for s in _in(samples, window) if s.get("disk") and size(s) is not None and records(s)]
            if len(inside) < 2:
                rates.append(None)
                still = False
                continue
            added = records(inside[-1]) - records(inside[0])
            grown_bytes = size(inside[-1]) - size(inside[0])
            rates.append(grown_bytes / added if added > 0 else None)
            still = added == 0 and grown_bytes <= 0  # of the last window, as it is the later
        before, after = rates
        if after is None and still:
            # A topic a healthy plant rarely writes to (machine.dlq): nothing added in the last window, nor a byte.
            verdicts.append(FlatVerdict(f"{what} bytes per record", before, None, rule, True,
                                        "no records and no bytes added in the last window"))
            continue
        if before is None or after is None or before <= 0:
            verdicts.append(FlatVerdict(f"{what} bytes per record", before, after, rule, None,
                                        "too few records or disk samples in a window"))
            continue
        verdicts.append(FlatVerdict(f"{what} bytes per record", before, after, rule,
                                    after <= PER_RECORD_GROWTH * before))
    return verdicts


@dataclass
class Flatness:
    windows: Windows
    verdicts: list[FlatVerdict] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return all(verdict.holds is not False for verdict in self.verdicts)


def flatness(samples: Sequence[Mapping[str, Any]], latencies: Sequence[tuple[float, float]],
             windows: Windows) -> Flatness:
    return Flatness(windows, [*rss_verdicts(samples, windows), latency_verdict(latencies, windows),
                              *bounded_verdicts(samples, windows), *per_record_verdicts(samples, windows)])
