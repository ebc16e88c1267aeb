"""`make rolling-restart` (`python -m stack rolling-restart`): every Kafka node of a running cluster restarted in
turn, then every Spark worker, each back in sync before the next goes, the pipeline running on.

TOPOLOGY=cluster and hosts only: the single stack has one broker, whose restart stops the pipeline's writes while
it lasts (`make restart SERVICE=kafka`). Three nodes with replication factor 3 and min.insync.replicas 2 take one
node away at a time without refusing a write; a second node down before the first one is back in sync would take
writes (acks=all) away. So each Kafka node, in order:

1. the cluster is in sync: every partition of every topic (internal ones too) led and with its full ISR, and every
   voter of the KRaft metadata quorum caught up (waited for, up to SYNC_DEADLINE_S);
2. the node is stopped by supervision (SIGTERM: a controlled shutdown, which moves its leaderships first; SIGKILL
   after its 30 s grace), and seen gone from the cluster's metadata;
3. it is started again and ready (it answers and the cluster lists it as a broker);
4. it is back in sync: every partition's ISR complete again (it caught up on every replica it holds) and its
   controller caught up with the quorum's leader since it started (Kafka's DescribeQuorum, KIP-836, through its Java
   Admin client: `DescribeQuorum.java` beside this module, as confluent-kafka has no such call);
5. the preferred leaders are elected again, so that the leaderships it gave up come back to it.

Then each Spark worker (with the Spark joiner): stopped (its executors go with it; the driver runs their tasks on
the other worker's executor), started, and back when the master lists it ALIVE and runs an executor of the joiner's
application on it again.

Exactly-once holds throughout by the stages' own design (transactions, checkpoints, acks=all): nothing here
touches the data. Each step says what it did and how long it took. The stack's lock (`supervision.exclusive`) is
held for each stop and start, so no `up`, `down` or watchdog restart interleaves with one.
"""
from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import ElectionType, KafkaException

from pipeline_core import credentials
from pipeline_core.kafka_clients import admin_client, java_security_options
from pipeline_core.settings import KafkaSettings, load_settings
from . import kafka_cluster, security, spark_cluster, supervision, topology
from .choice import KAFKA_NODES
from .processes import StackError
from .services import Service, java_with_kafka_jars

# How long the cluster may take to be in sync again after a node's start (its replicas catching up on what was
# written meanwhile), and before the first node goes.
SYNC_DEADLINE_S = 600.0
# How long the cluster may take to drop a stopped node from its metadata, and the master a stopped worker.
GONE_DEADLINE_S = 120.0
# How long a restarted worker may take to run an executor of the joiner's application again.
EXECUTOR_DEADLINE_S = 300.0
METADATA_TIMEOUT_S = 10.0
QUORUM_TIMEOUT_MS = 15_000
QUORUM_PROGRAM = Path(__file__).with_name("DescribeQuorum.java")
POLL_S = 1.0


@dataclass(frozen=True)
class Step:
    """One node's restart: how long each part took, in seconds."""

    name: str
    old_pid: int | None
    new_pid: int | None
    stopped_s: float  # from the stop until it was gone (its process, and from the metadata or the master)
    started_s: float  # from the start until it was ready
    in_sync_s: float  # from ready until in sync (ISR and quorum; a worker: an executor of the joiner again)
    began_at: float  # Unix time its stop began
    in_sync_at: float  # Unix time it was found in sync
    detail: str

    def describe(self) -> str:
        return (f"{self.name}: stopped in {self.stopped_s:.1f} s, started in {self.started_s:.1f} s "
                f"(pid {self.old_pid} -> {self.new_pid}), {self.detail} {self.in_sync_s:.1f} s later")


@dataclass(frozen=True)
class ClusterSync:
    """The cluster's partitions as its metadata gives them."""

    partitions: int
    under_replicated: list[str]  # topic/partition without its full ISR
    offline: list[str]  # topic/partition without a leader
    brokers: set[int]

    @property
    def in_sync(self) -> bool:
        return not self.under_replicated and not self.offline

    def describe(self) -> str:
        if self.in_sync:
            return f"every ISR complete on {self.partitions} partitions"
        return (f"{len(self.under_replicated)} of {self.partitions} partitions under-replicated"
                + (f", {len(self.offline)} without a leader" if self.offline else "")
                + f" (e.g. {', '.join((self.offline + self.under_replicated)[:3])})")


@dataclass(frozen=True)
class Replica:
    """A replica of the KRaft metadata log, as DescribeQuorum gives it (times in ms since the epoch, -1: never)."""

    node: int
    role: str  # voter | observer
    log_end_offset: int
    last_fetch_ms: int
    last_caught_up_ms: int


