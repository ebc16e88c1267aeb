"""`make chaos TOPOLOGY=cluster`: the cluster topology (three Kafka nodes with replication factor 3 and
min.insync.replicas 2, a Spark standalone master and two workers, two DB connectors in one group) under faults.

The storm: a synthetic replay of 50,000 rows from 20 machines with bad rows mixed in, while a seeded schedule
SIGKILLs one Kafka node (supervision restarts it), the stream connector, one DB connector and, with the Spark
joiner, one Spark worker with its executors and the Spark driver, or one of the two standalone joiners. Afterwards machine.out (read_committed) equals the offline join of
machine.data, InfluxDB holds every raw and joined point once and machine.dlq exactly the bad rows. The cluster is
secure, as always (SASL_SSL, ACLs, TLS): the test reads every topic as its admin, publishes as a device and reads
InfluxDB as the reader.

Two of three nodes down: the survivor refuses writes with acks=all (no quorum, no second in-sync replica),
nothing it acknowledged before is lost, and the rows published meanwhile wait in Mosquitto (the stream
connector acknowledges an MQTT message only once Kafka has its records) and arrive once the nodes return.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer

from chaos_support import (REPO_ROOT, ChaosPlan, ChaosReport, RowPublisher, canonical, chaos_workdir,
                           check_outcome, run_chaos)
from cluster_support import PrivateClusterStack, cluster_fault_schedule
from connector_support import expected_records, read_rows
from pipeline_core.kafka_clients import admin_client, producer_config
from pipeline_core.mqtt import DEVICE_CLIENT_ID
from pipeline_core.topics import MACHINE_DATA, TopicSpec, ensure_topics
from support import processes_under, read_topic, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.mark.timeout(3600)
@pytest.mark.parametrize("joiner", ["spark", "lsb"])
def test_the_cluster_survives_a_storm_of_faults(joiner: str):
    plan = ChaosPlan(joiner=joiner, rows=50_000, machines=20, rate=300.0, bad_rows=60, kills_per_stage=1)
    faults = cluster_fault_schedule(plan, plan.rows / plan.rate)
    report = run_chaos(plan, chaos_workdir("cluster-chaos"), faults, stack_class=PrivateClusterStack)
    print(report.summary())


@pytest.mark.timeout(1800)
def test_with_two_of_three_kafka_nodes_down_writes_are_refused_and_rows_wait_in_mosquitto():
    workdir = chaos_workdir("cluster-quorum")
    plan = ChaosPlan(joiner="lsb", rows=4_000, machines=20, rate=0.0, bad_rows=0)
    rows_file = workdir / "rows.json"
    subprocess.run([sys.executable, "-m", "simulator", "--synthetic", "--machines", str(plan.machines), "--axes", "1",
                    "--limit", str(plan.rows), "--seed", str(plan.seed), "--output", str(rows_file)],
                   check=True, cwd=REPO_ROOT, capture_output=True)
    lines = rows_file.read_text().splitlines(keepends=True)
    before, during = workdir / "before.json", workdir / "during.json"
    before.write_text("".join(lines[: len(lines) // 2]))
    during.write_text("".join(lines[len(lines) // 2:]))
    rows = {json.dumps(row).encode(): {canonical(record) for record in expected_records([row])}
            for row in read_rows(rows_file)}
    stack = PrivateClusterStack(workdir / "stack", plan.joiner)
    try:
        # Inside: an `up` that fails (a process never healthy) leaves the others running until `down`.
        stack.stack("up", timeout_s=900)
        probe = "cluster.quorum.probe"
        security = stack.kafka_security  # the cluster is secure: the test's clients are its admin
        ensure_topics(admin_client(stack.bootstrap, **security), (TopicSpec(probe, 3),))
        publish(stack, before)
        acknowledged = {canonical(record) for row in read_rows(before) for record in expected_records([row])}
        wait_for(lambda: {canonical(m.value) for m in read_topic(stack.bootstrap, MACHINE_DATA.name,
                                                                  security=security)} >= acknowledged,
                 300, "the first half of the rows in machine.data", interval_s=2.0)

        stack.stop("kafka-2", "kafka-3")
        outcomes = produce_and_wait(stack.bootstrap.split(",")[0], probe, records=20, timeout_ms=15_000,
                                    security=security)
        assert outcomes and all(error is not None for error in outcomes), \
            f"the one node left acknowledged writes with acks=all: {outcomes}"
        # Mosquitto takes the rows meanwhile; the stream connector holds each MQTT message unacknowledged
        # until Kafka has its records.
        publish(stack, during)

        stack.start("kafka-2", "kafka-3")
        report = ChaosReport(plan)
        check_outcome(stack, report, rows, [], {})
        print(f"two of three Kafka nodes down: {len(outcomes)} writes refused "
              f"({', '.join(sorted({error for error in outcomes if error}))}); {report.records} records, "
              f"{report.joins} joins after they returned")

        stack.stack("down", timeout_s=300)
        assert processes_under(stack.state_dir) == set()  # `make down` leaves no process of the cluster
        # Each Kafka node stopped by its SIGTERM: none waited for a quorum that was gone until it was killed.
        assert "killing 'kafka" not in (stack.state_dir / "supervisor" / "supervisord.log").read_text()
    finally:
        stack.stack("down", timeout_s=300)
    shutil.rmtree(workdir, ignore_errors=True)  # kept only when the test failed


def publish(stack: PrivateClusterStack, rows_file) -> None:
    """Every row of `rows_file`, acknowledged by Mosquitto (QoS 1), in file order."""
    publisher = RowPublisher(stack.simulator_settings("--events-file", str(rows_file), "--order", "file",
                                                      "--drain-timeout-s", "300"),
                             DEVICE_CLIENT_ID)  # the secure cluster's device has this one client id
    publisher.start()
    publisher.join(timeout=600)
    assert not publisher.is_alive() and publisher.error is None, publisher.error


def produce_and_wait(bootstrap: str, topic: str, records: int, timeout_ms: int,
                     security: dict[str, str]) -> list[str | None]:
    """Produce with the pipeline's producer settings (acks=all, idempotent) and wait for every delivery report:
    the error's name of each, or None for a record the cluster acknowledged."""
    outcomes: list[str | None] = []
    producer = Producer(producer_config(bootstrap, **security, **{"message.timeout.ms": timeout_ms}))
    for n in range(records):
        producer.produce(topic, f"probe {n}".encode(),
                         on_delivery=lambda error, _message: outcomes.append(error.name() if error else None))
    end = time.monotonic() + timeout_ms / 1000 + 60
    while len(outcomes) < records and time.monotonic() < end:
        producer.poll(0.5)
    return outcomes
