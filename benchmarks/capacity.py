"""`python -m benchmarks.capacity` (in `make bench`): the highest rate the whole single stack sustains, with each joiner
and with a pass-through in place of the join (the pipeline's own ceiling), the CPU each process spends per row at
that rate, and the end-to-end latency at 0.7 of it: the table a plant sizes its hardware by.

Each pipeline runs on a stack of its own (`python -m stack up` in a state folder and on ports of its own; the
pass-through is the standalone joiner's stack with its joiner stopped and `benchmarks.capacity_passthrough` started
in its place), fed by the soak's plant (`soak.plant`: 500 machines of 3 axes by default, the real rows' mix):

1. probe: the soak's pace (`soak.pace.PaceController`) finds the rate at which rows leave the pipeline while it
   always has work (`--probe-s`);
2. hold: that rate (times 0.95) held for `--hold-minutes` (10); sustained when the rows waiting in the pipeline (in
   Mosquitto's queue and in every stage's lag) do not grow: their trend over the hold under `GROWTH_LIMIT` of the
   rate, and at its end under a minute's rows. If not, the rate goes down by a tenth and is held again;
3. latency: 0.7 of the sustained rate held `--latency-s`, its probe rows timed from their publish to their joined
   point in InfluxDB (`soak.latency`).

The CPU time of each program's process tree over the sustained hold, per row published, says where the cores go.
Results: `reports/capacity-<time>/results.json` (the soak's backfill starts from them), the table printed, and the
figures recorded (`benchmarks/results/capacity.json`, rendered in docs/scaling.md): per pipeline the sustained rate,
the CPU per row of each process and the cores all of them kept busy, the latency at 0.7.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results import Results

REPO_ROOT = Path(__file__).resolve().parents[1]
PIPELINES = ("lsb", "spark", "pass-through")
GROWTH_LIMIT = 0.01  # of the rate: the backlog's trend over a hold, rows/s, that still counts as not growing
END_BACKLOG_S = 60.0  # the backlog at a hold's end, in seconds of the rate, at most
SETTLE_S = 60.0  # of each hold, left out of its trend: the pipeline takes up the new rate
MAX_HOLDS = 4
PROGRESS_EVERY_S = 60.0  # a line while a rate is held
FIGURES_MARK = "capacity:"  # the line each pipeline's figures are printed on


@dataclass
class Hold:
    rate_rows_s: float
    seconds: float
    rows: int
    records: int
    backlog_trend_rows_s: float
    backlog_end_rows: float
    sustained: bool
    cpu_us_per_row: dict[str, float] = field(default_factory=dict)
    cpu_cores: dict[str, float] = field(default_factory=dict)


def sustained(times: np.ndarray, backlog: np.ndarray, rate: float) -> tuple[bool, float, float]:
    """Whether a hold's backlog did not grow: (verdict, trend in rows/s, backlog at the end)."""
    if len(times) < 3:
        return False, float("nan"), float("nan")
    trend = float(np.polyfit(times - times[0], backlog, 1)[0])
    end = float(np.median(backlog[-3:]))
    return trend <= GROWTH_LIMIT * rate and end <= END_BACKLOG_S * rate, trend, end


# -- one pipeline, measured in a process that runs with its stack's environment ---------------------------------