@dataclass(frozen=True)
class Quorum:
    leader: int
    epoch: int
    high_watermark: int
    replicas: list[Replica]

    def caught_up_since(self, node: int, since_ms: int) -> bool:
        """Whether `node` leads the quorum or, as a voter, fetched from its leader and caught up since `since_ms`."""
        if node == self.leader:
            return True
        return any(replica.node == node and replica.role == "voter" and replica.last_fetch_ms >= since_ms
                   and replica.last_caught_up_ms >= since_ms for replica in self.replicas)

    def lagging(self) -> list[int]:
        """Voters more than a few seconds behind the leader (or never caught up)."""
        newest = max((replica.last_caught_up_ms for replica in self.replicas), default=-1)
        return [replica.node for replica in self.replicas if replica.role == "voter" and replica.node != self.leader
                and (replica.last_caught_up_ms < 0 or newest - replica.last_caught_up_ms > 5_000)]


def parse_quorum(text: str) -> Quorum:
    """DescribeQuorum.java's lines."""
    leader, replicas = None, []
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["leader"] and len(fields) == 4:
            leader = tuple(int(value) for value in fields[1:])
        elif fields[:1] in (["voter"], ["observer"]) and len(fields) == 5:
            replicas.append(Replica(int(fields[1]), fields[0], *(int(value) for value in fields[2:])))
    if leader is None:
        raise StackError(f"DescribeQuorum gave no leader: {text.strip()[:300]}")
    return Quorum(leader[0], leader[1], leader[2], replicas)


def _admin_settings() -> KafkaSettings:
    return load_settings(KafkaSettings, [], environ=credentials.environ_for("admin"))


def describe_quorum() -> Quorum:
    """The metadata quorum as the cluster describes it now (Kafka's Java Admin client, run from its source)."""
    properties = {"bootstrap.servers": kafka_cluster.bootstrap_servers(),
                  **java_security_options(_admin_settings(), prefix="")}
    java, *class_path = java_with_kafka_jars()
    done = subprocess.run([java, "-Xmx128m", "-XX:TieredStopAtLevel=1", *class_path, str(QUORUM_PROGRAM),
                           str(QUORUM_TIMEOUT_MS)],
                          input="".join(f"{key}={_escaped(value)}\n" for key, value in properties.items()),
                          capture_output=True, text=True, timeout=QUORUM_TIMEOUT_MS / 1000 + 120)
    if done.returncode != 0:
        raise StackError(f"describing the metadata quorum failed: {done.stderr.strip()[-500:]}")
    return parse_quorum(done.stdout)


def _escaped(value: str) -> str:
    """A value in a Java properties file: backslashes doubled (the JAAS entry's quotes stay as they are)."""
    return value.replace("\\", "\\\\")


def cluster_sync() -> ClusterSync:
    """Every partition of every topic, with its leader and ISR, from the cluster's metadata."""
    metadata = admin_client(kafka_cluster.bootstrap_servers(), log_level=0,
                            **security.client_security()).list_topics(timeout=METADATA_TIMEOUT_S)
    under, offline, total = [], [], 0
    for name, topic in sorted(metadata.topics.items()):
        for number, partition in sorted(topic.partitions.items()):
            total += 1
            if partition.leader < 0:
                offline.append(f"{name}/{number}")
            elif set(partition.isrs) < set(partition.replicas):
                under.append(f"{name}/{number}")
    return ClusterSync(total, under, offline, set(metadata.brokers))


def _sync_or_none() -> ClusterSync | None:
    try:
        return cluster_sync()
    except KafkaException:
        return None  # a node changing its mind: asked again


def await_in_sync(node: int | None = None, since_ms: int = 0, deadline_s: float = SYNC_DEADLINE_S) -> str:
    """Wait until every partition is led with its full ISR and the quorum caught up (with `node`: that node caught
    up since `since_ms`, Unix ms); what was found."""
    end = time.monotonic() + deadline_s
    found = "the cluster's metadata unanswered"
    while True:
        sync = _sync_or_none()
        if sync is not None:
            found = sync.describe()
            if sync.in_sync and (node is None or node in sync.brokers):
                quorum = describe_quorum()
                if node is not None and not quorum.caught_up_since(node, since_ms):
                    found = f"{sync.describe()}; kafka-{node}'s controller not caught up with the quorum yet"
                elif node is None and quorum.lagging():
                    found = f"{sync.describe()}; quorum voters behind: {quorum.lagging()}"
                else:
                    role = "leads the quorum" if node == quorum.leader else "caught up with the quorum"
                    return f"{sync.describe()}, kafka-{node} {role}" if node is not None else \
                        f"{sync.describe()}, quorum of {len([r for r in quorum.replicas if r.role == 'voter'])} " \
                        f"voters caught up (leader kafka-{quorum.leader})"
        if time.monotonic() > end:
            raise StackError(f"the cluster was not in sync within {deadline_s:.0f} s: {found}")
        time.sleep(POLL_S)


