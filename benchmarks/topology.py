"""`python -m benchmarks.topology` (`make bench-topology`): TOPOLOGY=single against TOPOLOGY=cluster on this host,
in one run, with the same rows through each.

Each topology is brought up by `python -m stack up` in a state dir and on ports of its own (free ones, or
BENCH_PORTS=first-last), so a running stack is not touched. The same synthetic rows (20 machines by default) are
then published to Mosquitto as fast as its acknowledgements allow, and the run waits for machine.out to hold every
join. Figures per topology: the time `up` took, the publisher's rows/s, and rows/s end to end, from the first
publish to the last join's timestamp in machine.out (so the polling of the read-back is not counted). The stack is
stopped and deleted before the next one starts: the two never share the cores. The cluster is always secure
(SASL_SSL, TLS), the single stack as `make up` runs it by default: the figures include what security costs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from pipeline_core import credentials
from pipeline_core.kafka_clients import consumer_config, security_config
from pipeline_core.settings import KafkaSettings, load_settings
from pipeline_core.topics import MACHINE_OUT
from stack.choice import CLUSTER, SINGLE
from stack.topology import CLUSTER_PORTS, SINGLE_PORTS, private_ports

from benchmarks.results import Results

REPO_ROOT = Path(__file__).resolve().parents[1]
# machine.out stops growing for this long once every row is in: the join count of the run (--settled-s).
SETTLED_S = 20.0


@dataclass(frozen=True)
class TopologyResult:
    topology: str
    up_s: float
    rows: int
    publish_s: float
    end_to_end_s: float
    joins: int

    def line(self) -> str:
        return (f"{self.topology:<8} up {self.up_s:6.1f} s   publish {self.rows / self.publish_s:8,.0f} rows/s   "
                f"end to end {self.rows / self.end_to_end_s:7,.0f} rows/s ({self.end_to_end_s:.1f} s, "
                f"{self.joins:,} joins)")


def run(topology: str, joiner: str, rows_file: Path, rows: int, expected_joins: int | None,
        port_range: str | None, settled_s: float = SETTLED_S) -> TopologyResult:
    state_dir = Path(tempfile.mkdtemp(prefix=f"bench-{topology}-"))
    names = SINGLE_PORTS + (CLUSTER_PORTS if topology == CLUSTER else ())
    ports = private_ports(names, port_range)
    kafka = [ports["KAFKA_PORT"]] + ([ports["KAFKA_NODE2_PORT"], ports["KAFKA_NODE3_PORT"]]
                                     if topology == CLUSTER else [])
    bootstrap = ",".join(f"127.0.0.1:{port}" for port in kafka)
    env = {**os.environ, **{name: str(port) for name, port in ports.items()}, "TOPOLOGY": topology,
           "JOINER": joiner, "STACK_STATE_DIR": str(state_dir), "KAFKA_BOOTSTRAP_SERVERS": bootstrap}

    def stack(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "stack", *args], env=env, cwd=REPO_ROOT, check=True,
                       stdout=subprocess.DEVNULL, timeout=1200)

    try:
        began = time.monotonic()
        # Inside the try: a stack whose `up` failed (a port taken meanwhile, a node exiting) is cleaned too,
        # not left running under its supervisord.
        stack("up")
        up_s = time.monotonic() - began
        published_at = time.time()
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "simulator", "--events-file", str(rows_file), "--order", "file",
                        "--no-progress"], env=env, cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL,
                       timeout=1200)
        publish_s = time.monotonic() - began
        values = credentials.read_credentials(state_dir / "credentials.env")  # the cluster's: read as admin
        security = security_config(load_settings(KafkaSettings, [], environ={
            **env, **credentials.environment("admin", values)})) if values else {}
        joins, last_join_ms = read_joins(bootstrap, expected_joins, security, settled_s=settled_s)
    finally:
        stack("clean")
        shutil.rmtree(state_dir, ignore_errors=True)
    return TopologyResult(topology, up_s, rows, publish_s, last_join_ms / 1000 - published_at, joins)


def read_joins(bootstrap: str, expected: int | None, security: dict[str, str],
               deadline_s: float = 1800.0, settled_s: float = SETTLED_S) -> tuple[int, int]:
    """machine.out's committed joins and the timestamp (ms) of the last: once `expected` are in, or (None) once
    it stopped growing for `settled_s`."""
    consumer = Consumer(consumer_config(bootstrap, f"bench-topology-{os.getpid()}-{time.time_ns()}", **security))
    partitions = len(consumer.list_topics(MACHINE_OUT.name, timeout=30).topics[MACHINE_OUT.name].partitions)
    consumer.assign([TopicPartition(MACHINE_OUT.name, p, 0) for p in range(partitions)])
    count, last_ms = 0, 0
    last_arrival = time.monotonic()
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            if expected is not None and count >= expected:
                break
            if expected is None and count and time.monotonic() - last_arrival > settled_s:
                break
            for message in consumer.consume(10_000, timeout=1.0):
                if message.error() is None:
                    count += 1
                    last_ms = max(last_ms, message.timestamp()[1])
                    last_arrival = time.monotonic()
    finally:
        consumer.close()
    if expected is not None and count < expected:
        raise SystemExit(f"machine.out held {count} joins of {expected} after {deadline_s:.0f} s")
    return count, last_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.topology", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30_000)
    parser.add_argument("--machines", type=int, default=20)
    parser.add_argument("--joiner", choices=("spark", "lsb"), default=os.environ.get("JOINER", "spark"))
    parser.add_argument("--settled-s", type=float, default=SETTLED_S,
                        help="the single stack's machine.out unchanged this long: all its joins are in (the "
                             "cluster's run waits for as many)")
    parser.add_argument("--ports", default=os.environ.get("BENCH_PORTS"),
                        help="first-last: the stacks' ports from this range (default: any free ones)")
    args = parser.parse_args(argv)
    recorded = Results("topology", argv)
    with tempfile.TemporaryDirectory(prefix="bench-topology-") as work:
        rows_file = Path(work) / "rows.json"
        subprocess.run([sys.executable, "-m", "simulator", "--synthetic", "--machines", str(args.machines),
                        "--axes", "1", "--limit", str(args.rows), "--output", str(rows_file)],
                       check=True, cwd=REPO_ROOT, capture_output=True)
        print(f"{args.rows:,} synthetic rows of {args.machines} machines, JOINER={args.joiner}, "
              f"{os.cpu_count()} cores")
        single = run(SINGLE, args.joiner, rows_file, args.rows, None, args.ports, args.settled_s)
        print(single.line(), flush=True)
        cluster = run(CLUSTER, args.joiner, rows_file, args.rows, single.joins, args.ports)
        print(cluster.line())
    print(f"cluster / single end to end: {single.end_to_end_s / cluster.end_to_end_s:.2f}x")
    for result in (single, cluster):
        recorded.add(f"TOPOLOGY={result.topology}: make up", result.up_s, "s")
        recorded.add(f"TOPOLOGY={result.topology}: publishing", result.rows / result.publish_s, "rows/s")
        recorded.add(f"TOPOLOGY={result.topology}: end to end", result.rows / result.end_to_end_s, "rows/s")
    recorded.add("cluster / single, end to end", single.end_to_end_s / cluster.end_to_end_s, "x")
    recorded.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