def measure(pipeline: str, args: argparse.Namespace) -> dict[str, Any]:
    """Runs inside the stack's environment (its state dir, its ports): probe, holds, latency."""
    from pipeline_core import credentials, paths
    from pipeline_core.broker_offsets import BrokerOffsets
    from pipeline_core.influx import influx_client
    from pipeline_core.kafka_clients import admin_client, security_config
    from pipeline_core.settings import ConnectionSettings, InfluxSettings, MqttSettings, load_settings
    from pipeline_core.stage_health import assess, read_heartbeat
    from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT
    from soak.latency import LatencyProbe
    from soak.monitor import Monitor
    from soak.names import plant_names
    from soak.pace import PaceController, backlog_rows
    from soak.plant import Plant
    from soak.publisher import PlantRun, start
    from stack import manager

    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    settings = load_settings(ConnectionSettings, [], environ=credentials.environ_for("admin"))
    bootstrap, security = settings.kafka_bootstrap_servers, security_config(settings)
    topics = (MACHINE_DATA.name, MACHINE_OUT.name, MACHINE_DLQ.name)
    partitions = {topic: len(meta.partitions) for topic, meta in
                  admin_client(bootstrap, **security).list_topics(timeout=30).topics.items() if topic in topics}
    offsets = BrokerOffsets(bootstrap, 10.0, security={**security, "log_level": 0})
    services = [service for service in manager.all_services()
                if not (pipeline == "pass-through" and service.name == "lsb-joiner")]
    plant = Plant(args.machines, args.axes, args.seed, args.probes)
    names = plant_names(args.machines, "cap", args.seed)
    now_ms = int(time.time() * 1000)
    mqtt = load_settings(MqttSettings, [], environ=credentials.environ_for("device"))
    run = PlantRun(args.machines, args.axes, args.seed, len(plant.probe_machines), tuple(names),
                   now_ms - 2 * 86_400_000, 1000, 1000, run_dir, mqtt, f"capacity-{os.getpid()}")
    process, shared = start(run)
    shared.set("backfill_end_s", time.time() + 30 * 86_400)  # never live: one round a second of event time
    heartbeat = paths.STATE_DIR / "pass-through" / "progress.json"

    def pass_through() -> dict[str, dict[str, Any]]:
        if pipeline != "pass-through":
            return {}
        found = read_heartbeat(heartbeat)
        health = assess(found, time.time())
        return {"pass-through": {"state": "RUNNING", "pid": found.pid if found else None, "healthy": health.healthy,
                                 "restarts": 0, "lag": health.lag, "stage_state": health.state}}

    monitor = Monitor(services, partitions, offsets, run_dir, shared.snapshot,
                      lambda: {"publisher": process.pid or 0}, interval_s=5.0, disk_every=1_000_000,
                      extra_stages=pass_through)
    monitor.start()
    start_offsets = offsets.latest([(MACHINE_DATA.name, p) for p in range(partitions[MACHINE_DATA.name])])
    records_base = sum(start_offsets.values()) if start_offsets else 0
    client = influx_client(load_settings(InfluxSettings, [], environ=credentials.environ_for("admin")))
    query = lambda text: list(client.query(text, epoch="ns").get_points())  # noqa: E731
    result: dict[str, Any] = {"name": pipeline, "machines": args.machines, "axes": args.axes}
    try:
        # 1. probe
        pace = PaceController(args.start_rate, 50.0, 500_000.0)
        shared.set("rate_rows_s", pace.rate_rows_s)
        estimates = []
        end = time.monotonic() + args.probe_s
        while time.monotonic() < end:
            time.sleep(5.0)
            sample = monitor.latest()
            if sample:
                shared.set("rate_rows_s", pace.update(sample["at"], sample["publisher"]["rows_acked"],
                                                      backlog_rows(sample, records_base)))
                if pace.throughput_rows_s:
                    estimates.append(pace.throughput_rows_s)
        probed = float(np.median(estimates[len(estimates) // 2:])) if estimates else args.start_rate
        result["probed_rows_s"] = probed
        print(f"{pipeline}: the pipeline passed about {probed:,.0f} rows/s at full pace", flush=True)
        # 2. holds
        holds = []
        rate = 0.95 * probed
        for _ in range(MAX_HOLDS):
            hold = _hold(rate, args.hold_minutes * 60, monitor, shared, records_base)
            holds.append(hold)
            print(f"{pipeline}: {rate:,.0f} rows/s held {hold.seconds / 60:.1f} min: "
                  f"{'sustained' if hold.sustained else 'not sustained'} (backlog trend "
                  f"{hold.backlog_trend_rows_s:+,.1f} rows/s, {hold.backlog_end_rows:,.0f} rows at the end)", flush=True)
            if hold.sustained:
                break
            rate *= 0.9
            _drain(monitor, shared, records_base, 300.0)
        result["holds"] = [asdict(hold) for hold in holds]
        best = next((hold for hold in holds if hold.sustained), None)
        result["sustained_rows_s"] = best.rate_rows_s if best else None
        result["records_per_row"] = best.records / best.rows if best and best.rows else None
        result["cpu_us_per_row"] = best.cpu_us_per_row if best else {}
        result["cpu_cores"] = best.cpu_cores if best else {}
        # 3. latency at 0.7 of it
        if best and args.latency_s > 0:
            _drain(monitor, shared, records_base, 300.0)
            began = time.time()
            probe = LatencyProbe(run_dir, names, query, sent_from=began)
            probe.start()
            _hold(0.7 * best.rate_rows_s, args.latency_s, monitor, shared, records_base)
            latencies = [latency for sent_at, latency in probe.samples() if sent_at >= began + 10]
            probe.stop()
            result["latency_rate_rows_s"] = 0.7 * best.rate_rows_s
            result["latency_samples"] = len(latencies)
            if latencies:
                result["latency_p50_s"], result["latency_p99_s"] = (float(v) for v in np.percentile(latencies, [50, 99]))
                result["latency_max_s"] = float(max(latencies))
    finally:
        shared.set("stop", 1)
        process.join(timeout=300)
        monitor.stop()
    return result


def _hold(rate: float, seconds: float, monitor: Any, shared: Any, records_base: int) -> Hold:
    from soak.pace import backlog_rows
    shared.set("rate_rows_s", rate)
    began = time.time()
    while (left_s := began + seconds - time.time()) > 0:
        time.sleep(min(PROGRESS_EVERY_S, left_s))
        backlog = backlog_rows(monitor.latest(), records_base)
        print(f"  {rate:,.0f} rows/s for {(time.time() - began) / 60:.0f} of {seconds / 60:.0f} min, "
              f"{'backlog ' + format(backlog, ',.0f') + ' rows' if backlog is not None else 'no sample yet'}",
              flush=True)
    samples = [s for s in monitor.samples if s["at"] >= began]
    measured = [s for s in samples if s["at"] >= began + min(SETTLE_S, seconds / 3)]
    points = [(s["at"], backlog_rows(s, records_base)) for s in measured]
    points = [(at, backlog) for at, backlog in points if backlog is not None]
    verdict, trend, end = sustained(np.array([p[0] for p in points]), np.array([p[1] for p in points]), rate)
    first, last = (measured[0], measured[-1]) if len(measured) > 1 else (None, None)
    hold = Hold(rate, seconds, 0, 0, trend, end, verdict)
    if first and last:
        hold.rows = int(last["publisher"]["rows_acked"] - first["publisher"]["rows_acked"])
        hold.records = int(last["publisher"]["records_sent"] - first["publisher"]["records_sent"])
        elapsed = last["at"] - first["at"]
        for program, usage in last["usage"].items():
            before = first["usage"].get(program)
            if before is None or usage["cpu_s"] < before["cpu_s"]:
                continue  # restarted within the hold: no figure
            spent = usage["cpu_s"] - before["cpu_s"]
            hold.cpu_us_per_row[program] = spent / max(hold.rows, 1) * 1e6
            hold.cpu_cores[program] = spent / elapsed
    return hold


def _drain(monitor: Any, shared: Any, records_base: int, deadline_s: float) -> None:
    """Next to nothing published until the backlog is gone (the next hold starts from an empty pipeline)."""
    from soak.pace import backlog_rows
    shared.set("rate_rows_s", 1.0)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        time.sleep(5.0)
        sample = monitor.latest()
        backlog = backlog_rows(sample, records_base)
        if backlog is not None and backlog < 100:
            return


# -- the runs, each on a stack of its own --------------------------------------------------------------------------


def stack_environment(pipeline: str, state_dir: Path, port_range: str | None) -> dict[str, str]:
    from stack.topology import SINGLE_PORTS, private_ports
    ports = private_ports(SINGLE_PORTS, port_range)
    return {**os.environ, **{name: str(port) for name, port in ports.items()}, "TOPOLOGY": "single",
            "JOINER": "spark" if pipeline == "spark" else "lsb", "STACK_STATE_DIR": str(state_dir),
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{ports['KAFKA_PORT']}", "PYTHONPATH": str(REPO_ROOT)}


def run_pipeline(pipeline: str, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    state_dir = Path(tempfile.mkdtemp(prefix=f"capacity-{pipeline}-"))
    env = stack_environment(pipeline, state_dir, args.ports)

    def stack(*command: str) -> None:
        subprocess.run([sys.executable, "-m", "stack", *command], env=env, cwd=REPO_ROOT, check=True,
                       stdout=subprocess.DEVNULL, timeout=1200)

    pass_through = None
    try:
        stack("up")
        if pipeline == "pass-through":
            config = state_dir / "supervisor" / "supervisord.conf"
            subprocess.run([sys.executable, "-m", "supervisor.supervisorctl", "-c", str(config), "stop", "lsb-joiner"],
                           env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)
            (state_dir / "pass-through").mkdir(exist_ok=True)
            log = (state_dir / "pass-through" / "pass-through.log").open("ab")
            pass_through = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.capacity_passthrough", "--group-id", "capacity-pass-through",
                 "--transactional-id-prefix", "capacity-pass-through", "--instance-id", "pass-through",
                 "--input-partitioned-by-thing", "--progress-file", str(state_dir / "pass-through" / "progress.json"),
                 "--progress-interval-s", "5"], env=env, cwd=REPO_ROOT, stdout=log, stderr=log, start_new_session=True)
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in vars(args).items()
                 if name not in ("pipelines", "ports", "run_dir", "measure") and value is not None]
        figures = None
        with subprocess.Popen([sys.executable, "-m", "benchmarks.capacity", "--measure", pipeline,
                               "--run-dir", str(run_dir / pipeline), *flags], env=env, cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True) as done:
            for line in done.stdout:  # its progress, passed on as it comes
                if line.startswith(FIGURES_MARK):
                    figures = json.loads(line[len(FIGURES_MARK):])
                else:
                    print(line, end="", flush=True)
        if done.returncode != 0 or figures is None:
            raise SystemExit(f"the {pipeline} pipeline's measurement failed ({done.returncode})")
        return figures
    finally:
        if pass_through is not None:
            pass_through.terminate()
            pass_through.wait(60)
        stack("clean")
        shutil.rmtree(state_dir, ignore_errors=True)


def table(results: dict[str, Any]) -> list[str]:
    pipelines = results["pipelines"]
    ceiling = next((p["sustained_rows_s"] for p in pipelines if p["name"] == "pass-through"), None)
    lines = ["pipeline        sustained rows/s  records/s  of pass-through  p50 / p99 at 0.7 (s)  CPU us per row"]
    for pipeline in pipelines:
        rate = pipeline.get("sustained_rows_s")
        records = rate * pipeline["records_per_row"] if rate and pipeline.get("records_per_row") else None
        share = f"{rate / ceiling:.2f}" if rate and ceiling else "-"
        latency = (f"{pipeline['latency_p50_s']:.2f} / {pipeline['latency_p99_s']:.2f}"
                   if pipeline.get("latency_p99_s") is not None else "-")
        cpu = ", ".join(f"{name} {value:,.0f}" for name, value in sorted(pipeline.get("cpu_us_per_row", {}).items(),
                                                                           key=lambda item: -item[1]))
        lines.append(f"{pipeline['name']:<16}{rate or 0:>16,.0f}{records or 0:>11,.0f}{share:>17}{latency:>22}  {cpu}")
    return lines


def record(recorded: Results, results: dict[str, Any]) -> None:
    """Per pipeline the rate its probe found; where a hold sustained a rate, that rate, the CPU per row of each of its
    processes there, and the latency's p50 and p99 at 0.7 of it."""
    for pipeline in results["pipelines"]:
        name, rate = pipeline["name"], pipeline.get("sustained_rows_s")
        if pipeline.get("probed_rows_s"):
            recorded.add(f"{name}: probed at full pace", pipeline["probed_rows_s"], "rows/s")
        if not rate:
            continue
        recorded.add(f"{name}: sustained", rate, "rows/s")
        if pipeline.get("cpu_cores"):  # all of the machine's cores busy: the machine, not a stage, set the rate
            recorded.add(f"{name}: cores busy over the hold, every process", sum(pipeline["cpu_cores"].values()),
                         "cores")
        for process, cpu_us in sorted(pipeline.get("cpu_us_per_row", {}).items()):
            if cpu_us > 0:
                recorded.add(f"{name}: CPU per row, {process}", cpu_us, "µs")
        for quantile in ("p50", "p99"):
            latency_s = pipeline.get(f"latency_{quantile}_s")
            if latency_s:
                recorded.add(f"{name}: latency {quantile} at 0.7 of the sustained rate", latency_s, "s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capacity", description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", default=",".join(PIPELINES), help="comma-separated, of " + ", ".join(PIPELINES))
    parser.add_argument("--machines", type=int, default=500)
    parser.add_argument("--axes", type=int, default=3)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20261206)
    parser.add_argument("--probe-s", type=float, default=120.0, help="seconds the pace looks for the pipeline's rate")
    parser.add_argument("--hold-minutes", type=float, default=10.0, help="how long a rate is held")
    parser.add_argument("--latency-s", type=float, default=180.0, help="seconds held at 0.7 of the rate found")
    parser.add_argument("--start-rate", type=float, default=1000.0, help="rows/s the probe starts from")
    parser.add_argument("--ports", default=os.environ.get("BENCH_PORTS"),
                        help="first-last: the stacks' ports from this range (default: any free ones)")
    parser.add_argument("--report-dir", default="reports")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        figures = measure(args.measure, args)
        print(FIGURES_MARK + json.dumps(figures), flush=True)
        return 0
    recorded = Results("capacity", argv)
    began = time.time()
    run_dir = Path(args.report_dir) / f"capacity-{time.strftime('%Y%m%d-%H%M%S', time.gmtime(began))}"
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"whole-pipeline capacity: {args.machines} machines x {args.axes} axes, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.1f}; each rate held {args.hold_minutes:g} min", flush=True)
    pipelines = [run_pipeline(name, args, run_dir) for name in args.pipelines.split(",")]
    results = {"run": run_dir.name, "began_at": began, "ended_at": time.time(), "cores": os.cpu_count(),
               "load_average": os.getloadavg(), "machines": args.machines, "axes": args.axes,
               "hold_minutes": args.hold_minutes, "pipelines": pipelines}
    (run_dir / "results.json").write_text(json.dumps(results, indent=1))
    for line in table(results):
        print(line)
    print(f"results: {run_dir / 'results.json'}")
    record(recorded, results)
    recorded.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
