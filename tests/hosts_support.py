"""TOPOLOGY=hosts for the chaos machinery: a private stack placed on hosts by the inventory (each host a network
namespace of its own prefix, so every server keeps its default ports), and the seeded schedule of network faults.

The checks run on the operator host (`python -m stack run`), where every server's name resolves and every path to
it crosses the network; `run_storm` is that program. Each fault is confirmed from inside the hosts before it counts:
a connect across a cut fails with "no route to host", one to a host cut off times out, and `make status` names the
server a host cannot reach."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from chaos_support import (MOSQUITTO_SAVE_WINDOW_S, NOTHING_PUBLISHED, REPO_ROOT, BrokerKill, ChaosPlan, ChaosReport,
                           Fault, PrivateStack, Published, chaos_workdir, only_the_wedged_were_restarted, run_chaos)
from cluster_support import cluster_fault_schedule
from growth_support import StatusBeforeDown
from rolling_support import delays_around
from spec_change_support import (INITIAL, LiveChanges, check_live_changes, live_change_faults, live_change_figures,
                                 live_change_seconds, spec_file)
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from influxdb import InfluxDBClient
from db_connector_support import JSON_ANSWERS
from fault_support import freeze, kill_pid, thaw
from pipeline_core.settings import MqttSettings, load_settings
from pipeline_core.stage_health import Heartbeat, read_heartbeat
from simulator.settings import SimulatorSettings
from stack import netns, placement
from stack.processes import process_state
from stack.topology import CLUSTER_PORTS, SINGLE_PORTS
from stack.watchdog import read_history
from support import wait_for

# A port nothing listens on: a connect to it is refused by a host that can be reached, and fails otherwise.
UNUSED_PORT = 9
# How long a host stays cut off, or a path cut: past the clients' session and request timeouts (45 s sessions in
# librdkafka by default, 30 s requests), so that what follows a real outage follows here.
HOLD_S = 50.0
# Faults are injected one after another, each once the one before is confirmed, and on a loaded machine one
# confirmation can take half a minute (the coordinator named again right after a Kafka node's kill, then `make
# status`), holding up those behind it: a storm's schedule leaves this much of its replay's end for them to land in
# (`faults_in_replay`). The storm of `make test` (100 s) has its faults over its first 65 s; in `make chaos`'s (820 s)
# every hold is 4 % shorter for it.
LATE_FAULTS_S = 35.0
# The Kafka node that coordinates the joiner's consumer group (its offsets and, for the exactly-once joiners, the
# group a transaction commits to), named when the fault begins: the node whose loss moves the most.
LEADING_NODE = "kafka-leading"


class PrivateHostsStack(PrivateStack):
    """`python -m stack` with TOPOLOGY=hosts, its own state folder and its own namespaces (`prefix`)."""

    def __init__(self, state_dir: Path, joiner: str, prefix: str) -> None:
        super().__init__(state_dir, joiner)
        # Its own settings only: neither private ports (each host has its own) nor the MQTT client's settings that
        # `python -m stack run` gives this program, which `up` would take for Mosquitto's own.
        client = {*placement.mqtt_client_environment(), "KAFKA_BOOTSTRAP_SERVERS", *self.assigned_ports}
        self.env = {key: value for key, value in self.env.items() if key not in client}
        self.env.update(TOPOLOGY="hosts", STACK_HOSTS_PREFIX=prefix, **placement.server_environment())
        self.assigned_ports = {}
        self.bootstrap = ",".join(f"kafka-{n}:{port}" for n, port in ((1, 9092), (2, 9094), (3, 9096)))
        self.mqtt_client = {**placement.mqtt_client_environment(),
                            "MQTT_TLS_CA_FILE": str(state_dir / "tls" / "ca.pem")}
        self.mqtt = load_settings(MqttSettings, [], environ=self.mqtt_client)
        self.influxdb_port = 8086
        self.harness = placement.harness()
        self.frozen: dict[str, int] = {}
        self.watch: RecoveryWatch | None = None
        self.resolved: dict[str, str] = {}  # LEADING_NODE -> the node it named
        self.leading_note = ""

    def _supervisorctl(self, *args: str) -> subprocess.CompletedProcess:
        host = placement.inventory().host_of(args[-1]).name
        config = self.state_dir / "supervisor" / host / "supervisord.conf"
        return subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(config), *args],
                              env=self.env, capture_output=True, text=True, timeout=180)

    def socket_of(self, name: str) -> Path:
        return self.state_dir / "supervisor" / placement.inventory().host_of(name).name / "supervisor.sock"

    def simulator_settings(self, *args: str) -> SimulatorSettings:
        return load_settings(SimulatorSettings, ["--no-progress", *args],
                             environ={**self.environ_for("device"), **self.mqtt_client})

    def influx(self) -> InfluxDBClient:
        environ = self.environ_for("reader")
        # Over HTTPS, verified with the stack's CA, as every client across the hosts.
        return InfluxDBClient(placement.inventory().server_host_name("influxdb"), self.influxdb_port,
                              database="machinedata", timeout=30, username=environ.get("INFLUXDB_USERNAME"),
                              password=environ.get("INFLUXDB_PASSWORD"), headers=dict(JSON_ANSWERS), ssl=True,
                              verify_ssl=environ["INFLUXDB_TLS_CA_FILE"])

    def inject(self, fault: Fault) -> None:
        if fault.target == LEADING_NODE:
            if fault.action not in HEALING:
                self.resolved[LEADING_NODE] = self._leading_node()
            fault = Fault(fault.at_s, fault.action, self.resolved[LEADING_NODE])
        if self.watch is None:
            self.watch = RecoveryWatch(self.state_dir, sorted(self.stages()))
            self.watch.start()
        freeze = f"freeze {fault.target}"
        if fault.action == "freeze" and fault.target.startswith("kafka-"):
            self.watch.frozen_at[freeze] = time.time()
        self._inject(fault)
        if fault.action in HEALING:
            self.watch.healed.append((f"{fault.action} {fault.target} @{fault.at_s:.0f}s", time.time()))
        if fault.action == "thaw" and freeze in self.watch.frozen_at:
            self.watch.thawed_at[freeze] = time.time()

    def stages(self) -> set[str]:
        joiners = ["spark-joiner"] if self.env["JOINER"] == "spark" else ["lsb-joiner-1", "lsb-joiner-2"]
        return {"stream-connector", "db-connector-1", "db-connector-2", *joiners}

    def recoveries(self) -> dict[str, float | None]:
        """Each healing's recovery time (None: not caught up by the end of the run)."""
        if self.watch is None:
            return {}
        self.watch.done.set()
        self.watch.join()
        return {what: self.watch.recovered_s.get(what) for what, _ in self.watch.healed}

    def went_on(self) -> dict[str, float | str]:
        """For each Kafka node frozen, the seconds into the freeze after which every stage stayed at the live edge
        until the thaw, or why they did not for the last WENT_ON_FOR_S of the freeze."""
        return {} if self.watch is None else dict(self.watch.went_on_s)

    def _leading_node(self) -> str:
        """The Kafka node that coordinates the joiner's group (the Spark sink's transactional group, or the
        standalone joiners' group), as Kafka says now: asked again while the group or its coordinator moves (a
        node was just killed, say)."""
        return wait_for(self._coordinator_now, 90, "Kafka to name the coordinator of the joiner's group",
                        interval_s=1.0)

    def _coordinator_now(self) -> str | None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.kafka_security})
        try:
            groups = [group.group_id for group in admin.list_consumer_groups(request_timeout=15).result().valid]
            # The running joiner's group (the other joiner's stays behind after a switch).
            joiner_groups = [group for group in groups if (group.startswith("spark-joiner.")
                                                           if self.env["JOINER"] == "spark" else group == "kafka-joiner")]
            if not joiner_groups:
                return None
            description = admin.describe_consumer_groups(joiner_groups[:1],
                                                         request_timeout=15)[joiner_groups[0]].result()
            topic = admin.list_topics("machine.data", timeout=15).topics["machine.data"]
        except KafkaException:
            return None
        node = f"kafka-{description.coordinator.id}"
        led = sum(partition.leader == description.coordinator.id for partition in topic.partitions.values())
        self.leading_note = (f"{node} coordinated group {joiner_groups[0]} and led {led} of "
                             f"{len(topic.partitions)} machine.data partitions")
        return node

    def _inject(self, fault: Fault) -> None:
        if fault.action not in ("isolate", "rejoin", "cut", "heal", "freeze", "thaw", "lose-disk", "replace"):
            super().inject(fault)
            return
        if fault.action == "freeze":
            pid = self.pid(fault.target)
            freeze(pid, fault.target)
            self.frozen[fault.target] = pid
            self.confirmed.append(f"freeze {fault.target}: process group {pid} stopped (state T)")
        elif fault.action == "thaw":
            pid = self.frozen.pop(fault.target)
            if process_state(pid) is None:
                # A stage frozen past its stale time (a standalone joiner's minute) is wedged to the watchdog, which
                # ended it meanwhile and started it again.
                history = self.state_dir / "supervisor" / "watchdog.jsonl"
                record = wait_for(lambda: next((r for r in read_history(history) if r.pid == pid and r.new_pid), None),
                                  60, f"the watchdog's record of ending {fault.target}'s frozen process {pid}")
                self.confirmed.append(f"thaw {fault.target}: the watchdog had ended its frozen process group {pid} "
                                      f"(no report for {record.heartbeat_age_s:.0f} s) and started it again as "
                                      f"{record.new_pid}")
                return
            thaw(pid, fault.target)
            self.confirmed.append(f"thaw {fault.target}: process group {pid} running again")
        elif fault.action == "lose-disk":
            # The host goes, and the program with it (a Kafka node, a Spark worker with its executors): cut off,
            # killed, its storage deleted; supervision must not bring the dead program back meanwhile.
            host = placement.inventory().host_of(fault.target).name
            if fault.target == "mosquitto":
                self._await_connector_at_live_edge()
            lost_at = time.time()
            self.harness.isolate(host)
            wait_for(lambda: _failure(self._reach("operator", host)), 30, f"{host} cut off")
            status = ""
            if fault.target in (program for program, _, _ in placement.server_endpoints()):
                status = "; status: " + wait_for(lambda: self._status_line("operator", fault.target), 120,
                                                 f"make status to say the operator cannot reach {fault.target}",
                                                 interval_s=1.0)
            if fault.target == "mosquitto":
                # What it had acknowledged and the connector had not yet taken goes with its disk: the rows it
                # acknowledged in the window before the host went (the connector acknowledges a row once Kafka
                # has it, within a second at the live edge). chaos_support bounds and checks the loss exactly so.
                self.broker_kills.append(BrokerKill(lost_at, lost_at - MOSQUITTO_SAVE_WINDOW_S))
            pid = self.pid(fault.target)
            kill_pid(pid, fault.target, group=True)
            self._supervisorctl("stop", fault.target)
            assert self.running_pid(fault.target) == 0, f"{fault.target} runs again after its host was lost"
            storage = [path for path in (self.state_dir / fault.target / name for name in ("data", "work"))
                       if path.exists()]
            assert storage, f"{fault.target} has no storage to lose"
            for path in storage:
                shutil.rmtree(path)
                assert not path.exists()
            self.confirmed.append(f"lose-disk {fault.target}: host {host} cut off, process group {pid} killed, "
                                  f"{', '.join(map(str, storage))} deleted{status}")
        elif fault.action == "replace":
            # A new host in its place: same name and address, empty storage; `make restart` starts the program
            # (a Kafka node formatted with the cluster's id) and waits until it has joined.
            host = placement.inventory().host_of(fault.target).name
            self.harness.rejoin(host)
            wait_for(lambda: self._reach("operator", host) == "ECONNREFUSED", 60, f"{host} back")
            self.stack("restart", fault.target)
            self.confirmed.append(f"replace {fault.target}: host {host} back with empty storage, "
                                  f"{fault.target} started again and joined (pid {self.pid(fault.target)})")
        elif fault.action == "isolate":
            self.harness.isolate(fault.target)
            wait_for(lambda: _failure(self._reach("operator", fault.target)), 30, f"{fault.target} cut off")
            servers = [program for program, host, _ in placement.server_endpoints() if host == fault.target]
            if servers:
                line = wait_for(lambda: self._status_line("operator", servers[0]), 120,
                                f"make status to say the operator cannot reach {servers[0]}", interval_s=1.0)
                leading = (f" ({self.leading_note})" if self.resolved.get(LEADING_NODE) == fault.target
                           and fault.action == "isolate" else "")
                self.confirmed.append(f"isolate {fault.target}{leading}: a connect from the operator failed; "
                                      f"status: {line}")
            else:
                self.confirmed.append(f"isolate {fault.target}: a connect from the operator failed")
        elif fault.action == "rejoin":
            self.harness.rejoin(fault.target)
            wait_for(lambda: self._reach("operator", fault.target) == "ECONNREFUSED", 60, f"{fault.target} back")
            self.confirmed.append(f"rejoin {fault.target}: reached from the operator again")
        else:
            # One fault, one confirmation, however many paths it cuts or heals.
            a, targets = fault.target.split("|")
            self.confirmed.append("; ".join(self._cut_or_heal(fault.action, a, b) for b in targets.split("+")))

    def _await_connector_at_live_edge(self) -> None:
        """Until the stream connector reports (after this call) no more than a second of rows in its hands: the
        loss of Mosquitto's queue is then the window before the loss, not the backlog of an earlier fault."""
        since = time.time()
        path = self.state_dir / "stream-connector" / "progress.json"

        def at_edge() -> bool:
            beat = read_heartbeat(path)
            return beat is not None and beat.reported_at > since and (beat.lag or 0) + (beat.pending or 0) <= 100

        wait_for(at_edge, 300, "the stream connector at the live edge", interval_s=0.5)

    def _cut_or_heal(self, action: str, a: str, b: str) -> str:
        """Cut or heal the path between hosts `a` and `b`, confirmed; what confirmed it."""
        if action == "cut":
            self.harness.cut_between(a, b)
            error = wait_for(lambda: _failure(self._reach(a, b)), 30, f"the path {a}-{b} cut")
            assert self._reach("operator", b) == "ECONNREFUSED", f"{b} cut off from more than {a}"
            servers = [program for program, host, _ in placement.server_endpoints() if host == b]
            said = ""
            if servers:
                said = "; status: " + wait_for(lambda: self._status_line(a, servers[0]), 120,
                                               f"make status to say {a} cannot reach {servers[0]}", interval_s=1.0)
            return f"cut {a}-{b}: a connect from {a} to {b} failed ({error}), the operator still reaches {b}{said}"
        self.harness.heal_between(a, b)
        wait_for(lambda: self._reach(a, b) == "ECONNREFUSED", 60, f"the path {a}-{b} healed")
        return f"heal {a}-{b}: {a} reaches {b} again"

    def _reach(self, source: str, target: str) -> str | None:
        """The error of a connect from `source` to an unused port of `target`: ECONNREFUSED when it is reached."""
        return self.harness.connect(source, target, UNUSED_PORT, timeout_s=1.0).error

    def _status_line(self, host: str, server: str) -> str | None:
        lines = self.stack("status", check=False).splitlines()
        return next((line for line in lines if line.startswith(f"host {host} ")
                     and "cannot reach" in line and server in line.split("cannot reach", 1)[1]), None)


