"""Which topology the stack runs: TOPOLOGY=single, cluster or hosts (the cluster placed on several hosts by the
inventory, `placement`), and the cluster's Kafka nodes. It imports nothing
of the stack: the services, their security and the cluster's modules all ask it.

The state dir records the topology its `up` last ran, so `status`, `logs` and `down` without TOPOLOGY act on what
runs; `clean` deletes the record with the rest."""
from __future__ import annotations

import os

from pipeline_core import paths
from .processes import StackError

SINGLE = "single"
CLUSTER = "cluster"
HOSTS = "hosts"
TOPOLOGIES = (SINGLE, CLUSTER, HOSTS)
# The ids of the cluster's Kafka nodes (combined KRaft broker + controller each).
KAFKA_NODES = (1, 2, 3)


def _record():
    return paths.STATE_DIR / "topology"


def recorded() -> str | None:
    """The topology this state dir's `up` last ran, if any."""
    try:
        return _record().read_text().strip() or None
    except FileNotFoundError:
        return None


def current() -> str:
    """TOPOLOGY from the environment, else what the state dir runs, else single."""
    chosen = os.environ.get("TOPOLOGY") or recorded() or SINGLE
    if chosen not in TOPOLOGIES:
        raise StackError(f"TOPOLOGY={chosen!r}: choose one of {', '.join(TOPOLOGIES)}")
    return chosen


def record(topology: str) -> None:
    _record().parent.mkdir(parents=True, exist_ok=True)
    _record().write_text(topology + "\n")


def is_cluster() -> bool:
    """The cluster's programs run: on this host, or placed on several (hosts)."""
    return current() in (CLUSTER, HOSTS)


def is_hosts() -> bool:
    return current() == HOSTS
