"""The chaos run: a whole stack of its own, a synthetic replay with bad rows mixed in, a seeded
schedule of faults, and the checks of what the pipeline holds afterwards.

The stack runs as `make up` runs it (`python -m stack up`, every process under supervisord), on its
own ports and state folder, so a run never touches another stack on the machine. The run only
injects faults and observes: stages and servers come back by supervision alone.

Kafka and InfluxDB keep what they acknowledged through a SIGKILL, so nothing may be missing from
them. Mosquitto does not: it keeps its queues in memory and writes them to disk now and then
(02_mqtt_broker/README.md), so a SIGKILL loses the rows it acknowledged since its last save and had
not yet handed to the connector. The run accounts for exactly those: the publishers note when each
row's PUBACK came and on which connection, each kill notes the time of the broker's last save (its
database file's mtime), and a row may be missing only if the broker it was published to was killed
after acknowledging it and before saving again. Any other missing row fails the run.
"""
from __future__ import annotations

import base64
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import NewPartitions
from influxdb import InfluxDBClient

from connector_support import expected_records, read_rows
from db_connector_support import JSON_ANSWERS, expected_joined_points, expected_raw_points, wait_for_points
from fault_support import group_gone
from join_reference import reference_join
from pipeline_core import credentials
from pipeline_core.kafka_clients import admin_client, security_config
from pipeline_core.mqtt import DEVICE_CLIENT_ID
from pipeline_core.settings import MACHINE_STATES_TOPIC, KafkaSettings, MqttSettings, load_settings
from pipeline_core.stage_health import Heartbeat, read_heartbeat
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT
from rolling_support import ClusterWatch, LatencyWatch
from simulator.publisher import Publisher
from simulator.replay import publish_rows, selected_rows
from simulator.settings import SimulatorSettings
from simulator.synthetic import DEFAULT_START_MS
from stack.processes import parent_pid, process_state
from stack.topology import SINGLE_PORTS, private_ports
from stack.watchdog import WatchdogRestart, read_history
from support import Message, private_port_range, read_topic, wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVERS = ("kafka", "mosquitto", "influxdb")
DAY_MS = 24 * 3600 * 1000
# The JVM of one Spark executor, which a Spark worker starts as its child.
SPARK_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


@dataclass(frozen=True)
class ChaosPlan:
    """What one run replays and breaks; the same seed gives the same rows and the same schedule."""

    joiner: str  # lsb | spark
    rows: int
    machines: int
    rate: float  # rows/s of the replay
    seed: int = 20261124
    kills_per_stage: int = 2
    bad_rows: int = 40
    # What is done to each server, once each: kill (SIGKILL), restart (graceful).
    server_faults: tuple[str, ...] = ("kill", "restart")
    # Whether every fault must be confirmed before the replay's last row is due (a later one breaks nothing in
    # flight); the run fails at once otherwise, keeping the stack's logs.
    faults_in_replay: bool = False
    # How many runs used the stack before this one (`earlier` of run_chaos): its rows are other machines' a day
    # later, its bad rows numbered after theirs, so no row of it is one of theirs.
    run: int = 0

    @property
    def stages(self) -> tuple[str, ...]:
        return ("stream-connector", f"{self.joiner}-joiner", "db-connector")

    @property
    def max_rows_at_risk_per_mosquitto_kill(self) -> int:
        """The most rows (good and bad) one SIGKILL of Mosquitto may put at risk: those the replay publishes in
        twice MOSQUITTO_SAVE_WINDOW_S at its rate (its pace is absolute, so after a stall of its thread it
        catches up in a burst), and every bad row. An unlimited rate states no bound."""
        return math.ceil(2 * MOSQUITTO_SAVE_WINDOW_S * self.rate) + self.bad_rows if self.rate else self.rows


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the replay started
    # kill: SIGKILL to a stage's or a server's process group; kill-executor: SIGKILL to one executor JVM of the
    # Spark worker `target`, alone; stop / start / restart: a server, gracefully; await-stuck: no fault, a check
    # that `make status` calls the target stuck, saying why (polled until it does)
    action: str
    target: str


def fault_schedule(plan: ChaosPlan, replay_s: float) -> list[Fault]:
    """Each pipeline stage killed `kills_per_stage` times and each server broken once in each of
    `server_faults`' ways, at seeded moments in slots spread over 10-85% of the replay."""
    rng = random.Random(plan.seed)
    actions = ([("kill", stage) for stage in plan.stages for _ in range(plan.kills_per_stage)]
               + [(action, server) for server in SERVERS for action in plan.server_faults])
    rng.shuffle(actions)
    slot = 0.75 * replay_s / len(actions)
    return [Fault(round(0.10 * replay_s + i * slot + rng.uniform(0, 0.5 * slot), 1), action, target)
            for i, (action, target) in enumerate(actions)]


def bad_payloads(how_many: int, seed: int, first: int = 0) -> list[bytes]:
    """Rows the stream connector must dead-letter whole, numbered from `first`; each distinct, so each is found
    again."""
    rng = random.Random(seed)
    makers = [
        lambda n: b'{"Thing": "B%d", "Timestamp": ' % n,  # cut off
        lambda n: b"\xff\xfe not UTF-8 %d" % n,
        lambda n: json.dumps([n, "not an object"]).encode(),
        lambda n: json.dumps({"Timestamp": 1554076800000 + n, "actSpeed_C1": 1.0}).encode(),  # no Thing
        lambda n: b'{"Thing": "\\ud800B%d", "Timestamp": 1554076800000, "actSpeed_C1": 1.0}' % n,
        lambda n: json.dumps({"Thing": f"B{n}", "Timestamp": 1e20, "actSpeed_C1": 1.0}).encode(),
        lambda n: json.dumps({"Thing": f"B{n}", "Timestamp": "yesterday", "actSpeed_C1": 1.0}).encode(),
        lambda n: json.dumps({"Thing": f"B{n}", "Timestamp": 1554076800000, "id": "no quantity"}).encode(),
    ]
    return [makers[rng.randrange(len(makers))](n) for n in range(first, first + how_many)]


@dataclass(frozen=True)
class BrokerKill:
    """A SIGKILL of Mosquitto: when it was sent, and when the broker had last saved its database."""

    killed_at: float  # wall-clock seconds
    saved_at: float  # the database file's mtime once the broker was dead


# How long before a SIGKILL Mosquitto last saved, at most: the shipped `autosave_interval 1` saves every 2 s
# (02_mqtt_broker/README.md), and a save of a long queue takes up to 0.4 s; a second more for a loaded machine.
MOSQUITTO_SAVE_WINDOW_S = 3.0