def _failure(error: str | None) -> str | None:
    """A connect's error when it did not reach its host (a refusal is an answer), else None."""
    return error if error not in (None, "ECONNREFUSED") else None


# A stage is back at the live edge when at most this many records wait for it (or are in its hands): about 3 s of
# the storm's replay (50 rows/s, 6 records each).
CAUGHT_UP_RECORDS = 1_000
HEALING = ("rejoin", "heal", "thaw", "replace")
# The Spark joiner's lag counts every record since its last batch was planned (`spark_joiner.progress`), a batch
# under way included: one batch slower than usual on cores shared with a dozen other JVMs shows as records waiting
# (1,248 once, 95 s into a frozen node's two minutes). Its live edge is about 7 s of the replay, twice its p99
# latency in `make bench` (3.47 s): a joiner held by the frozen node passes it within 7 s (13,728 in the stall this
# measure was made for).
LIVE_EDGE_RECORDS = {"spark-joiner": 2_000}
# A frozen Kafka node is gone around when every stage stays at the live edge this long before the thaw (lag known
# and small at each report; a stage held up reports its lag growing, or none).
WENT_ON_FOR_S = 20.0


def _behind(stage: str, beat: Heartbeat | None, since: float, now: float) -> str | None:
    """Why `stage` is not at the live edge by its heartbeat `beat` (None when it is): reported since `since`, with
    at most CAUGHT_UP_RECORDS (LIVE_EDGE_RECORDS) waiting or in its hands. A stage that cannot tell its lag (the broker's offsets
    unanswered while a node is frozen) is at the edge unless it says it waits, or its work stopped moving while it
    had work: its last progress is recent, or older than the fault (a DB connector whose partitions all went to
    the other one has none)."""
    if beat is None or beat.reported_at <= since:
        return f"{stage}: no report since the fault"
    if (beat.lag or 0) + (beat.pending or 0) > LIVE_EDGE_RECORDS.get(stage, CAUGHT_UP_RECORDS):
        return f"{stage}: lag {beat.lag}, pending {beat.pending}"
    if beat.lag is None:
        if beat.waiting_for or beat.work_waiting:
            return f"{stage}: lag unknown, waiting for {beat.waiting_for or 'its work'}"
        idle_for_s = now - (beat.last_progress_at or 0.0)
        if idle_for_s > 2 * beat.interval_s and (beat.last_progress_at or 0.0) >= since - 2 * beat.interval_s:
            return f"{stage}: lag unknown and no progress for {idle_for_s:.0f} s"
    return None


