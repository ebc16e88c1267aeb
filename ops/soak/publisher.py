"""The plant publishing its rows over MQTT, in a process of its own: the backfill of its past at the rate the soak
sets, then live, each machine's row at its own time.

A round is one row per machine, all of one event time (plus each machine's fixed phase within the live interval).
Rows go out at QoS 1 through the simulator's publisher (a window of unacknowledged rows, every return code checked,
reconnects that resend in order). For every round the process notes, once the broker acknowledged its last row,
when its first row went out and when that acknowledgement came (`rounds.jsonl`): the soak's check knows from it
which rows a SIGKILL of Mosquitto may have lost, and in `probes.jsonl`, the latency probe when each probe machine's row was sent.
"""
from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path

import numpy as np
import orjson

from pipeline_core.logs import configure_logging
from pipeline_core.settings import MqttSettings
from simulator.publisher import Publisher
from simulator.topics import THING_TOPIC_TEMPLATE, row_topic

from .clocks import ClockFault, Clocks
from .pace import backfill_step_ms
from .plant import Plant

log = logging.getLogger("soak.publisher")

ROUNDS_FILE = "rounds.jsonl"
PROBES_FILE = "probes.jsonl"
# In the backfill, the probe machines' rows of a round are timed at most this often (rounds come many a second).
PROBE_EVERY_S = 0.5
# Rows published ahead of their due time after a stall, at most: the rate limit does not catch up in a burst.
MAX_CATCH_UP_S = 1.0
DRAIN_DEADLINE_S = 900.0