def elect_preferred_leaders() -> int:
    """Elect every partition's preferred leader where it is not the leader; how many moved."""
    admin = admin_client(kafka_cluster.bootstrap_servers(), log_level=0, **security.client_security())
    try:
        results = admin.elect_leaders(ElectionType.PREFERRED, None).result(timeout=60)
    except KafkaException as error:
        raise StackError(f"electing the preferred leaders failed: {error}") from None
    return sum(error is None for error in results.values())


def _await(check: Callable[[], bool], deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            raise StackError(f"{what} did not happen within {deadline_s:.0f} s")
        time.sleep(POLL_S / 2)


def _service(name: str, services: list[Service]) -> Service:
    return next(service for service in services if service.name == name)


def restart_kafka_node(node: int, services: list[Service], start: Callable[[Service], object]) -> Step:
    name = f"kafka-{node}"
    service = _service(name, services)
    began_at, began = time.time(), time.monotonic()
    with supervision.exclusive():
        old_pid = supervision.process_info(name).pid
        supervision.stop_process(name)
        _await(lambda: (sync := _sync_or_none()) is not None and node not in sync.brokers, GONE_DEADLINE_S,
               f"{name} gone from the cluster's metadata")
        stopped_s = time.monotonic() - began
        started_at_ms = int(time.time() * 1000)
        start(service)
        new_pid = supervision.process_info(name).pid
    ready = time.monotonic()
    found = await_in_sync(node, started_at_ms)
    in_sync = time.monotonic()
    moved = elect_preferred_leaders()
    return Step(name, old_pid, new_pid, stopped_s, ready - began - stopped_s, in_sync - ready, began_at, time.time(),
                f"in sync ({found}; {moved} partitions led by their preferred leader again)")


def restart_spark_worker(worker: spark_cluster.SparkWorker, start: Callable[[Service], object]) -> Step:
    application = spark_cluster.running_application()
    began_at, began = time.time(), time.monotonic()
    with supervision.exclusive():
        old_pid = supervision.process_info(worker.name).pid
        supervision.stop_process(worker.name)
        _await(lambda: worker.registration() is None, GONE_DEADLINE_S, f"the master to drop {worker.name}")
        stopped_s = time.monotonic() - began
        start(worker)
        new_pid = supervision.process_info(worker.name).pid
    ready = time.monotonic()
    if application is None:
        detail = "registered with the master (no Spark application runs)"
    else:
        _await(lambda: spark_cluster.executors_on(worker, application) > 0, EXECUTOR_DEADLINE_S,
               f"an executor of {application} on {worker.name}")
        detail = f"running an executor of {application} again"
    return Step(worker.name, old_pid, new_pid, stopped_s, ready - began - stopped_s, time.monotonic() - ready,
                began_at, time.time(), detail)


def rolling_restart(services: list[Service], start: Callable[[Service], object],
                    notify: Callable[[str], None]) -> list[Step]:
    """Every Kafka node, then every Spark worker that runs, restarted in turn (module docstring); `start` starts a
    service and waits until it is ready (`manager.start`). `notify` is told of each step as it ends."""
    if not topology.is_cluster():
        raise StackError("a rolling restart needs the cluster's three Kafka nodes (TOPOLOGY=cluster or hosts): the "
                         "single stack's one broker is restarted with `make restart SERVICE=kafka`, the pipeline "
                         "waiting for it meanwhile")
    running = set(supervision.active_programs())
    nodes = [node for node in KAFKA_NODES if f"kafka-{node}" in running]
    if len(nodes) != len(KAFKA_NODES):
        raise StackError(f"not every Kafka node runs ({', '.join(f'kafka-{n}' for n in nodes) or 'none'}): "
                         "`make up` starts the cluster")
    notify(f"before: {await_in_sync()}")
    steps = []
    for node in nodes:
        steps.append(restart_kafka_node(node, services, start))
        notify(steps[-1].describe())
    workers = [service for service in services
               if isinstance(service, spark_cluster.SparkWorker) and service.name in running]
    for worker in workers:
        steps.append(restart_spark_worker(worker, start))
        notify(steps[-1].describe())
    if not workers:
        notify("no Spark worker runs (the standalone joiner's cluster): Kafka's nodes only")
    return steps


def summary(steps: list[Step], took_s: float) -> str:
    return f"rolling restart of {', '.join(step.name for step in steps)} done in {took_s:.1f} s"


def document(steps: list[Step], took_s: float) -> dict[str, object]:
    """The steps as one JSON-ready document, for programs (`--json`)."""
    return {"steps": [asdict(step) for step in steps], "took_s": took_s}