class RecoveryWatch(threading.Thread):
    """Reads the stages' heartbeats every half second; for each fault healed, the seconds until every stage reported
    itself caught up (CAUGHT_UP_RECORDS) in a report made after the healing."""

    def __init__(self, state_dir: Path, stages: list[str]) -> None:
        super().__init__(name="recovery-watch", daemon=True)
        self.files = [state_dir / stage / "progress.json" for stage in stages]
        self.healed: list[tuple[str, float]] = []  # (what, Unix time healed)
        self.recovered_s: dict[str, float] = {}
        self.frozen_at: dict[str, float] = {}  # a Kafka node's freeze -> Unix time frozen
        self.thawed_at: dict[str, float] = {}  # the freeze -> Unix time thawed
        self.behind_at: dict[str, float] = {}  # the freeze -> the last time a stage was seen behind
        self.behind_why: dict[str, str] = {}  # the freeze -> which stages were behind then, and how
        self.went_on_s: dict[str, float | str] = {}  # the freeze -> seconds, or why the stages never went on
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            beats = [read_heartbeat(path) for path in self.files]
            now = time.time()
            for what, frozen_at in list(self.frozen_at.items()):
                if what in self.went_on_s:
                    continue
                thawed_at = self.thawed_at.get(what)
                if thawed_at is not None:
                    last_behind = self.behind_at.get(what, frozen_at)
                    self.went_on_s[what] = (last_behind - frozen_at if thawed_at - last_behind >= WENT_ON_FOR_S
                                            else f"behind {thawed_at - last_behind:.0f} s before the thaw: "
                                                 f"{self.behind_why.get(what)}")
                    continue
                behind = [why for path, beat in zip(self.files, beats)
                          if (why := _behind(path.parent.name, beat, frozen_at, now)) is not None]
                if behind:
                    self.behind_at[what], self.behind_why[what] = now, "; ".join(behind)
            for what, healed_at in self.healed:
                if what not in self.recovered_s and all(
                        beat is not None and beat.reported_at > healed_at
                        and (beat.lag or 0) + (beat.pending or 0) <= CAUGHT_UP_RECORDS for beat in beats):
                    self.recovered_s[what] = max(beat.reported_at for beat in beats) - healed_at


