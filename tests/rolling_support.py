"""The rolling restart (`make rolling-restart`) under a replay, watched from outside: what the cluster's supervisord,
its metadata and the Spark master show every half second while it runs, and how long each join took to be readable
in machine.out.

Nothing here shares code with `stack.rolling`: each node is seen down (its program not running and gone from the
cluster's metadata, a worker from the master's list), back (a new process, listed again) and in sync again (every
partition led with its full ISR; a worker running an executor of the joiner's application), in that order, and never
two Kafka nodes away at once."""
from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
import xmlrpc.client
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException
from confluent_kafka.admin import AdminClient
from supervisor.xmlrpc import SupervisorTransport

from support import Message, read_topic, unique

POLL_S = 0.5


@dataclass
class NodeSeen:
    """What the watch saw of one program: its PID before, and when it was seen down, back and in sync (Unix s)."""

    name: str
    old_pid: int | None = None
    new_pid: int | None = None
    down_at: float | None = None
    back_at: float | None = None
    in_sync_at: float | None = None

    def describe(self, since: float) -> str:
        def at(moment: float | None) -> str:
            return "never" if moment is None else f"{moment - since:.0f} s"
        return (f"{self.name} seen down at {at(self.down_at)}, back at {at(self.back_at)} (pid {self.old_pid} -> "
                f"{self.new_pid}), in sync at {at(self.in_sync_at)}")


@dataclass
class Poll:
    """One look at the cluster."""

    programs: dict[str, tuple[str, int | None]]  # name -> (supervisord's state, pid)
    brokers: set[int] | None  # None: the metadata unanswered
    isr_complete: bool
    workers_alive: set[str]
    worker_executors: dict[str, int]  # worker -> executors of the joiner's application


class ClusterWatch(threading.Thread):
    """Looks at the cluster every POLL_S while the rolling restart runs (module docstring)."""

    def __init__(self, kafka_nodes: dict[str, int], workers: dict[str, int], socket_of: Callable[[str], Path],
                 bootstrap: str, security: dict[str, str], master_url: str | None) -> None:
        """`kafka_nodes`: program -> node id; `workers`: program -> web UI port (how the master lists it)."""
        super().__init__(name="cluster-watch", daemon=True)
        self.kafka_nodes, self.workers, self.socket_of = kafka_nodes, workers, socket_of
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **security})
        self.master_url = master_url
        self.seen = {name: NodeSeen(name) for name in [*kafka_nodes, *workers]}
        self.most_kafka_nodes_away = 0
        self.polls = 0
        self.done = threading.Event()
        first = self.poll()
        for name, node in self.seen.items():
            node.old_pid = first.programs[name][1]

    def _program(self, name: str) -> tuple[str, int | None]:
        transport = SupervisorTransport(None, None, f"unix://{self.socket_of(name)}")
        info = xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport).supervisor.getProcessInfo(name)
        return info["statename"], info["pid"] or None

    def poll(self) -> Poll:
        programs = {name: self._program(name) for name in self.seen}
        try:
            metadata = self.admin.list_topics(timeout=5)
            brokers = set(metadata.brokers)
            complete = all(partition.leader >= 0 and set(partition.isrs) == set(partition.replicas)
                           for topic in metadata.topics.values() for partition in topic.partitions.values())
        except KafkaException:
            brokers, complete = None, False
        alive, executors = set(), {}
        if self.workers and self.master_url:
            master = _json(f"{self.master_url}/json") or {}
            application = next((app["id"] for app in master.get("activeapps", []) if app.get("state") == "RUNNING"),
                               None)
            for worker in master.get("workers", []):
                name = next((name for name, port in self.workers.items()
                             if str(worker.get("webuiaddress", "")).endswith(f":{port}")), None)
                if name is None or worker.get("state") != "ALIVE":
                    continue
                alive.add(name)
                state = _json(f"{worker['webuiaddress']}/json") or {}
                executors[name] = sum(executor.get("appid") == application for executor in state.get("executors", []))
        return Poll(programs, brokers, complete, alive, executors)

    def run(self) -> None:
        while not self.done.wait(POLL_S):
            try:
                self.observe(self.poll(), time.time())
            except (OSError, xmlrpc.client.Error):
                continue  # a supervisord busy starting a JVM: asked again

    def observe(self, poll: Poll, now: float) -> None:
        self.polls += 1
        away = 0
        for name, node in self.seen.items():
            state, pid = poll.programs[name]
            if name in self.kafka_nodes:
                listed = poll.brokers is not None and self.kafka_nodes[name] in poll.brokers
                away += not listed or state != "RUNNING"
                synced = poll.isr_complete and listed
            else:
                listed = name in poll.workers_alive
                synced = poll.worker_executors.get(name, 0) > 0
            if node.down_at is None:
                if state != "RUNNING" and not listed:
                    node.down_at = now
            elif node.back_at is None:
                if state == "RUNNING" and pid not in (None, node.old_pid) and listed:
                    node.back_at, node.new_pid = now, pid
            elif node.in_sync_at is None and synced:
                node.in_sync_at = now
        if poll.brokers is not None:
            self.most_kafka_nodes_away = max(self.most_kafka_nodes_away, away)

    def caught_up(self, deadline_s: float) -> None:
        """Return once every node was seen in sync again, or at the deadline (the checks then say what was not seen):
        the rolling restart returns the moment its last node is in sync, which a poll of a loaded cluster (a dozen
        requests) may see a second or two later."""
        end = time.monotonic() + deadline_s
        while any(seen.in_sync_at is None for seen in self.seen.values()) and time.monotonic() < end:
            time.sleep(POLL_S)

    def stop(self) -> None:
        self.done.set()
        self.join(30)