@dataclass(frozen=True)
class PlantRun:
    """What the publishing process needs: picklable, as the process is spawned afresh."""

    machines: int
    axes: int
    seed: int
    probes: int
    names: tuple[str, ...]
    start_ms: int  # event time of the first round
    live_interval_ms: int
    max_step_ms: int
    run_dir: Path
    mqtt: MqttSettings
    client_id: str
    clock_faults: tuple[ClockFault, ...] = ()

    def machine_phase_ms(self) -> np.ndarray:
        """Each machine's fixed offset within a live interval: its rows are not all of one instant."""
        return (np.arange(self.machines) * self.live_interval_ms // self.machines).astype(np.int64)


class SharedState:
    """What the soak and the publishing process share: the rate and schedule the soak sets, the counts the
    publisher keeps (each a shared double)."""

    FIELDS = ("rate_rows_s", "backfill_end_s", "stop", "rows_sent", "rows_acked", "records_sent", "rounds_acked",
              "round", "event_ms", "live_since_s", "failed", "drained")

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self.values: dict[str, Synchronized] = {name: context.Value("d", 0.0, lock=False) for name in self.FIELDS}

    def __getattr__(self, name: str) -> float:
        values = self.__dict__.get("values")
        if values is None or name not in values:
            raise AttributeError(name)
        return values[name].value

    def set(self, name: str, value: float) -> None:
        self.values[name].value = value

    def add(self, name: str, value: float) -> None:
        self.values[name].value += value

    def snapshot(self) -> dict[str, float]:
        return {name: value.value for name, value in self.values.items()}


@dataclass
class _PendingRound:
    round_: int
    time_ms: int
    rows_end: int  # rows sent once this round's last row was
    records: int
    published_at: float
    clocks: dict[int, int]  # machine -> its clock's offset (ms) in this round, where it has one


class RoundPublisher(Publisher):
    """The simulator's publisher, noting when the broker acknowledged each round's last row (acknowledgements
    come in publish order on the one connection, and after a reconnect paho sends the unacknowledged rows again
    in that order)."""

    def __init__(self, settings: MqttSettings, client_id: str, log_file: Path, shared: SharedState) -> None:
        super().__init__(settings, client_id)
        self.pending: deque[_PendingRound] = deque()
        self.shared = shared
        self._log = log_file.open("ab", buffering=0)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        super()._on_publish(client, userdata, mid, reason_code, properties)
        while self.pending and self.acked >= self.pending[0].rows_end:
            done = self.pending.popleft()
            self._log.write(orjson.dumps({"round": done.round_, "time_ms": done.time_ms,
                                          "published_at": done.published_at, "acked_at": time.time(),
                                          "records": done.records,
                                          "clocks": {str(m): offset for m, offset in done.clocks.items()}}) + b"\n")
            self.shared.add("rounds_acked", 1)
        self.shared.set("rows_acked", self.acked)

    def close(self) -> None:
        super().close()
        self._log.close()


def run_plant(run: PlantRun, shared: SharedState) -> None:
    """The process's body: publish rounds until told to stop, then wait for every acknowledgement."""
    configure_logging()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the soak's to handle: it stops this process
    plant = Plant(run.machines, run.axes, run.seed, run.probes)
    names = list(run.names)
    quantities = plant.quantities
    phase_ms = run.machine_phase_ms().tolist()
    topic_of = row_topic(THING_TOPIC_TEMPLATE)
    topics = [topic_of({"Thing": name}) for name in names]
    probe_machines = set(plant.probe_machines)
    publisher = RoundPublisher(run.mqtt, run.client_id, run.run_dir / ROUNDS_FILE, shared)
    probe_log = (run.run_dir / PROBES_FILE).open("ab", buffering=0)
    probed_at = 0.0
    publisher.connect(deadline_s=60)
    machine_ids = np.arange(run.machines)
    clocks = Clocks(run.clock_faults)
    began = time.time()
    round_, event_ms = 0, run.start_ms
    due = time.monotonic()
    live = False
    while not shared.stop:
        values = plant.round_values(event_ms).tolist()
        present = plant.presence(machine_ids, round_).tolist()
        row_id = str(round_)
        published_at = time.time()
        offsets = clocks.offsets(published_at - began)
        probed = live or published_at - probed_at >= PROBE_EVERY_S
        probed_at = published_at if probed else probed_at
        records = 0
        for machine in range(run.machines):
            due_ms = event_ms + phase_ms[machine]
            stamp_ms = due_ms + offsets.get(machine, 0)
            if live:
                _wait_until(publisher, due_ms / 1000)
            else:
                rate = max(shared.rate_rows_s, 1.0)
                due = max(due + 1 / rate, time.monotonic() - MAX_CATCH_UP_S)
                _wait_until_monotonic(publisher, due)
            row = {"Thing": names[machine], "Timestamp": stamp_ms, "id": row_id}
            row_values = values[machine]
            for index, carried in enumerate(present[machine]):
                if carried:
                    row[quantities[index]] = row_values[index]
            records += len(row) - 3
            publisher.publish(topics[machine], orjson.dumps(row))
            if probed and machine in probe_machines:
                probe_log.write(orjson.dumps({"machine": machine, "time_ms": stamp_ms, "sent_at": time.time()}) + b"\n")
        publisher.pending.append(_PendingRound(round_, event_ms, publisher.sent, records, published_at, offsets))
        shared.set("rows_sent", publisher.sent)
        shared.add("records_sent", records)
        shared.set("round", round_)
        shared.set("event_ms", event_ms)
        publisher.pump(0)
        round_ += 1
        now_ms = int(time.time() * 1000)
        if not live:
            step_ms = backfill_step_ms(event_ms, now_ms, shared.backfill_end_s - time.time(),
                                       max(shared.rate_rows_s, 1.0), run.machines, run.live_interval_ms,
                                       run.max_step_ms)
            # Past its end the backfill stops where it is: the plant was offline until now (a gap in its past).
            if event_ms + step_ms + run.live_interval_ms >= now_ms or time.time() > shared.backfill_end_s:
                live = True
                shared.set("live_since_s", time.time())
                # Live: rounds at the interval's grid, from the first one after the backfill's last round.
                step_ms = max(run.live_interval_ms, math.ceil(now_ms / run.live_interval_ms) * run.live_interval_ms
                              - event_ms)
            event_ms += step_ms
        else:
            event_ms += run.live_interval_ms
    missing = publisher.drain(DRAIN_DEADLINE_S)
    shared.set("failed", publisher.failed)
    shared.set("drained", 0 if missing else 1)
    publisher.close()
    probe_log.close()
    log.info("published %d rows in %d rounds, %d failed", publisher.acked, round_, publisher.failed)


def _wait_until(publisher: Publisher, wall_s: float) -> None:
    """Handle acknowledgements until the wall clock reaches `wall_s`."""
    while (left := wall_s - time.time()) > 0:
        publisher.pump(min(left, 0.05))


def _wait_until_monotonic(publisher: Publisher, due: float) -> None:
    while (left := due - time.monotonic()) > 0:
        publisher.pump(min(left, 0.05))


def start(run: PlantRun) -> tuple[multiprocessing.Process, SharedState]:
    """The publishing process, started (spawned: none of the soak's threads or clients is inherited)."""
    context = multiprocessing.get_context("spawn")
    shared = SharedState(context)
    process = context.Process(target=run_plant, args=(run, shared), name="soak-plant", daemon=True)
    process.start()
    log.debug("plant publisher started as PID %d (soak PID %d)", process.pid, os.getpid())
    return process, shared