# How long a Kafka node stays frozen (SIGSTOP) and a host stays lost before its replacement, in the severe storm;
# Mosquitto's host is away for less, as the devices' queues hold what they cannot send meanwhile.
FREEZE_S = 120.0
DISK_LOSS_S = 60.0
BROKER_LOSS_S = 30.0


def hosts_fault_schedule(plan: ChaosPlan, replay_s: float, severe: bool = False) -> list[Fault]:
    """Seeded network faults, one after another over 10-85% of the replay, each healed HOLD_S later (all shorter
    alike when the replay is too short for that): the host of the Kafka node coordinating the joiner's group
    (LEADING_NODE) cut off from every other; the stream connector's path to
    Mosquitto cut; a DB connector's path to InfluxDB cut; with Spark, the driver's path to a worker's host cut, with
    the standalone joiners the host of one of them cut off (its partitions move to the other instance, and it comes
    back fenced). `severe` adds another Kafka node frozen (SIGSTOP) for FREEZE_S; the third one's host lost with its
    disk for DISK_LOSS_S, then replaced by a node with empty storage; the stream connector's host cut off from every
    Kafka node; a Spark worker's host lost (then replaced) or a standalone joiner frozen past its session; and
    Mosquitto's host lost with its disk for BROKER_LOSS_S, then replaced (the rows it had acknowledged and not yet
    handed on are lost, within a bound the checks hold it to)."""
    rng = random.Random(plan.seed)
    nodes = [1, 2, 3]
    rng.shuffle(nodes)
    faults = [("isolate", "rejoin", LEADING_NODE, HOLD_S), ("cut", "heal", "ingest|mqtt", HOLD_S),
              ("cut", "heal", "ingest|influx", HOLD_S)]
    if plan.joiner == "spark":
        faults.append(("cut", "heal", f"driver|worker-{rng.choice((1, 2))}", HOLD_S))
    else:
        faults.append(("isolate", "rejoin", "worker-1", HOLD_S))
    if severe:
        faults += [("freeze", "thaw", f"kafka-{nodes[1]}", FREEZE_S),
                   ("lose-disk", "replace", f"kafka-{nodes[2]}", DISK_LOSS_S),
                   # The stream connector (and a DB connector) cut off from every Kafka node.
                   ("cut", "heal", "ingest|kafka-1+kafka-2+kafka-3", HOLD_S),
                   # A Spark worker's host lost with its executors; a standalone joiner frozen past its session.
                   ("lose-disk", "replace", "spark-worker-2", DISK_LOSS_S) if plan.joiner == "spark" else
                   ("freeze", "thaw", "lsb-joiner-2", DISK_LOSS_S),
                   ("lose-disk", "replace", "mosquitto", BROKER_LOSS_S)]
    rng.shuffle(faults)
    # Each fault's slot is its hold and a quarter more, where it starts at a seeded moment; all slots fit in 75% of
    # the replay, every hold shortened alike when they would not.
    scale = min(1.0, 0.75 * replay_s / (1.25 * sum(hold_s for *_, hold_s in faults)))
    schedule, at_s = [], 0.10 * replay_s
    for fault, healing, target, hold_s in faults:
        held_s = hold_s * scale
        start_s = at_s + rng.uniform(0, 0.25 * held_s)
        schedule += [Fault(round(start_s, 1), fault, target), Fault(round(start_s + held_s, 1), healing, target)]
        at_s += 1.25 * held_s
    return schedule