@dataclass(frozen=True)
class Ack:
    """When a row's PUBACK reached its publisher, and when the connection it came on was made."""

    at: float  # wall-clock seconds
    connected_at: float


class AckTimedPublisher(Publisher):
    """The simulator's publisher, noting for each payload its PUBACK's time and connection.

    Callbacks run on the publishing thread: the old broker's last PUBACKs are handled before the
    connection's loss, so before the CONNACK of the next connection."""

    def __init__(self, settings: MqttSettings, client_id: str) -> None:
        super().__init__(settings, client_id)
        self.acks: dict[bytes, Ack] = {}
        self._payloads: dict[int, bytes] = {}  # by mid, until acknowledged
        self._connected_at = 0.0
        send = self.client.publish

        def publish_noting_mid(topic: str, payload: bytes | str, qos: int):
            info = send(topic, payload, qos=qos)
            self._payloads[info.mid] = payload.encode() if isinstance(payload, str) else payload
            return info

        self.client.publish = publish_noting_mid

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self._connected_at = time.time()
        super()._on_connect(client, userdata, flags, reason_code, properties)

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        super()._on_publish(client, userdata, mid, reason_code, properties)
        payload = self._payloads.pop(mid, None)
        if payload is not None:
            self.acks[payload] = Ack(time.time(), self._connected_at)


def lost_to_broker_kill(ack: Ack, kills: list[BrokerKill]) -> BrokerKill | None:
    """The kill that may have lost a row: one whose broker acknowledged it (on a connection made before
    the kill) after its last save. Rows acknowledged up to the save are in it; after the kill, the
    publisher is on a connection to the next broker."""
    return next((kill for kill in kills if ack.connected_at < kill.killed_at and ack.at > kill.saved_at), None)


@dataclass(frozen=True)
class WedgeOutcome:
    """A stage's loop wedged (fault injection) and what the watchdog did about it, in seconds after the wedge."""

    target: str
    old_pid: int
    new_pid: int
    stale_s: float  # `make status` called it stale (the watchdog's rule)
    decided_s: float  # the watchdog decided to restart it
    ended_s: float  # the old process group gone
    running_s: float  # the new process running
    healthy_s: float  # `make status` called the new process healthy (ready, and its heartbeat healthy)
    since_last_report_s: float  # from the wedged loop's last report until healthy again

    def describe(self) -> str:
        return (f"wedge {self.target}: heartbeat stopped with pid {self.old_pid} alive, stale at {self.stale_s:.0f} s, "
                f"the watchdog decided at {self.decided_s:.0f} s, old process group gone at {self.ended_s:.0f} s, "
                f"pid {self.new_pid} running at {self.running_s:.0f} s and healthy at {self.healthy_s:.0f} s "
                f"({self.since_last_report_s:.0f} s after the wedged loop's last report)")


@dataclass(frozen=True)
class StatusVerdict:
    fault: Fault  # the await-stuck check
    line: str  # `make status`'s line on the target
    after_s: float  # from the check's start until `make status` said it


# The ports each server listens on (the variables the stack reads them from): a stop counts once they are closed.
SERVER_PORTS = {
    "kafka": ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT"), "kafka-1": ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT"),
    "kafka-2": ("KAFKA_NODE2_PORT", "KAFKA_NODE2_CONTROLLER_PORT"),
    "kafka-3": ("KAFKA_NODE3_PORT", "KAFKA_NODE3_CONTROLLER_PORT"),
    "mosquitto": ("MQTT_PORT", "MQTT_TLS_PORT"), "influxdb": ("INFLUXDB_PORT", "INFLUXDB_RPC_PORT"),
}
# supervisorctl's exit status for `pid` of a program that is not running.
NOT_RUNNING = 7