def _json(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.load(answer)
    except (OSError, ValueError):
        return None


class LatencyWatch(threading.Thread):
    """Reads machine.out as it commits (read_committed, from its start), noting when each join became readable."""

    def __init__(self, bootstrap: str, security: dict[str, str]) -> None:
        super().__init__(name="latency-watch", daemon=True)
        self.bootstrap, self.security = bootstrap, security
        self.arrivals: list[tuple[float, bytes]] = []  # (Unix s, value)
        self.done = threading.Event()

    def run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": unique("latency-watch"),
                             "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                             "enable.auto.commit": False, "log_level": 0, **self.security})
        consumer.subscribe(["machine.out"])
        try:
            while not self.done.is_set():
                for message in consumer.consume(500, 0.2):
                    if message.error() is None:
                        self.arrivals.append((time.time(), message.value()))
        finally:
            consumer.close()

    def stop(self) -> None:
        self.done.set()
        self.join(60)


def join_delays(arrivals: Iterable[tuple[float, bytes]], data: list[Message]) -> list[tuple[float, float]]:
    """(Unix s readable, seconds) for each join: from the later of its two inputs' times in machine.data (their
    records' timestamps, set by the stream connector as it wrote them) until it was readable in machine.out."""
    written = {}
    for message in data:
        record = json.loads(message.value)
        written[(record["thing"], record["quantity"], record["phenomenonTime"])] = message.timestamp_ms / 1000
    delays = []
    for at, value in arrivals:
        join = json.loads(value)
        inputs = [written.get((join["thing"], join[side]["quantity"], join[side]["phenomenonTime"]))
                  for side in ("left", "right")]
        if None not in inputs:
            delays.append((at, at - max(inputs)))
    return delays


def delay_figures(delays: list[tuple[float, float]], start: float, end: float) -> str:
    """p50, p99 and the longest delay of the joins readable between `start` and `end`."""
    window = sorted(seconds for at, seconds in delays if start <= at < end)
    if not window:
        return "no joins"
    p99 = window[min(len(window) - 1, int(0.99 * len(window)))]
    return (f"{len(window)} joins, p50 {statistics.median(window):.2f} s, p99 {p99:.2f} s, "
            f"longest {window[-1]:.2f} s")


def delays_around(stack: object, _report: object) -> None:
    """`run_chaos`'s after-check of a rolling restart's run: the joins' delays before the restart, during it, during
    each of its steps and after it, into the rolling restart's document (`latency`; those during it each, in
    `join_delays_during_s`)."""
    watch: LatencyWatch = stack.latency  # type: ignore[attr-defined]
    watch.stop()
    data = read_topic(stack.bootstrap, "machine.data", security=stack.kafka_security,  # type: ignore[attr-defined]
                      deadline_s=300)
    delays = join_delays(watch.arrivals, data)
    document = stack.rollings[-1]  # type: ignore[attr-defined]
    steps = document["steps"]
    first, last = steps[0]["began_at"], steps[-1]["in_sync_at"]
    document["join_delays_during_s"] = [seconds for at, seconds in delays if first <= at < last]
    document["latency"] = {"before": delay_figures(delays, 0.0, first), "during": delay_figures(delays, first, last),
                           **{step["name"]: delay_figures(delays, step["began_at"], step["in_sync_at"])
                              for step in steps},
                           "after": delay_figures(delays, last, float("inf"))}
