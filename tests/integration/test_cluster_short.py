"""The cluster on this host (TOPOLOGY=cluster, the standalone joiner), brought up once for two checks in `make test`:
the stream connector's start-up fence with a Kafka follower frozen, then `make rolling-restart` under a replay.

**The fence.** A record is readable only once every in-sync follower has it (the high watermark). A follower that
lags, is cut off or frozen holds a leader's newest records back until the controller drops it from the in-sync
replicas, about 9 s: a stream connector killed meanwhile and started again read a tail of machine.data without them,
wrote their rows again, and the second copies reached the joiners behind newer records, dead-lettered as out of order
(seen once in `make test`'s storm across hosts: a Kafka node cut off, the connector SIGKILLed). The connector's
start-up fence (`stream_connector.redelivery.settle_unseen_writes`) makes them readable before the tail is read.
Shown on a topic of its own with a follower frozen (SIGSTOP): a tail read misses the record the leader holds; after
the fence, with the follower still frozen, the tail holds it.

**The rolling restart.** Under a replay of 3,000 synthetic rows of 10 machines (bad rows mixed in) at 40 rows/s, every
Kafka node is restarted in turn, each back in sync before the next goes. Watched from outside (rolling_support, no
code of `stack.rolling`): each node seen down, back as a new process and in sync again, one after another, never two
Kafka nodes away at once. Afterwards machine.out (read_committed) equals the offline join of machine.data
(join_reference, no code of the joiner), nothing twice, machine.dlq holds exactly the bad rows and InfluxDB every
point (chaos_support.check_outcome). `make reliability` runs it at 30,000 rows with each joiner, on the cluster and
across hosts, with the Spark workers too (tests/reliability/test_rolling_restart.py)."""
from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import NewTopic

from chaos_support import ChaosPlan, Fault, PrivateStack, chaos_workdir, run_chaos
from cluster_support import KAFKA_NODES, PrivateClusterStack
from fault_support import frozen
from pipeline_core.kafka_clients import admin_client, producer_config, retry_transient
from stream_connector.redelivery import fence_transactional_id, read_tail, settle_unseen_writes
from support import unique, wait_for

pytestmark = pytest.mark.integration

TAIL_RECORDS = 100


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateClusterStack]:
    """The whole cluster stack, up and healthy, for the module's tests one after another."""
    workdir = chaos_workdir("cluster-short")
    stack = PrivateClusterStack(workdir / "stack", "lsb")
    try:
        stack.stack("up", timeout_s=900)
        yield stack
    finally:
        stack.stack("down", timeout_s=300)
    shutil.rmtree(workdir, ignore_errors=True)  # kept when a test failed


@pytest.mark.timeout(900)
def test_after_the_fence_the_tail_holds_what_a_frozen_follower_kept_unreadable(cluster: PrivateClusterStack) -> None:
    security, bootstrap = cluster.kafka_security, cluster.bootstrap
    admin = admin_client(bootstrap, **security)
    topic = unique("fence-probe")
    admin.create_topics([NewTopic(topic, 1, len(KAFKA_NODES))])[topic].result(60)

    def in_sync():
        partition = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
        return partition if partition and partition.leader >= 0 and len(partition.isrs) == 3 else None

    partition = wait_for(in_sync, 60, f"{topic} led, with every replica in sync", interval_s=0.5)
    follower = next(node for node in partition.replicas if node != partition.leader)
    producer = Producer(producer_config(bootstrap, **security))
    producer.produce(topic, b"readable", partition=0)
    assert producer.flush(30) == 0, "the first record unacknowledged with every node up"

    # Frozen for the block, confirmed (state T) at its start and still at its end: else the test proved nothing.
    with frozen(cluster.pid(f"kafka-{follower}"), f"kafka-{follower}"):
        acknowledged: list[KafkaError | None] = []

        def delivered(error: KafkaError | None, _message: Message) -> None:
            acknowledged.append(error)

        producer.produce(topic, b"held back", partition=0, on_delivery=delivered)
        producer.poll(1.0)
        assert not acknowledged, f"acknowledged with kafka-{follower} frozen: {acknowledged}"
        # The fault bites: the leader holds the record, and a tail read does not see it.
        before = read_tail(bootstrap, topic, 1, TAIL_RECORDS, security=security)
        assert b"readable" in before and b"held back" not in before

        retry_transient(lambda: settle_unseen_writes(bootstrap, {topic: 1}, fence_transactional_id("fence-probe"),
                                                     security=security),
                        what="the fence", deadline_s=180)
        after = read_tail(bootstrap, topic, 1, TAIL_RECORDS, security=security)
        assert b"held back" in after, "the tail after the fence lacks the record the leader held"
        assert len(after) == 2, "the fence's own record is readable"  # aborted: read_committed skips it
    assert producer.flush(60) == 0 and acknowledged == [None]


@pytest.mark.timeout(1500)
def test_a_rolling_restart_of_the_kafka_nodes_under_a_replay_keeps_the_join_exact(
        cluster: PrivateClusterStack) -> None:
    plan = ChaosPlan(joiner="lsb", rows=3_000, machines=10, rate=40.0, kills_per_stage=0, bad_rows=5,
                     server_faults=())
    # The restart begins once the joins flow; the replay (75 s) goes on under its steps (each node about 30 s). The
    # stack is the module's (its bring-up shared), left up for the fixture to take down.
    report = run_chaos(plan, chaos_workdir("rolling"), [Fault(5.0, "rolling-restart", "cluster")],
                       stack_class=lambda _state_dir, _joiner: cluster, running=True, keep_running=True)
    print(report.summary())
    (document,) = cluster.rollings
    assert [step["name"] for step in document["steps"]] == ["kafka-1", "kafka-2", "kafka-3"], document
    print(f"rolling restart in {document['took_s']:.0f} s: " + "; ".join(document["seen"]))