class PrivateStack:
    """`python -m stack` with its own state folder and ports (from CLUSTER_TEST_PORTS when set, else any free
    ones): the servers and the pipeline.

    Every fault it injects is confirmed before it counts: supervisorctl's exit status and answer, and then the
    process group gone (a kill, a stop, a restart) and the server's ports closed (a stop). `confirmed` lists
    what was confirmed, one line per fault."""

    def __init__(self, state_dir: Path, joiner: str) -> None:
        self.state_dir = state_dir
        ports = private_ports(SINGLE_PORTS, private_port_range())
        self.bootstrap = f"127.0.0.1:{ports['KAFKA_PORT']}"
        self.assigned_ports = dict(ports)
        self.env = {**os.environ, **{name: str(port) for name, port in ports.items()},
                    "STACK_STATE_DIR": str(state_dir), "JOINER": joiner, "TOPOLOGY": "single",
                    "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap}
        self.mqtt = MqttSettings(mqtt_port=ports["MQTT_PORT"])
        self.influxdb_port = ports["INFLUXDB_PORT"]
        self.broker_kills: list[BrokerKill] = []
        self.verdicts: list[StatusVerdict] = []  # what `make status` said at the await-stuck checks
        self.wedges: list[WedgeOutcome] = []
        self.rollings: list[dict[str, Any]] = []  # `make rolling-restart --json`'s documents, with what was seen
        self.latency: LatencyWatch | None = None
        self.confirmed: list[str] = []
        self.grown: list[tuple[str, int, float]] = []  # topics grown: (topic, partitions, Unix time)
        self.growth_watch = None  # after machine.data grew: its recovery (growth_support.GrowthWatch)
        # Spec files applied: (file, partition -> offset from which the specs added join, Unix time)
        self.spec_changes: list[tuple[Path, dict[int, int], float]] = []
        # What machine.out must hold for machine.data's records; the shipped spec's offline join unless a test says
        # otherwise (its specs changed: spec_change_support).
        self.expected_joins: Callable[[list[Message]], Counter[str]] = offline_join

    def stack(self, *args: str, timeout_s: float = 600, check: bool = True) -> str:
        done = subprocess.run([sys.executable, "-m", "stack", *args], env=self.env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise AssertionError(f"python -m stack {' '.join(args)} failed ({done.returncode}):\n"
                                 f"{done.stdout}{done.stderr}")
        return done.stdout

    def _supervisorctl(self, *args: str) -> subprocess.CompletedProcess:
        config = self.state_dir / "supervisor" / "supervisord.conf"
        return subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(config), *args],
                              env=self.env, capture_output=True, text=True, timeout=180)

    def supervisorctl(self, *args: str) -> str:
        """supervisorctl's answer; fails unless it exited with 0."""
        done = self._supervisorctl(*args)
        if done.returncode != 0:
            raise AssertionError(f"supervisorctl {' '.join(args)} failed ({done.returncode}): "
                                 f"{done.stdout.strip()} {done.stderr.strip()}")
        return done.stdout.strip()

    def running_pid(self, name: str) -> int:
        """The PID of `name` if it runs now, else 0."""
        done = self._supervisorctl("pid", name)
        answer = done.stdout.strip()
        if done.returncode == NOT_RUNNING and answer == "0":
            return 0
        if done.returncode != 0 or not answer.isdigit():
            raise AssertionError(f"supervisorctl pid {name} failed ({done.returncode}): {answer} {done.stderr}")
        return int(answer)

    def pid(self, name: str) -> int:
        """The PID of a running program; waits while supervision (re)starts it."""
        return wait_for(lambda: self.running_pid(name), 300, f"{name} running under supervision", interval_s=0.5)

    def ports(self, name: str) -> list[int]:
        """The ports the server `name` is configured with (none for a pipeline stage)."""
        return [self.assigned_ports[variable] for variable in SERVER_PORTS.get(name, ())
                if variable in self.assigned_ports]

    def inject(self, fault: Fault) -> None:
        if fault.action == "await-stuck":
            began = time.monotonic()
            line = wait_for(lambda: self.stuck_line(fault.target), 300, f"make status to call {fault.target} stuck",
                            interval_s=1.0)
            self.verdicts.append(StatusVerdict(fault, line, time.monotonic() - began))
            self.confirmed.append(f"await-stuck {fault.target}: make status said so")
        elif fault.action == "kill":
            # The stage and its children (Spark's JVM). A stage that exited by itself between reading its PID
            # and the kill is killed once supervision has started it again.
            wait_for(lambda: self._kill(fault.target), 300, f"{fault.target} killed", interval_s=0.5)
        elif fault.action == "kill-executor":
            # None runs while the worker or the driver starts again (their executors went with them): the kill
            # waits for the next one.
            wait_for(lambda: self._kill_executor(fault.target), 300, f"an executor of {fault.target} killed",
                     interval_s=0.5)
        elif fault.action == "wedge":
            self.wedge(fault.target)
        elif fault.action == "watch-latency":
            self.latency = LatencyWatch(self.bootstrap, self.kafka_security)
            self.latency.start()
            self.confirmed.append("watch-latency: reading machine.out as it commits")
        elif fault.action == "rolling-restart":
            self.rolling_restart()
        elif fault.action == "stop":
            self.stop(fault.target)
        elif fault.action == "start":
            self.start(fault.target)
        elif fault.action == "restart":
            self.restart(fault.target)
        elif fault.action in ("grow", "make-grow"):
            self.grow(fault)
        elif fault.action == "specs":
            self.change_specs(fault)
        elif fault.action == "specs-refused":
            self.refuse_specs(fault)
        else:
            raise AssertionError(f"no such fault: {fault.action}")

    def change_specs(self, fault: Fault) -> None:
        """Another join-spec file applied by `python -m stack specs` (what `make specs` runs), confirmed by its
        output: the specs it changed, and the offsets from which the specs added join (each partition it names;
        the others from their beginning)."""
        said = self.stack("specs", fault.target, timeout_s=900)
        offsets = re.search(r"from its committed offsets \(([^)]*)\)", said)
        assert offsets is not None or "from its beginning" in said, said
        starts = {int(partition): int(offset.replace(",", "")) for partition, offset in
                  (entry.split(": ") for entry in (offsets.group(1).split(", ") if offsets else []))}
        assert "running again with" in said and "healthy" in said, said
        self.spec_changes.append((Path(fault.target), starts, time.time()))
        self.confirmed.append(f"specs {Path(fault.target).name}: " + " / ".join(said.strip().splitlines()))

    def refuse_specs(self, fault: Fault) -> None:
        """A spec file with an error given to `python -m stack specs`: refused, naming the error, with nothing
        stopped (every joiner process keeps its PID)."""
        services = json.loads(self.stack("status", "--json", timeout_s=300))["services"]
        joiners = [service["name"] for service in services if "joiner" in service["name"]]
        before = {name: self.running_pid(name) for name in joiners}
        done = subprocess.run([sys.executable, "-m", "stack", "specs", fault.target], env=self.env, cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode != 0 and "refused, nothing was stopped" in done.stderr, done.stdout + done.stderr
        assert {name: self.running_pid(name) for name in joiners} == before
        self.confirmed.append(f"specs-refused {Path(fault.target).name}: {done.stderr.strip()}")

    def grow(self, fault: Fault) -> None:
        """Partitions added to a topic (target `topic=count`): by the admin API as any operator tool does it (grow),
        or by `python -m stack grow` (make-grow); confirmed by the count Kafka gives back."""
        topic, count = fault.target.split("=")
        admin = admin_client(self.bootstrap, **self.kafka_security)
        before = len(admin.list_topics(topic, timeout=30).topics[topic].partitions)
        self.grown.append((topic, int(count), time.time()))
        if fault.action == "grow":
            (future,) = admin.create_partitions([NewPartitions(topic, int(count))], request_timeout=30).values()
            future.result(30)
            said = "admin API"
        else:
            said = self.stack("grow", topic, count, timeout_s=900).strip().replace("\n", " / ")
        after = wait_for(lambda: (n := len(admin.list_topics(topic, timeout=30).topics[topic].partitions))
                         == int(count) and n, 60, f"{topic} to show {count} partitions")
        self.confirmed.append(f"{fault.action} {topic}: {before} -> {after} partitions ({said})")
        if topic == MACHINE_DATA.name:
            from growth_support import GrowthWatch
            self.growth_watch = GrowthWatch(self.state_dir, self.grown[-1][2], int(count))
            self.growth_watch.start()

    def stop(self, *names: str) -> None:
        """Stops each program gracefully; confirmed by supervisorctl, its process group gone, its ports closed."""
        pids = {name: self.running_pid(name) for name in names}
        assert all(pids.values()), f"a stop of what does not run is no fault: {pids}"
        listening = {name: [port for port in self.ports(name) if port_open(port)] for name in names}
        for name in names:
            assert not self.ports(name) or listening[name], f"{name} listened on none of {self.ports(name)}"
        answer = self.supervisorctl("stop", *names)
        for name in names:
            assert f"{name}: stopped" in answer.splitlines(), f"supervisorctl stop {name}: {answer}"
            wait_for(lambda: group_gone(pids[name]), 60, f"every process of {name} (group {pids[name]}) gone")
            wait_for(lambda: not any(port_open(port) for port in listening[name]), 60,
                     f"{name}'s ports {listening[name]} closed")
            assert self.running_pid(name) == 0, f"{name} runs again after its stop"
            self.confirmed.append(f"stop {name}: process group {pids[name]} gone, ports {listening[name]} closed")

    def start(self, *names: str) -> None:
        """Starts each stopped program; confirmed by supervisorctl and a running process."""
        answer = self.supervisorctl("start", *names)
        for name in names:
            assert f"{name}: started" in answer.splitlines(), f"supervisorctl start {name}: {answer}"
            pid = self.running_pid(name)
            assert pid > 0 and not group_gone(pid), f"{name} not running after its start"
            self.confirmed.append(f"start {name}: running as {pid}")

    def restart(self, name: str) -> None:
        """Stops and starts a program gracefully; confirmed by supervisorctl, the old process group gone and a
        new process running."""
        old = self.pid(name)
        answer = self.supervisorctl("restart", name).splitlines()
        assert f"{name}: stopped" in answer and f"{name}: started" in answer, f"supervisorctl restart {name}: {answer}"
        wait_for(lambda: group_gone(old), 60, f"every process of {name}'s old process group {old} gone")
        new = self.running_pid(name)
        assert new not in (0, old), f"{name} after its restart: PID {new} (before {old})"
        self.confirmed.append(f"restart {name}: process group {old} gone, running as {new}")

    def wedge(self, name: str) -> WedgeOutcome:
        """Wedges the loop of stage `name` (fault injection: SIGUSR2 to the process that writes its heartbeat, on a
        stack started with PIPELINE_WEDGE_ON_SIGUSR2) and waits until the watchdog has ended it and started it again.
        Confirmed: its heartbeat stopped while the process lived on (running or sleeping, its program's PID the same)
        until it was stale by `make status`'s rule, then the old process group went, a new process ran and reported healthy, the
        watchdog's record names the old process, and its log holds the threads' stacks and the watchdog's line."""
        progress = self.state_dir / name / "progress.json"
        pid = self.pid(name)

        def own_heartbeat() -> Heartbeat | None:
            beat = read_heartbeat(progress)
            return beat if beat is not None and pid in (beat.pid, parent_pid(beat.pid)) else None

        beat = wait_for(own_heartbeat, 300, f"a heartbeat of {name}'s process {pid}", interval_s=0.5)
        restarts_before = self.status_of(name)["restarts"]
        os.kill(beat.pid, signal.SIGUSR2)
        wedged_at = time.time()

        def stale_alive() -> Heartbeat | None:
            """The heartbeat once older than `make status`'s stale time (3 intervals and 5 s) with its process
            alive: not gone, no zombie, not stopped, and still the program's."""
            latest = read_heartbeat(progress)
            if latest is None or latest.pid != beat.pid or time.time() - latest.reported_at <= 3 * latest.interval_s + 5:
                return None
            alive = process_state(beat.pid) in ("R", "S", "D") and self.running_pid(name) == pid
            return latest if alive else None

        last = wait_for(stale_alive, 120, f"{name}'s heartbeat stale with its process {beat.pid} alive",
                        interval_s=0.2)
        stale_s = time.time() - wedged_at
        new_pid = wait_for(lambda: (now := self.running_pid(name)) not in (0, pid) and now, 300,
                           f"the watchdog to start {name} again", interval_s=0.2)
        running_s = time.time() - wedged_at
        wait_for(lambda: group_gone(pid), 60, f"every process of {name}'s old process group {pid} gone")
        ended_s = time.time() - wedged_at

        # A Spark driver's start took minutes on a machine at a load of 60, and its successor failed its first start
        # there (Spark's Python workers not connecting back in time) before supervision started it again: healthy
        # again is the stage's, by a process after the wedged one.
        wait_for(lambda: (entry := self.status_of(name))["pid"] not in (None, pid) and entry["health"] == "healthy",
                 900, f"make status to call {name} healthy again after its process {pid}", interval_s=0.2)
        healthy_at = time.time()
        history = self.state_dir / "supervisor" / "watchdog.jsonl"
        record = wait_for(lambda: next((r for r in read_history(history) if r.pid == pid), None), 60,
                          f"the watchdog's record of ending {name}'s process {pid}")
        assert record.new_pid == new_pid and record.error is None, record
        # Not before it was stale: a slow loop is not ended.
        assert record.heartbeat_age_s > 3 * last.interval_s + 5, record
        log_text = (self.state_dir / name / f"{name}.log").read_text(errors="replace")
        assert f"ending pid {pid} " in log_text and "most recent call first" in log_text, \
            f"{name}'s log lacks the watchdog's line or the threads' stacks"
        outcome = WedgeOutcome(name, pid, new_pid, stale_s, record.time - wedged_at, ended_s, running_s,
                               healthy_at - wedged_at, healthy_at - last.reported_at)
        self.wedges.append(outcome)
        self.watchdog_shown(name, record, restarts_before)
        self.confirmed.append(outcome.describe())
        return outcome

    def rolling_restart(self) -> dict[str, Any]:
        """`make rolling-restart` (`python -m stack rolling-restart --json`), watched from outside (rolling_support):
        confirmed when each Kafka node, then each Spark worker, was seen down, back as a new process and in sync
        again, each after the one before was in sync, and never two Kafka nodes away at once."""
        nodes = {f"kafka-{n}": n for n in (1, 2, 3)}
        workers = {f"spark-worker-{n}": self.worker_ui_port(n) for n in (1, 2)} if self.env["JOINER"] == "spark" else {}
        watch = ClusterWatch(nodes, workers, self.socket_of, self.bootstrap, self.kafka_security, self.spark_master_url())
        watch.start()
        try:
            document = json.loads(self.stack("rolling-restart", "--json", timeout_s=3600).strip().splitlines()[-1])
            watch.caught_up(60)
        finally:
            watch.stop()
        steps = document["steps"]
        assert [step["name"] for step in steps] == [*nodes, *workers], steps
        assert watch.most_kafka_nodes_away == 1, f"{watch.most_kafka_nodes_away} Kafka nodes seen away at once"
        began = steps[0]["began_at"]
        previous_in_sync = began
        for step in steps:
            seen = watch.seen[step["name"]]
            assert None not in (seen.down_at, seen.back_at, seen.in_sync_at), seen.describe(began)
            assert previous_in_sync <= seen.down_at < seen.back_at <= seen.in_sync_at, seen.describe(began)
            assert seen.old_pid == step["old_pid"] and seen.new_pid == step["new_pid"] != seen.old_pid, \
                (seen.describe(began), step)
            previous_in_sync = seen.in_sync_at
        document["seen"] = [watch.seen[step["name"]].describe(began) for step in steps]
        self.rollings.append(document)
        self.confirmed.append(f"rolling-restart in {document['took_s']:.0f} s: " + "; ".join(document["seen"])
                              + f" (polled {watch.polls} times, at most one Kafka node away at once)")
        return document

    def socket_of(self, name: str) -> Path:
        """The socket of the supervisord that runs program `name`."""
        return self.state_dir / "supervisor" / "supervisor.sock"

    def spark_master_url(self) -> str:
        host = self.env.get("SPARK_MASTER_HOST", self.env.get("SPARK_LOCAL_IP", "127.0.0.1"))
        # The stack's own port, else the one its environment gave it (across hosts the inherited one), else Spark's.
        port = self.assigned_ports.get("SPARK_MASTER_WEBUI_PORT") or self.env.get("SPARK_MASTER_WEBUI_PORT", 8080)
        return f"http://{host}:{port}"

    def worker_ui_port(self, index: int) -> int:
        return self.assigned_ports.get(f"SPARK_WORKER{index}_WEBUI_PORT", 8080 + index)

    def status_of(self, name: str) -> dict[str, Any]:
        """`make status JSON=1`'s entry of `name`."""
        document = json.loads(self.stack("status", "--json"))
        return next(service for service in document["services"] if service["name"] == name)

    def watchdog_shown(self, name: str, record: WatchdogRestart, restarts_before: int) -> None:
        """The watchdog's restart of `name` (`record`) where an operator looks: `make status` counts it apart from
        supervisord's restarts and shows it with the threads' stacks from its log, and the stage's health points in
        InfluxDB count it (field watchdog_restarts)."""
        wedges = sum(outcome.target == name for outcome in self.wedges)
        entry = self.status_of(name)
        assert entry["watchdog_restarts"] == wedges and entry["restarts"] == restarts_before, entry
        assert entry["watchdog_latest"]["pid"] == record.pid and entry["watchdog_latest"]["new_pid"] == record.new_pid
        text = self.stack("status")
        shown = text.split(f"watchdog: {name} restarted by the watchdog", 1)
        assert len(shown) == 2 and "most recent call first" in shown[1] and "block_if_armed" in shown[1], text
        query = ('SELECT last("watchdog_restarts") FROM "health"."pipeline_health" '
                 f"WHERE \"instance\" = '{name}' AND time > now() - 1h")
        wait_for(lambda: [point["last"] for point in self.influx().query(query).get_points()] == [wedges], 60,
                 f"{wedges} watchdog restarts of {name} in InfluxDB", interval_s=2.0)

    def stuck_line(self, name: str) -> str | None:
        """`make status`'s verdict line on `name` when it calls it stuck, else None."""
        lines = self.stack("status", check=False).splitlines()
        return next((line for line in lines if line.startswith(f"stuck: {name}:")), None)

    def _kill(self, name: str) -> bool:
        pid = self.pid(name)
        killed_at = time.time()
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        # Dead (gone, or a zombie until supervisord reaps it), it does nothing more.
        wait_for(lambda: group_gone(pid), 60, f"every process of {name} (group {pid}) gone", interval_s=0.02)
        if name == "mosquitto":
            # Its database file is the last save it completed (a save writes a new file and renames it).
            database = self.state_dir / "mosquitto" / "data" / "mosquitto.db"
            assert database.exists(), f"Mosquitto killed without ever having saved: no {database}"
            self.broker_kills.append(BrokerKill(killed_at, database.stat().st_mtime_ns / 1e9))
        self.confirmed.append(f"kill {name}: process group {pid} gone")
        return True

    def _kill_executor(self, worker: str) -> bool:
        """SIGKILL to one executor JVM in the process tree of the Spark worker `worker`, not to the worker: its
        master has another started in its place. Confirmed by the executor gone and the worker still running."""
        worker_pid = self.pid(worker)
        # Of an application the master runs: not one that goes anyway, its driver gone.
        applications = self.spark_applications()
        executors = [(pid, arguments) for pid in descendants(worker_pid) for arguments in [command_line(pid)]
                     if SPARK_EXECUTOR_CLASS in arguments and _argument(arguments, "--app-id") in applications
                     and not _dead(pid)]
        if not executors:
            return False
        pid, arguments = executors[0]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        wait_for(lambda: _dead(pid), 60, f"{worker}'s executor {pid} gone", interval_s=0.02)
        assert self.running_pid(worker) == worker_pid, f"{worker} ({worker_pid}) went with its executor {pid}"
        executor = " ".join(_argument(arguments, flag) for flag in ("--app-id", "--executor-id"))
        self.confirmed.append(f"kill-executor {worker}: executor {executor} (PID {pid}) gone, "
                              f"worker {worker_pid} still running")
        return True

    def spark_applications(self) -> set[str]:
        """The ids of the applications the stack's Spark master runs (none while it does not answer)."""
        url = f"{self.spark_master_url()}/json"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                state = json.load(answer)
        except (OSError, ValueError):
            return set()
        return {app["id"] for app in state.get("activeapps", []) if app.get("state") == "RUNNING"}

    def credentials(self) -> dict[str, str]:
        """The stack's credentials file, which `up` makes when the stack is secure (always on the cluster)."""
        return credentials.read_credentials(self.state_dir / "credentials.env")

    def environ_for(self, principal: str) -> dict[str, str]:
        """The stack's environment with `principal`'s identity on it, when the stack is secure."""
        values = self.credentials()
        return {**self.env, **credentials.environment(principal, values)} if values else dict(self.env)

    @property
    def kafka_security(self) -> dict[str, str]:
        """The admin's Kafka client settings (empty when the stack is not secure): the tests read every topic."""
        return security_config(load_settings(KafkaSettings, [], environ=self.environ_for("admin")))

    def simulator_settings(self, *args: str) -> SimulatorSettings:
        return load_settings(SimulatorSettings, ["--no-progress", *args], environ=self.environ_for("device"))

    def influx(self) -> InfluxDBClient:
        environ = self.environ_for("reader")
        return InfluxDBClient("127.0.0.1", self.influxdb_port, database="machinedata", timeout=30,
                              username=environ.get("INFLUXDB_USERNAME"), password=environ.get("INFLUXDB_PASSWORD"),
                              headers=dict(JSON_ANSWERS))


def _dead(pid: int) -> bool:
    return process_state(pid) in (None, "Z", "X")  # None: gone, reaped


def descendants(pid: int) -> list[int]:
    """The processes in the process tree under `pid`, children first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        parent = parent_pid(int(entry.name))
        if parent is not None:  # None: exited meanwhile
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], list(children.get(pid, []))
    while pending:
        child = pending.pop(0)
        found.append(child)
        pending += children.get(child, [])
    return found


def command_line(pid: int) -> list[str]:
    """The arguments `pid` was started with (none once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError):
        return []


def _argument(arguments: list[str], flag: str) -> str:
    """The value after `flag` in a command line, or "?"."""
    return arguments[arguments.index(flag) + 1] if flag in arguments[:-1] else "?"


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class RowPublisher(threading.Thread):
    """The simulator's replay of an events file, in this process so that each row's PUBACK is timed."""

    def __init__(self, settings: SimulatorSettings, client_id: str = "chaos-rows", bad: list[bytes] | None = None,
                 bad_every: int = 1) -> None:
        """`bad`: payloads published on the same connection, one after every `bad_every` rows (a secure stack's
        device has one client id, so the bad rows cannot come from a second connection)."""
        super().__init__(name="rows", daemon=True)
        self.settings = settings
        self.publisher = AckTimedPublisher(settings, client_id)
        self.error: BaseException | None = None
        self.mixed_bad = len(bad or [])
        if bad:
            pending, publish_row, rows = list(bad), self.publisher.publish, [0]

            def publish_mixing_bad_rows(topic: str, payload: bytes | str) -> bool:
                # The replay stops at the first row that did not go out, so the answer is the publisher's.
                if not publish_row(topic, payload):
                    return False
                rows[0] += 1
                if pending and rows[0] % bad_every == 0:
                    return publish_row(MACHINE_STATES_TOPIC, pending.pop(0))
                return True

            self.publisher.publish = publish_mixing_bad_rows
            self.unpublished_bad = pending

    def run(self) -> None:
        try:
            self.publisher.connect(deadline_s=30)
            rows, total = selected_rows(self.settings)
            summary = publish_rows(self.publisher, self.settings, rows, total)
            if summary.failures or summary.rows != total + self.mixed_bad:  # the publisher counts the bad rows too
                raise AssertionError(f"the broker did not acknowledge every row: {summary}")
            self.publisher.close()
        except BaseException as error:  # the test thread reports it
            self.error = error


class BadRowPublisher(threading.Thread):
    """Publishes the bad rows at QoS 1 spread over the replay, riding out broker restarts."""

    def __init__(self, settings: MqttSettings, payloads: list[bytes], spread_s: float) -> None:
        super().__init__(name="bad-rows", daemon=True)
        self.settings, self.payloads, self.spread_s = settings, payloads, spread_s
        self.publisher = AckTimedPublisher(settings, "chaos-bad-rows")
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            publisher = self.publisher
            publisher.connect(deadline_s=30)
            pause_s = self.spread_s / max(1, len(self.payloads))
            for payload in self.payloads:
                publisher.publish(MACHINE_STATES_TOPIC, payload)
                resume = time.monotonic() + pause_s
                while time.monotonic() < resume:
                    publisher.pump(0.05)
            if publisher.drain(deadline_s=300):
                raise AssertionError("the broker did not acknowledge every bad row")
            publisher.close()
        except BaseException as error:  # the test thread reports it
            self.error = error


@dataclass(frozen=True)
class Published:
    """What runs on a stack published: each good row's payload with its records, the bad rows, and the rows a SIGKILL
    of Mosquitto put at risk. A run on a stack that earlier runs used (`run_chaos`'s `earlier`) checks the topics and
    InfluxDB, which hold theirs too, against all of it: every row of every run, every join of all of machine.data."""

    rows: dict[bytes, set[str]]
    bad: list[bytes]
    at_risk: set[bytes]

    def to_json(self) -> str:
        encode = lambda payload: base64.b64encode(payload).decode()  # noqa: E731
        return json.dumps({"rows": {encode(payload): sorted(records) for payload, records in self.rows.items()},
                           "bad": [encode(payload) for payload in self.bad],
                           "at_risk": sorted(encode(payload) for payload in self.at_risk)})

    @classmethod
    def from_json(cls, text: str) -> Published:
        document = json.loads(text)
        return cls({base64.b64decode(payload): set(records) for payload, records in document["rows"].items()},
                   [base64.b64decode(payload) for payload in document["bad"]],
                   {base64.b64decode(payload) for payload in document["at_risk"]})


NOTHING_PUBLISHED = Published({}, [], set())


@dataclass
class ChaosReport:
    plan: ChaosPlan
    faults: list[Fault] = field(default_factory=list)
    injected_s: list[float] = field(default_factory=list)  # when each fault was confirmed, after the replay began
    confirmed: list[str] = field(default_factory=list)  # each fault as the stack confirmed it
    replay_s: float = 0.0
    settle_s: float = 0.0
    records: int = 0
    joins: int = 0
    dead_letters: int = 0
    broker_kills: list[BrokerKill] = field(default_factory=list)
    # Rows (good and bad, as published) a SIGKILL of Mosquitto lost: acknowledged by it after its last save.
    lost_to_broker_kills: list[bytes] = field(default_factory=list)
    # Rows acknowledged in such a window (each may have been lost; those not lost arrived).
    at_risk_in_broker_kills: int = 0
    verdicts: list[StatusVerdict] = field(default_factory=list)  # of the await-stuck checks
    joiner_log: str = ""  # the joiner's log, as the run left it
    published: Published = NOTHING_PUBLISHED  # by this run and the earlier ones on its stack

    def summary(self) -> str:
        done = [f" (done @{at_s:.0f}s)" for at_s in self.injected_s] + [""] * len(self.faults)
        faults = ", ".join(f"{f.action} {f.target} @{f.at_s:.0f}s{done[n]}" for n, f in enumerate(self.faults))
        windows = ", ".join(f"{kill.killed_at - kill.saved_at:.1f} s" for kill in self.broker_kills)
        return (f"chaos JOINER={self.plan.joiner}: {self.plan.rows} rows of {self.plan.machines} machines "
                f"+ {self.plan.bad_rows} bad rows at {self.plan.rate:.0f} rows/s; replay {self.replay_s:.0f} s, "
                f"all settled {self.settle_s:.0f} s later; machine.data {self.records} records, "
                f"machine.out {self.joins} joins, "
                f"machine.dlq {self.dead_letters}; Mosquitto SIGKILLed or lost with its host: {len(self.broker_kills)} "
                f"(last save before each: {windows or '-'} earlier; a lost host's counts the whole save window), "
                f"rows acknowledged since that save "
                f"{self.at_risk_in_broker_kills}, of which lost {len(self.lost_to_broker_kills)}"
                f"{': ' + self.lost_rows() if self.lost_to_broker_kills else ''} (at most "
                f"{self.plan.max_rows_at_risk_per_mosquitto_kill} at risk per kill allowed); faults: {faults}; "
                f"confirmed: {'; '.join(self.confirmed) or '-'}"
                + "".join(f"; {verdict.after_s:.0f} s after {verdict.fault.at_s:.0f}s make status said '{verdict.line}'"
                          for verdict in self.verdicts))

    def lost_rows(self) -> str:
        """The lost rows by machine and time (a bad row by its first bytes), the first 20."""
        def name(payload: bytes) -> str:
            try:
                row = json.loads(payload)
                return f"{row['Thing']}@{row['Timestamp']}"
            except (ValueError, KeyError, TypeError):
                return repr(payload[:30])
        lost = [name(payload) for payload in self.lost_to_broker_kills]
        return ", ".join(lost[:20]) + (f" and {len(lost) - 20} more" if len(lost) > 20 else "")


def only_the_wedged_were_restarted(stack: PrivateStack, _report: ChaosReport) -> None:
    """`run_chaos`'s after-check of a run with wedges: the watchdog restarted those stages, once each, and nothing
    else (not a stage waiting for a server, not one starting)."""
    history = read_history(stack.state_dir / "supervisor" / "watchdog.jsonl")
    restarted = [(record.process, record.pid) for record in history]
    assert restarted == [(wedge.target, wedge.old_pid) for wedge in stack.wedges], restarted


def chaos_workdir(name: str) -> Path:
    """A folder for one run, kept when the run fails (its stack's logs say what happened); not under
    pytest's own, which later test sessions rotate away."""
    return Path(tempfile.mkdtemp(prefix=f"{name}-"))


def canonical(value: bytes | dict[str, Any]) -> str:
    record = json.loads(value) if isinstance(value, bytes) else value
    return json.dumps(record, sort_keys=True)


def offline_join(messages: list[Message]) -> Counter[str]:
    """The join's outputs by its definition (join_reference, no code of either joiner) over machine.data as it
    lies in Kafka: each stream in partition order, and after the topic grew, a thing's records placed by the earlier
    partition count (in its old partition) before those placed by the later one (its writer switched once the
    joiners had read the old ones)."""
    records = [json.loads(message.value)
               for message in sorted(messages, key=lambda m: (m.placed_by, m.partition, m.offset))]
    return Counter(canonical(output) for output in reference_join(records))


def dead_lettered_payloads(messages: list[Message]) -> list[bytes]:
    """The original payloads in machine.dlq's envelopes, as the bytes that were sent."""
    payloads = []
    for message in messages:
        envelope = json.loads(message.value)
        if "payloadBase64" in envelope:
            payloads.append(base64.b64decode(envelope["payloadBase64"]))
        else:
            payloads.append(envelope.get("payload", "").encode("utf-8", "surrogatepass"))
    return payloads


def run_chaos(plan: ChaosPlan, workdir: Path, faults: list[Fault] | None = None,
              stack_class: type[PrivateStack] = PrivateStack, keep_workdir: bool = False,
              running: bool = False, earlier: Published = NOTHING_PUBLISHED, keep_running: bool = False,
              after: Callable[[PrivateStack, ChaosReport], None] | None = None) -> ChaosReport:
    """Replay, break (the seeded schedule unless `faults` are given), recover, then check every topic
    and InfluxDB against what a fault-free run holds. `stack_class`: the stack to run (cluster_support's for
    TOPOLOGY=cluster). `keep_workdir`: leave the stage logs for a caller whose own checks of the report follow.
    `running`: the caller brought the stack up and checked it already; `keep_running`: leave it up, for a next run.
    `earlier`: what runs before this one published on the stack (their report's `published`; `plan.run` counts
    them). `after`: the caller's own checks, on the stack still running once every check passed."""
    report = ChaosReport(plan)
    rows_file = workdir / f"rows-{plan.run}.json"
    # Synthetic machines of their own for each run on a stack (the seed names them), a day after the run before.
    subprocess.run([sys.executable, "-m", "simulator", "--synthetic", "--machines", str(plan.machines),
                    "--axes", "1", "--limit", str(plan.rows), "--seed", str(plan.seed + plan.run),
                    "--start-ms", str(DEFAULT_START_MS + plan.run * DAY_MS),
                    "--output", str(rows_file)], check=True, cwd=REPO_ROOT, capture_output=True)
    # Each row as the simulator publishes it, with the records the connector makes of it.
    rows = {json.dumps(row).encode(): {canonical(record) for record in expected_records([row])}
            for row in read_rows(rows_file)}
    assert not rows.keys() & earlier.rows.keys(), "a row of this run is one of an earlier run's"
    bad = bad_payloads(plan.bad_rows, plan.seed, first=plan.run * plan.bad_rows)
    stack = stack_class(workdir / "stack", plan.joiner)
    try:
        if not running:
            # Inside: an `up` that fails (a process never healthy) leaves the others running until `down`.
            stack.stack("up", timeout_s=900)
        replay_s = plan.rows / plan.rate
        report.faults = faults if faults is not None else fault_schedule(plan, replay_s)
        settings = stack.simulator_settings("--events-file", str(rows_file), "--rate", str(plan.rate), "--order",
                                            "file", "--drain-timeout-s", "600")
        if stack.credentials():
            # A secure stack's device is bound to one client id: the bad rows go on the replay's connection.
            replay = RowPublisher(settings, DEVICE_CLIENT_ID, bad,
                                  bad_every=max(1, int(0.8 * plan.rows) // (len(bad) or 1)))
            publishers = [replay]
        else:
            replay = RowPublisher(settings)
            publishers = [replay, BadRowPublisher(stack.mqtt, bad, spread_s=0.8 * replay_s)]
        began = time.monotonic()
        for publisher in publishers:
            publisher.start()
        for fault in report.faults:
            # The schedule's own clock: faults happen at their seeded times, whatever the pipeline does.
            time.sleep(max(0.0, began + fault.at_s - time.monotonic()))
            stack.inject(fault)
            report.injected_s.append(time.monotonic() - began)
        report.confirmed = list(stack.confirmed)
        assert len(report.confirmed) == len(report.faults), (report.faults, report.confirmed)
        assert not plan.faults_in_replay or max(report.injected_s, default=0.0) < replay_s, \
            f"faults confirmed after the {replay_s:.0f} s replay: {report.summary()}"
        for publisher in publishers:
            publisher.join(timeout=replay_s + 900)
            assert not publisher.is_alive(), f"{publisher.name}: still publishing"
            assert publisher.error is None, publisher.error
        assert not getattr(replay, "unpublished_bad", None), "bad rows left unpublished"
        report.replay_s = time.monotonic() - began
        check_outcome(stack, report, rows, bad, {payload: ack for publisher in publishers
                                                 for payload, ack in publisher.publisher.acks.items()}, earlier)
        report.settle_s = time.monotonic() - began - report.replay_s
        if after is not None:
            after(stack, report)
        kept_up = keep_running
    except BaseException:
        kept_up = False  # a failed run's stack goes down, its logs kept
        raise
    finally:
        if stack.latency is not None:
            stack.latency.stop()
        report.verdicts = list(stack.verdicts)
        joiner_log = stack.state_dir / f"{plan.joiner}-joiner" / f"{plan.joiner}-joiner.log"
        report.joiner_log = joiner_log.read_text(errors="replace") if joiner_log.exists() else ""
        if not kept_up:
            stack.stack("down", timeout_s=300)
    if not keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)  # kept only when the run failed
    return report


def check_outcome(stack: PrivateStack, report: ChaosReport, rows: dict[bytes, set[str]], bad: list[bytes],
                  acks: dict[bytes, Ack], earlier: Published = NOTHING_PUBLISHED) -> None:
    """`rows`: each good row's payload and its records; `acks`: every row's PUBACK, good and bad; `earlier`: what
    runs before this one published on the stack, checked again with this run's."""
    bootstrap, security = stack.bootstrap, stack.kafka_security
    report.broker_kills = list(stack.broker_kills)
    at_risk = {payload for payload, ack in acks.items() if lost_to_broker_kill(ack, report.broker_kills)}
    report.at_risk_in_broker_kills = len(at_risk)
    report.published = Published({**earlier.rows, **rows}, [*earlier.bad, *bad], earlier.at_risk | at_risk)
    rows, bad, at_risk = report.published.rows, report.published.bad, report.published.at_risk
    for kill in report.broker_kills:
        window_s = kill.killed_at - kill.saved_at
        assert window_s <= MOSQUITTO_SAVE_WINDOW_S, \
            f"Mosquitto's last save came {window_s:.1f} s before its SIGKILL: more than {MOSQUITTO_SAVE_WINDOW_S} s"
        in_window = sum(lost_to_broker_kill(ack, [kill]) is not None for ack in acks.values())
        assert in_window <= report.plan.max_rows_at_risk_per_mosquitto_kill, \
            f"{in_window} rows acknowledged in the {window_s:.1f} s between Mosquitto's last save and its SIGKILL: " \
            f"more than the {report.plan.max_rows_at_risk_per_mosquitto_kill} the run allows"
    good = set().union(*rows.values())
    required = set().union(*(records for payload, records in rows.items() if payload not in at_risk))

    # The checks below poll until the topics hold what they must: each poll a whole read, nothing waited for besides.
    def data_complete() -> list[Message]:
        messages = read_topic(bootstrap, MACHINE_DATA.name, idle_s=0.5, deadline_s=300, security=security)
        return messages if {canonical(m.value) for m in messages} >= required else []

    data = wait_for(data_complete, 900, "every good record not lost to a SIGKILL of Mosquitto in machine.data",
                    interval_s=2.0)
    present = {canonical(m.value) for m in data}
    if any(not rows[payload] <= present for payload in at_risk if payload in rows):
        # Rows at risk that were not lost may still be on their way: machine.data is complete once it stops
        # growing (every publisher has its PUBACKs, no more faults come).
        previous = [len(data)]

        def data_settled() -> list[Message]:
            messages = read_topic(bootstrap, MACHINE_DATA.name, idle_s=2.0, deadline_s=300, security=security)
            settled, previous[0] = len(messages) == previous[0], len(messages)
            return messages if settled else []

        data = wait_for(data_settled, 900, "machine.data to stop growing", interval_s=10.0)
    arrived = Counter(canonical(m.value) for m in data)
    assert arrived.keys() <= good, "machine.data holds records of no good row"
    missing = {payload: records - arrived.keys() for payload, records in rows.items()
               if not records <= arrived.keys()}
    # The connector writes a row whole or not at all.
    partial = [payload for payload, records in missing.items() if records != rows[payload]]
    assert not partial, f"{len(partial)} rows partly in machine.data, e.g. {partial[:3]}"
    unexplained = [payload for payload in missing if payload not in at_risk]
    assert not unexplained, f"{len(unexplained)} rows missing that no SIGKILL of Mosquitto can have lost: {unexplained[:3]}"
    # Each record once: a row sent again (a redelivery, a publisher's resend) wrote only what Kafka did not hold.
    twice = [value for value, copies in arrived.items() if copies > 1]
    assert not twice, f"{len(twice)} records in machine.data more than once, e.g. {twice[:3]}"
    report.records = len(arrived)

    expected_joins = stack.expected_joins(data)

    def joins_complete() -> Counter[str] | None:
        joins = Counter(canonical(m.value) for m in read_topic(bootstrap, MACHINE_OUT.name, idle_s=0.5,
                                                                 deadline_s=300, security=security))
        assert not joins - expected_joins, f"joins that the offline join lacks: {list(joins - expected_joins)[:3]}"
        return joins if joins == expected_joins else None

    wait_for(joins_complete, 900, "machine.out to equal the offline join of machine.data", interval_s=2.0)
    report.joins = sum(expected_joins.values())

    dead = read_topic(bootstrap, MACHINE_DLQ.name, idle_s=2.0, deadline_s=300, security=security)
    payloads = dead_lettered_payloads(dead)
    # A good record dead-lettered as out of order is a stranger too: a broker restart under load used to
    # cause such (the simulator's rows sent again after its reconnect went out behind newer ones).
    strangers = [json.loads(m.value) for m, payload in zip(dead, payloads) if payload not in bad]
    assert not strangers, f"{len(strangers)} dead letters of no bad row, e.g. {strangers[:3]}"
    bad_missing = set(bad) - set(payloads)
    unexplained_bad = sorted(bad_missing - at_risk)
    assert not unexplained_bad, f"bad rows missing from machine.dlq that no SIGKILL of Mosquitto can have lost: " \
                                f"{unexplained_bad[:5]}"
    # A bad row sent again (a publisher's resend, a killed connector's unacknowledged rows) is known by its
    # dead letter in machine.dlq: each bad row once.
    assert len(payloads) == len(set(payloads)), f"{len(payloads) - len(set(payloads))} bad rows dead-lettered twice"
    report.dead_letters = len(dead)
    report.lost_to_broker_kills = [*missing, *sorted(bad_missing)]

    # InfluxDB: every record of machine.data one raw point and every record of machine.out one joined point, with
    # their tags, times and values, and nothing else.
    wait_for_points(stack.influx(), raw=expected_raw_points(map(json.loads, arrived)),
                    joined=expected_joined_points(map(json.loads, expected_joins)), deadline_s=900, interval_s=2.0)