def _stack(env: dict[str, str], *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stack", *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout_s)


def storm_across_hosts(joiner: str, rows: int, rate: float, severe: bool = False, kills: bool = False,
                       live_changes: bool = False, faults: list[Fault] | None = None,
                       environment: dict[str, str] | None = None) -> dict:
    """`storms_across_hosts` with one joiner: its report."""
    return storms_across_hosts((joiner,), rows, rate, severe, kills, live_changes, faults, environment)[0]


def storms_across_hosts(joiners: tuple[str, ...], rows: int, rate: float, severe: bool = False,
                        kills: bool = False, live_changes: bool = False, faults: list[Fault] | None = None,
                        environment: dict[str, str] | None = None) -> list[dict]:
    """TOPOLOGY=hosts from nothing with the first of `joiners` (and `environment` for its `up`), every program checked
    to run healthy in its host's network namespace; then for each joiner in turn (`up` switching to it, the others'
    checked again) the seeded storm (`run_storm`, on the operator host) of `rows` rows at `rate` rows/s (`severe`,
    `kills`: with its severe faults, with the cluster's SIGKILLs; `live_changes`: instead of network faults, join specs
    changed and partitions added, spec_change_support.live_change_faults; `faults`: these instead of its network
    faults), each on the rows and joins of the storms before it too; then `down`, after which nothing of the hosts may
    be left. Each storm's report, with the folder of the logs (one bring-up for them all)."""
    netns.preflight()  # root and `ip netns`, or a clear failure
    swept = netns.sweep_orphans()  # what a test killed before its `down` left
    if swept:
        print(f"removed the namespaces a killed test left: {', '.join(swept)}")
    workdir = chaos_workdir(f"hosts-{'-'.join(joiners)}")
    state_dir = workdir / "stack"
    prefix = f"h{uuid.uuid4().hex[:8]}"
    # Every server on its default ports, each host being a network of its own: none of the ports this environment
    # may move a stack to (another stack's block on this machine), which the checks across the hosts do not expect.
    env = {**{name: value for name, value in os.environ.items() if name not in (*SINGLE_PORTS, *CLUSTER_PORTS)},
           "TOPOLOGY": "hosts", "STACK_STATE_DIR": str(state_dir), "STACK_HOSTS_PREFIX": prefix,
           placement.GUARDIAN_PID_ENV: str(os.getpid()), **(environment or {})}
    if live_changes:  # started with the run's initial join specs
        initial = spec_file(workdir, INITIAL, "initial_specs.toml")
        env.update(KAFKA_JOINER_JOIN_SPECS=str(initial), SPARK_JOINER_JOIN_SPECS=str(initial))
    network = netns.Network(prefix, placement.inventory().subnet)
    reports = []
    try:
        for run, joiner in enumerate(joiners):
            # The first `up` brings the hosts up; a later one switches the joiner, handing its input position over.
            up = _stack({**env, "JOINER": joiner}, "up")
            assert up.returncode == 0, up.stdout + up.stderr
            _check_every_program_in_its_host({**env, "JOINER": joiner}, network)
            published = workdir / f"published-{run - 1}.json"
            storm = _stack({**env, "JOINER": joiner}, "run", "--", sys.executable, str(Path(__file__).resolve()),
                           "--joiner", joiner, "--state-dir", str(state_dir), "--prefix", prefix, "--rows", str(rows),
                           "--rate", str(rate), "--run", str(run), *(["--severe"] if severe else []),
                           *(["--kills"] if kills else []), *(["--live-changes"] if live_changes else []),
                           *(["--faults", json.dumps([[f.at_s, f.action, f.target] for f in faults])] if faults else []),
                           *(["--keep-running"] if run < len(joiners) - 1 else []),
                           *(["--earlier", str(published)] if run else []), timeout_s=3000)
            assert storm.returncode == 0, f"the storm with the {joiner} joiner: " \
                                          f"{storm.stdout[-5000:]}{storm.stderr[-20000:]}"
            reports.append(json.loads(storm.stdout.strip().splitlines()[-1]))
    finally:
        down = _stack({**env, "JOINER": joiners[len(reports) - 1 if reports else 0]}, "down", timeout_s=600)
    assert down.returncode == 0, down.stdout + down.stderr
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split()
    assert not [name for name in listed if name.startswith(f"{prefix}-")], f"namespaces left after down: {listed}"
    assert not list(netns.NETNS_ETC.glob(f"{prefix}-*")), "/etc/netns entries left after down"
    assert not netns.owner_file(prefix).exists(), "the run's owner record left after down"
    # The stage logs stay until the caller's checks of the reports passed too (`forget_run`).
    for report in reports:
        report["workdir"] = str(workdir)
    return reports


def _check_every_program_in_its_host(env: dict[str, str], network: netns.Network) -> None:
    """`status --json`: every program of the stack healthy, and running in its host's network namespace."""
    status = _stack(env, "status", "--json")
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["topology"] == "hosts"
    for service in document["services"]:
        assert service["health"] == "healthy", service
        host = placement.inventory().host_of(service["name"]).name
        assert os.stat(f"/proc/{service['pid']}/ns/net").st_ino == \
            os.stat(f"/run/netns/{network.namespace(host)}").st_ino, f"{service['name']} runs outside its host {host}"


# The cluster's SIGKILLs of each joiner's storm (cluster_support.cluster_fault_schedule), one each.
KILLED = {"spark": ("kill kafka-", "kill stream-connector", "kill db-connector-", "kill spark-worker-",
                    "kill spark-joiner", "kill-executor spark-worker-"),
          "lsb": ("kill kafka-", "kill stream-connector", "kill db-connector-", "kill lsb-joiner-")}


def check_storm_reports(joiners: tuple[str, ...], reports: list[dict]) -> None:
    """What each storm of `storms_across_hosts(joiners, ..., kills=True)` must have confirmed: every SIGKILL of its
    joiner's cluster, the Kafka node coordinating the joiner's group cut off, four cuts and four healings; a later
    storm's checks took the earlier ones' rows and joins too."""
    for joiner, report in zip(joiners, reports, strict=True):
        print(report["summary"], "; recovered after each healing (s):", report["recovered_s"])
        confirmed = report["confirmed"]
        for kill in KILLED[joiner]:
            assert any(line.startswith(kill) for line in confirmed), (joiner, kill, confirmed)
        assert any(line.startswith("isolate kafka-") and "coordinated group" in line and "cannot reach kafka-" in line
                   for line in confirmed), (joiner, confirmed)
        assert sum(line.startswith(("cut ", "isolate ")) for line in confirmed) == 4, (joiner, confirmed)
        assert sum(line.startswith(("heal ", "rejoin ")) for line in confirmed) == 4, (joiner, confirmed)
    joins = [report["joins"] for report in reports]
    assert joins[0] > 0 and joins == sorted(joins) and len(set(joins)) == len(joins), joins


def forget_run(report: dict) -> None:
    """Remove what a storm's `down` left in its folder, the stage logs: only once every check passed."""
    shutil.rmtree(report["workdir"], ignore_errors=True)


def run_storm(argv: list[str] | None = None) -> int:
    """On the operator host: the replay, its faults and every check (chaos_support.run_chaos); the report as JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--joiner", required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--rows", type=int, default=4_000)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--severe", action="store_true", help="add a frozen Kafka node and a host lost with its disk")
    parser.add_argument("--kills", action="store_true",
                        help="add the cluster's SIGKILLs (cluster_support.cluster_fault_schedule), once each")
    parser.add_argument("--run", type=int, default=0, help="how many storms ran on the stack before this one")
    parser.add_argument("--earlier", type=Path, help="what they published (chaos_support.Published, as JSON)")
    parser.add_argument("--keep-running", action="store_true", help="leave the stack up for a next storm")
    parser.add_argument("--live-changes", action="store_true",
                        help="instead of network faults, join specs changed and partitions added "
                             "(spec_change_support.live_change_faults)")
    parser.add_argument("--faults", type=json.loads,
                        help="these faults instead of the seeded schedule: JSON, [[at_s, action, target], ...]")
    args = parser.parse_args(argv)
    # Faults that must land in the replay, unless they are wedges, each of which waits for a restart to be over (a
    # Spark driver's start took three minutes on a loaded machine), or live changes, as on one host: `make grow`
    # is confirmed once every stage caught up, which took a minute behind a Spark joiner's restart; what the
    # changes must do under the replay (records placed by the grown partitions) is checked by check_live_changes.
    wedges = args.faults is not None and any(action == "wedge" for _at_s, action, _target in args.faults)
    plan = ChaosPlan(joiner=args.joiner, rows=args.rows, machines=20, rate=args.rate, seed=args.seed, bad_rows=8,
                     kills_per_stage=1, faults_in_replay=not (wedges or args.live_changes), run=args.run)
    earlier = Published.from_json(args.earlier.read_text()) if args.earlier else NOTHING_PUBLISHED
    workdir = args.state_dir.parent
    replay_s = plan.rows / plan.rate
    schedule_s = max(0.5 * replay_s, replay_s - LATE_FAULTS_S)
    faults = (live_change_faults(replay_s, workdir) if args.live_changes
              else [Fault(*fault) for fault in args.faults] if args.faults is not None
              else hosts_fault_schedule(plan, schedule_s, args.severe))
    if args.kills:
        faults = sorted(faults + cluster_fault_schedule(plan, schedule_s), key=lambda fault: fault.at_s)
    stacks: list[PrivateHostsStack] = []

    def hosts_stack(state_dir: Path, joiner: str) -> PrivateHostsStack:
        stacks.append(LiveChangesHostsStack(args.state_dir, joiner, args.prefix))
        if args.live_changes:
            stacks[-1].start_with_specs(workdir / "initial_specs.toml")
        return stacks[-1]

    # `storm_across_hosts` brought the stack up and checked every program in its host.
    checks = [check for action, check in (("rolling-restart", delays_around), ("wedge", only_the_wedged_were_restarted))
              if any(fault.action == action for fault in faults)]

    def after(stack: PrivateStack, report: ChaosReport) -> None:
        for check in checks:
            check(stack, report)

    report = run_chaos(plan, workdir, faults, stack_class=hosts_stack, keep_workdir=True,  # see forget_run
                       running=True, earlier=earlier, keep_running=args.keep_running, after=after)
    # What the next storm on the stack checks again (storms_across_hosts).
    (workdir / f"published-{args.run}.json").write_text(report.published.to_json())
    print(json.dumps({"summary": report.summary(), "confirmed": report.confirmed, "joins": report.joins,
                      "dead_letters": report.dead_letters, "replay_s": report.replay_s, "settle_s": report.settle_s,
                      "recovered_s": stacks[0].recoveries(), "went_on_s": stacks[0].went_on(),
                      "rows_at_risk": report.at_risk_in_broker_kills,
                      "rows_lost": len(report.lost_to_broker_kills), "rollings": stacks[0].rollings,
                      "wedges": [dataclasses.asdict(wedge) for wedge in stacks[0].wedges],
                      **(live_change_results(report, stacks[0]) if args.live_changes else {})}))
    return 0


class LiveChangesHostsStack(LiveChanges, StatusBeforeDown, PrivateHostsStack):
    """The hosts' stack, started with the run's initial join specs when it changes them, read by `status --json`
    before its `down` (spec_change_support)."""


def live_change_results(report, stack: PrivateHostsStack) -> dict:
    """What a run of live changes must show beyond run_chaos's checks, and what it measured."""
    failing = check_live_changes(report, stack)
    return {"failing": failing, "figures": "" if failing else live_change_figures(report, stack),
            "recovery_s": [] if failing else list(live_change_seconds(report, stack))}


if __name__ == "__main__":  # run as a script, with tests/ first on its path
    sys.exit(run_storm())
