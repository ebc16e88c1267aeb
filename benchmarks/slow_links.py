"""`python -m benchmarks.slow_links` (`make bench-links`): the cluster across hosts (TOPOLOGY=hosts) with the
devices' link to Mosquitto undelayed and then with a stated round-trip delay, in one run.

The stack is brought up on hosts of its own (`STACK_HOSTS_PREFIX`, a state dir of its own), so a running one is not
touched. On the operator host a Toxiproxy (ops/stack/toxiproxy.py) forwards 127.0.0.1:PROXY_PORT to Mosquitto's
TLS listener on host `mqtt`; the devices (the simulator) publish through it both times, so the delay is the only
difference. A warm-up run (the joiner's first batches) comes first; each run replays the same events file
(`--ending-now`: each run's rows are new to the joiners) as fast as Mosquitto's acknowledgements allow, and waits
until machine.out holds every join of the run. Figures per run:
the publisher's rows/s, rows/s end to end (first publish to the last join's timestamp), and the joins the run added,
which must be the same in every run: the delay slows the pipeline, it must not change its output.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from benchmarks.topology import read_joins
from pipeline_core import credentials
from pipeline_core.kafka_clients import security_config
from pipeline_core.settings import KafkaSettings, load_settings
from simulator.settings import DEFAULT_EVENTS_FILE
from stack import netns, toxiproxy

from benchmarks.results import Results

REPO_ROOT = Path(__file__).resolve().parents[1]
API_PORT = 8474
PROXY_PORT = 18883
PROXY = "devices-to-mqtt"


@dataclass(frozen=True)
class LinkResult:
    round_trip_ms: int
    rows: int
    publish_s: float
    end_to_end_s: float
    joins: int

    def line(self) -> str:
        return (f"RTT +{self.round_trip_ms:>4} ms   publish {self.rows / self.publish_s:8,.0f} rows/s   "
                f"end to end {self.rows / self.end_to_end_s:7,.0f} rows/s ({self.end_to_end_s:.1f} s, "
                f"{self.joins:,} joins)")


def measure(events_file: Path, round_trips_ms: list[int], settled_s: float) -> list[LinkResult]:
    """On the operator host: a warm-up run (the joiner's first batches, not compared), then each run through the
    proxy with its delay; the joins each added, which must be the warm-up's."""
    values = credentials.read_credentials()
    security = security_config(load_settings(KafkaSettings, [], environ={
        **os.environ, **credentials.environment("admin", values)}))
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    # Mosquitto's certificate holds 127.0.0.1 too: the devices verify it through the proxy as they would directly.
    devices = {**os.environ, "MQTT_HOST": "127.0.0.1", "MQTT_PORT": str(PROXY_PORT)}
    rows = sum(1 for line in events_file.open() if line.strip())
    results: list[LinkResult] = []
    joins_before, joins_per_run = 0, None
    with toxiproxy.ToxiproxyServer(API_PORT) as server:
        server.client.create_proxy(PROXY, f"127.0.0.1:{PROXY_PORT}", f"{os.environ['MQTT_HOST']}:{os.environ['MQTT_PORT']}")
        for run, round_trip_ms in enumerate([0, *round_trips_ms]):
            if round_trip_ms:
                toxiproxy.delay_link(server.client, PROXY, round_trip_ms)
            published_at, began = time.time(), time.monotonic()
            done = subprocess.run([sys.executable, "-m", "simulator", "--events-file", str(events_file),
                                   "--ending-now", "--no-progress"], env=devices, cwd=REPO_ROOT,
                                  capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                raise SystemExit(f"the replay failed:\n{done.stdout}{done.stderr}")
            publish_s = time.monotonic() - began
            expected = None if joins_per_run is None else joins_before + joins_per_run
            total, last_ms = read_joins(bootstrap, expected, security, settled_s=settled_s)
            added, joins_before = total - joins_before, total
            if round_trip_ms:
                toxiproxy.restore_link(server.client, PROXY)
            if joins_per_run is None:
                joins_per_run = added
                print(f"warm-up: {added:,} joins (each run must add as many)", flush=True)
                continue
            if added != joins_per_run:
                raise SystemExit(f"the run with +{round_trip_ms} ms added {added} joins, the warm-up "
                                 f"{joins_per_run}: the delay changed the output")
            results.append(LinkResult(round_trip_ms, rows, publish_s, last_ms / 1000 - published_at, added))
            print(results[-1].line(), flush=True)
    return results


def record(recorded: Results, results: list[LinkResult]) -> None:
    """Per added round-trip time, the median of its runs; the delayed runs against the undelayed ones."""
    by_delay: dict[int, list[LinkResult]] = {}
    for result in results:
        by_delay.setdefault(result.round_trip_ms, []).append(result)
    end_to_end = {}
    for round_trip_ms, runs in sorted(by_delay.items()):
        at = f"round trip +{round_trip_ms} ms"
        recorded.add(f"{at}: publishing", statistics.median(run.rows / run.publish_s for run in runs), "rows/s")
        end_to_end[round_trip_ms] = statistics.median(run.rows / run.end_to_end_s for run in runs)
        recorded.add(f"{at}: end to end", end_to_end[round_trip_ms], "rows/s")
    for round_trip_ms, rate in end_to_end.items():
        if round_trip_ms and 0 in end_to_end:
            recorded.add(f"round trip +{round_trip_ms} ms / undelayed, end to end", rate / end_to_end[0], "x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slow_links", description=__doc__.splitlines()[0])
    parser.add_argument("--round-trip-ms", type=int, default=50, help="the delayed run's added round-trip time")
    parser.add_argument("--rounds", type=int, default=2, help="undelayed and delayed runs, alternating, this often")
    parser.add_argument("--events-file", type=Path, default=DEFAULT_EVENTS_FILE)
    parser.add_argument("--joiner", choices=("spark", "lsb"), default=os.environ.get("JOINER", "spark"))
    parser.add_argument("--settled-s", type=float, default=20.0,
                        help="the first run's machine.out unchanged this long: all its joins are in")
    parser.add_argument("--on-operator", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--command-argv", help=argparse.SUPPRESS)  # the run's own flags, for its results
    args = parser.parse_args(argv)
    if args.on_operator:
        recorded = Results("slow_links", json.loads(args.command_argv) if args.command_argv else None)
        record(recorded, measure(args.events_file.resolve(), [0, args.round_trip_ms] * args.rounds, args.settled_s))
        recorded.write()
        return 0
    netns.preflight()
    toxiproxy.ensure_installed()  # here: the hosts reach no module proxy
    state_dir = Path(tempfile.mkdtemp(prefix="bench-links-"))
    env = {**os.environ, "TOPOLOGY": "hosts", "JOINER": args.joiner, "STACK_STATE_DIR": str(state_dir),
           "STACK_HOSTS_PREFIX": f"bl{uuid.uuid4().hex[:8]}"}

    def stack(*arguments: str, quiet: bool = True) -> int:
        return subprocess.run([sys.executable, "-m", "stack", *arguments], env=env, cwd=REPO_ROOT,
                              stdout=subprocess.DEVNULL if quiet else None, timeout=3600).returncode

    print(f"TOPOLOGY=hosts, JOINER={args.joiner}, {args.events_file.name}; the devices' link to Mosquitto "
          f"through Toxiproxy, undelayed then +{args.round_trip_ms} ms round trip; {os.cpu_count()} cores", flush=True)
    try:
        began = time.monotonic()
        if stack("up") != 0:
            return 1
        print(f"up in {time.monotonic() - began:.1f} s", flush=True)
        code = stack("run", "--", sys.executable, "-m", "benchmarks.slow_links", "--on-operator",
                     "--round-trip-ms", str(args.round_trip_ms), "--rounds", str(args.rounds),
                     "--events-file", str(args.events_file.resolve()),
                     "--settled-s", str(args.settled_s),
                     "--command-argv", json.dumps(sys.argv[1:] if argv is None else argv), quiet=False)
    finally:
        stack("clean")
        shutil.rmtree(state_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
