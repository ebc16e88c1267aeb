"""TOPOLOGY=cluster for the chaos machinery: a private cluster stack (three Kafka nodes, the Spark master and
workers, every scaled stage as two instances) on ports of its own, and the seeded schedule of faults for it."""
from __future__ import annotations

import random
from pathlib import Path

from chaos_support import ChaosPlan, Fault, PrivateStack
from pipeline_core.settings import MqttSettings
from stack.topology import CLUSTER_PORTS, SINGLE_PORTS, private_ports
from support import private_port_range

KAFKA_NODES = (1, 2, 3)
SPARK_WORKERS = (1, 2)
INSTANCES = (1, 2)


class PrivateClusterStack(PrivateStack):
    """`python -m stack` with TOPOLOGY=cluster, its own state folder and ports."""

    def __init__(self, state_dir: Path, joiner: str) -> None:
        super().__init__(state_dir, joiner)
        ports = private_ports(SINGLE_PORTS + CLUSTER_PORTS, private_port_range())
        self.bootstrap = ",".join(f"127.0.0.1:{ports[name]}"
                                  for name in ("KAFKA_PORT", "KAFKA_NODE2_PORT", "KAFKA_NODE3_PORT"))
        self.assigned_ports = dict(ports)
        self.env.update({name: str(port) for name, port in ports.items()})
        self.env.update(TOPOLOGY="cluster", KAFKA_BOOTSTRAP_SERVERS=self.bootstrap)
        self.mqtt = MqttSettings(mqtt_port=ports["MQTT_PORT"])
        self.influxdb_port = ports["INFLUXDB_PORT"]


def cluster_fault_schedule(plan: ChaosPlan, replay_s: float) -> list[Fault]:
    """SIGKILLs, at seeded moments spread over 10-85% of the replay, of: one Kafka node (supervision restarts
    it), the stream connector and one instance of each scaled stage (the DB connector; the standalone joiner with
    JOINER=lsb); with JOINER=spark, one Spark worker (with its executors), one executor alone on the other
    worker, and the Spark driver. Each `kills_per_stage` times."""
    rng = random.Random(plan.seed)
    targets = [f"kafka-{rng.choice(KAFKA_NODES)}", "stream-connector", f"db-connector-{rng.choice(INSTANCES)}"]
    if plan.joiner == "spark":
        worker = rng.choice(SPARK_WORKERS)
        targets += [f"spark-worker-{worker}", "spark-joiner"]
        other = next(index for index in SPARK_WORKERS if index != worker)
        faults = [("kill", target) for target in targets] + [("kill-executor", f"spark-worker-{other}")]
    else:
        targets += [f"lsb-joiner-{rng.choice(INSTANCES)}"]
        faults = [("kill", target) for target in targets]
    actions = [fault for fault in faults for _ in range(plan.kills_per_stage)]
    rng.shuffle(actions)
    # The executor kills take the earliest of the slots they share with the driver's: a driver's kill takes the
    # executors with it, and the next driver's come only once it runs again, a minute later on two cores.
    slots = [n for n, (action, target) in enumerate(actions) if action == "kill-executor" or target == "spark-joiner"]
    for n, fault in zip(slots, sorted((actions[n] for n in slots), key=lambda fault: fault[0] != "kill-executor")):
        actions[n] = fault
    slot = 0.75 * replay_s / len(actions)
    return [Fault(round(0.10 * replay_s + i * slot + rng.uniform(0, 0.5 * slot), 1), action, target)
            for i, (action, target) in enumerate(actions)]
