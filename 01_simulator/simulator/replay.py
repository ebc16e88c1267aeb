"""Which rows to publish, at what pace, and the summary of a run."""
from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from tqdm import tqdm

from .events import Row, delta_to_end_at, displaced, event_time_ms, in_order, read_events, repeat, shifted
from .placement import REPLAY_GAP_MS, describe_ms, oldest_per_machine, shift_past
from .publisher import Publisher
from .settings import SimulatorSettings
from .synthetic import fleet_things, synthetic_rows
from .topics import row_topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Summary:
    rows: int  # acknowledged by the broker
    failures: int  # not delivered: refused by the client, set aside, or not acknowledged at the end
    seconds: float
    unacknowledged: int = 0  # of the failures: sent, but no PUBACK came by the end (the broker may hold some)
    set_aside: int = 0  # of the failures: refused by the broker under their topic and the fallback topic
    rerouted: int = 0  # published under the fallback topic, the broker refusing their own
    stopped_by: str | None = None  # the signal that ended the run before its last row

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def __str__(self) -> str:
        text = f"published {self.rows} rows in {self.seconds:.1f} s ({self.rate:,.0f} rows/s), {self.failures} failures"
        parts = [f"{self.unacknowledged} not acknowledged"] if self.unacknowledged else []
        if self.set_aside:
            parts.append(f"{self.set_aside} set aside, refused by the broker (see the log)")
        if parts:
            text += f" ({'; '.join(parts)})"
        if self.rerouted:
            text += f", {self.rerouted} under the fallback topic, the broker refusing their own"
        if self.stopped_by:
            text += f"; stopped by {self.stopped_by}"
        return text


def selected_rows(settings: SimulatorSettings, previous: Mapping[str, float] | None = None
                  ) -> tuple[Iterator[Row], int | None]:
    """The rows of this run after --skip and --limit, and how many there are (None: without end).

    `previous`: per machine, the newest time earlier replays published (`placement.ReplayLog`); with --ending-now
    the rows are moved on past it where the newest row at now would lay them over those replays' rows."""
    if settings.skip < 0 or settings.limit < 0:
        raise ValueError("--skip and --limit must not be negative")
    if settings.disorder_ms and (settings.synthetic or settings.order != "time"):
        raise ValueError("--disorder-ms displaces the events file's time order: not with --synthetic or --order file")
    if settings.synthetic:
        start_ms = settings.start_ms
        if settings.ending_now:
            # The newest row of the run at now (without --limit, the first): rows older than InfluxDB's
            # retention would be refused.
            last_step = (settings.skip + settings.limit - 1) // settings.machines if settings.limit else 0
            start_ms = int(time.time() * 1000) - max(last_step, 0) * settings.interval_ms
            things = fleet_things(settings.machines, settings.axes, settings.seed)
            start_ms += _moved_on(0, dict.fromkeys(things, start_ms), previous or {})
        rows: Iterator[Row] = synthetic_rows(settings.machines, settings.axes, settings.seed, start_ms,
                                             settings.interval_ms)
        available = None
    else:
        events = read_events(settings.events_file)
        if settings.ending_now:
            at_now = delta_to_end_at(events, int(time.time() * 1000))
            events = shifted(events, at_now + _moved_on(at_now, oldest_per_machine(events), previous or {}))
        events = displaced(in_order(events, settings.order), settings.disorder_ms, settings.seed)
        rows = repeat(events) if settings.loop else iter(events)
        available = None if settings.loop else max(0, len(events) - settings.skip)
    rows = itertools.islice(rows, settings.skip, None)
    if settings.limit:
        rows = itertools.islice(rows, settings.limit)
        available = settings.limit if available is None else min(available, settings.limit)
    return rows, available


def _moved_on(delta_ms: int, oldest: Mapping[str, float], previous: Mapping[str, float]) -> int:
    """How much further than `delta_ms` the rows must move so that no machine goes back behind an earlier replay."""
    further = shift_past(delta_ms, oldest, previous) - delta_ms
    if further:
        # Said once per run: where the rows land, and why.
        binding = max((thing for thing in oldest if thing in previous),
                      key=lambda thing: previous[thing] - oldest[thing])
        log.info("an earlier replay left %s at %s: this replay is moved %.1f h further on, each machine %d s or more "
                 "after its earlier rows (%s from %s)", binding, describe_ms(previous[binding]), further / 3_600_000,
                 REPLAY_GAP_MS // 1000, binding, describe_ms(oldest[binding] + delta_ms + further))
    return further


def due_times(settings: SimulatorSettings) -> Callable[[int, Row], float] | None:
    """When (s after the start) row number i is due, or None to publish as fast as acks allow."""
    if settings.rate < 0 or settings.speedup < 0:
        raise ValueError("--rate and --speedup must not be negative")
    if settings.rate and settings.speedup:
        raise ValueError("choose --rate or --speedup, not both")
    if settings.rate:
        return lambda index, _row: index / settings.rate
    if settings.speedup:
        first: list[float] = []

        latest: list[float] = []

        def due(_index: int, row: Row) -> float:
            # A row without a valid time goes out with the row before it.
            time_ms = event_time_ms(row)
            if time_ms is None:
                return latest[0] if latest else 0.0
            if not first:
                first.append(time_ms)
            latest[:] = [max(0.0, time_ms - first[0]) / 1000 / settings.speedup]
            return latest[0]

        return due
    return None


def publish_rows(publisher: Publisher, settings: SimulatorSettings, rows: Iterator[Row], total: int | None) -> Summary:
    """Publish `rows` at the configured pace, then wait for the last acknowledgements; after the publisher's
    `request_stop`, publish no more and wait no longer than it allows."""
    due = due_times(settings)
    topic_of = row_topic(settings.mqtt_topic)
    started = time.perf_counter()
    with tqdm(total=total, unit=" rows", disable=not settings.progress, smoothing=0.05,
              mininterval=0.5) as progress:
        for index, row in enumerate(rows):
            if publisher.stopping:
                break
            if due is not None:
                due_at = started + due(index, row)
                while (wait := due_at - time.perf_counter()) > 0 and not publisher.stopping:
                    publisher.pump(min(wait, 0.05))
            if not publisher.publish(topic_of(row), json.dumps(row)):
                break
            progress.update()
        unacknowledged = publisher.drain(settings.drain_timeout_s)
    return Summary(publisher.acked, publisher.failed, time.perf_counter() - started, unacknowledged,
                   publisher.set_aside, publisher.rerouted, publisher.stop_reason)
