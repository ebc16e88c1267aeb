"""The soak's view of the stack over time: every few seconds one sample of what the publisher did, what Kafka's
topics hold, each program's state, health, lag, memory and CPU time, and now and then the disk.

Samples are appended to `timeline.jsonl` in the run's folder as they are taken (a run stopped midway keeps what it
saw) and kept in memory for the soak's pace, progress line and checks.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from pipeline_core.broker_offsets import BrokerOffsets
from stack import manager
from stack.disk import directory_bytes
from stack.services import Service

from .resources import programs_usage, topic_bytes

log = logging.getLogger("soak.monitor")

TIMELINE_FILE = "timeline.jsonl"


class Monitor(threading.Thread):
    """Samples every `interval_s` (the disk every `disk_every` samples) until `stop`."""

    def __init__(self, services: Sequence[Service], topics: Mapping[str, int], offsets: BrokerOffsets,
                 run_dir: Path, publisher_state: Callable[[], dict[str, float]], extra_pids: Callable[[], dict[str, int]],
                 interval_s: float = 5.0, disk_every: int = 6, checkpoint_dirs: Sequence[Path] = (),
                 extra_stages: Callable[[], dict[str, dict[str, Any]]] = dict) -> None:
        super().__init__(name="soak-monitor", daemon=True)
        self.services = list(services)
        self.topics = dict(topics)  # topic -> partitions
        self.offsets = offsets
        self.publisher_state = publisher_state
        self.extra_pids = extra_pids
        self.interval_s = interval_s
        self.disk_every = disk_every
        self.checkpoint_dirs = list(checkpoint_dirs)
        self.extra_stages = extra_stages  # stages the stack does not run (a benchmark's), as services' entries
        self.samples: list[dict[str, Any]] = []
        self.stop_event = threading.Event()
        self._file = (run_dir / TIMELINE_FILE).open("ab")
        self._lock = threading.Lock()

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self.samples[-1] if self.samples else None

    def run(self) -> None:
        count = 0
        while not self.stop_event.is_set():
            began = time.monotonic()
            try:
                sample = self.sample(with_disk=count % self.disk_every == 0)
            except Exception as error:  # noqa: BLE001 - one failed sample must not end the soak's view
                log.warning("monitor: a sample failed (%s: %s)", type(error).__name__, error)
            else:
                with self._lock:
                    self.samples.append(sample)
                self._file.write(orjson.dumps(sample) + b"\n")
                self._file.flush()
            count += 1
            self.stop_event.wait(max(0.0, self.interval_s - (time.monotonic() - began)))
        self._file.close()

    def sample(self, with_disk: bool) -> dict[str, Any]:
        at = time.time()
        statuses = manager.status(self.services)
        services = {entry.name: {
            "state": entry.state, "pid": entry.pid, "healthy": entry.healthy, "restarts": entry.restarts.count,
            "lag": entry.stage.lag if entry.stage is not None else None,
            "stage_state": entry.stage.state if entry.stage is not None else None,
        } for entry in statuses}
        services.update(self.extra_stages())
        pids = {name: values["pid"] for name, values in services.items()}
        pids.update(self.extra_pids())
        usage = {name: {"rss_bytes": found.rss_bytes, "cpu_s": found.cpu_s, "processes": found.processes}
                 for name, found in programs_usage(pids).items()}
        ends = self.offsets.latest([(topic, partition) for topic, count in self.topics.items()
                                    for partition in range(count)])
        offsets = None if ends is None else {topic: sum(end for (name, _p), end in ends.items() if name == topic)
                                             for topic in self.topics}
        sample: dict[str, Any] = {"at": at, "publisher": self.publisher_state(), "offsets": offsets,
                                  "services": services, "usage": usage}
        if with_disk:
            sample["disk"] = self.disk()
        return sample

    def disk(self) -> dict[str, Any]:
        """Bytes of each server's data, each Kafka topic, and the Spark checkpoint."""
        data: dict[str, int] = {}
        log_dirs = []
        for service in self.services:
            folder = service.state_dir / "data"
            if service.name.startswith(("kafka", "influxdb", "mosquitto")) and folder.exists():
                data[service.name] = directory_bytes(folder)
                if service.name.startswith("kafka"):
                    log_dirs.append(folder)
        checkpoint = sum(directory_bytes(path) for path in self.checkpoint_dirs)
        return {"data": data, "topics": topic_bytes(log_dirs),
                "checkpoint": checkpoint if self.checkpoint_dirs else None,
                "checkpoint_files": sum(sum(len(files) for _root, _dirs, files in os.walk(path))
                                        for path in self.checkpoint_dirs) if self.checkpoint_dirs else None}

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=60)
