"""One soak run, start to verdict: the stack up (as `make up` would, unless it runs), the plant's backfill and live
phases with the faults, the pipeline settled, the check, flatness, and the results and report in the run's folder."""
from __future__ import annotations

import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline_core import credentials, paths
from pipeline_core.broker_offsets import BrokerOffsets
from pipeline_core.influx import influx_client
from pipeline_core.kafka_clients import admin_client, security_config
from pipeline_core.mqtt import DEVICE_CLIENT_ID
from pipeline_core.settings import ConnectionSettings, InfluxSettings, MqttSettings, load_settings
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT
from stack import choice, joiners, kafka_cluster, losses, manager, supervision
from stack.services import PipelineProcess, Service

from . import faults as fault_kinds
from .clocks import plan_clock_faults
from .check import CheckContext, check_partitions, compare_outputs
from .faults import Fault, FaultInjector, FaultRecord, faults_done, plan_faults
from .flatness import flatness
from .influx_check import await_counts, compare_windows
from .latency import LatencyProbe
from .monitor import Monitor
from .names import dots_flow, plant_names
from .pace import PaceController, backlog_rows, event_coverage_days
from .plant import Plant
from .points import level_bounds
from .publisher import ROUNDS_FILE, PlantRun, start
from .readback import PartitionRange
from .schedule import Timetable, fault_starts, flat_windows, timetable
from .settings import SoakSettings

log = logging.getLogger("soak")

RESULTS_FILE = "results.json"
SAMPLE_POINTS = 10_000  # InfluxDB's points compared one by one, of each measurement, at least
SETTLE_DEADLINE_S = 900.0
# From this length on a run must judge flatness: its live phase holds two windows after the last fault. A shorter
# run (the 2-minute one of make test, the 15-minute one of make reliability) may leave it unjudged, and says so.
FLATNESS_JUDGED_FROM_MINUTES = 30.0
FAULT_OVERRUN_S = 300.0  # publishing goes on past its planned end at most this long while faults are not done
TOPICS = (MACHINE_DATA.name, MACHINE_OUT.name, MACHINE_DLQ.name)


@dataclass
class Verdict:
    name: str
    holds: bool
    detail: str
    figures: dict[str, Any] = field(default_factory=dict)


class Soak:
    def __init__(self, settings: SoakSettings, say: Callable[[str], None] = print) -> None:
        self.settings = settings
        self.say = say
        self.began = time.time()
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(self.began))}"
        self.run_tag = secrets.token_hex(2)
        self.results: dict[str, Any] = {"run": self.run_id, "began_at": self.began, "settings": {
            key: str(value) if isinstance(value, Path) else value for key, value in asdict(settings).items()
            if "password" not in key}}
        self.fault_records: list[FaultRecord] = []
        self.fault_phase = ""

    # -- the stack ----------------------------------------------------------------------------------------------

    def bring_up(self) -> float:
        """The stack as `make up` runs it, when not every program of it runs; the seconds it took."""
        wanted = manager.all_services()
        active = set(supervision.active_programs()) if supervision.daemon_pid() else set()
        if all(service.name in active for service in wanted):
            return 0.0
        if not self.settings.up:
            raise SystemExit("the stack does not run (or not all of it): `make up` first, or run with --up")
        self.say("bringing the stack up as `make up` would ...")
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "stack", "up"], text=True)
        if done.returncode != 0:
            raise SystemExit("the stack did not come up: see above")
        return time.monotonic() - began

    def kafka(self) -> tuple[str, dict[str, str]]:
        environ = credentials.environ_for("admin")
        settings = load_settings(ConnectionSettings, [], environ=environ)
        bootstrap = kafka_cluster.bootstrap_servers() if choice.is_cluster() else settings.kafka_bootstrap_servers
        return bootstrap, security_config(settings)

    def influx(self):
        return influx_client(load_settings(InfluxSettings, [], environ=credentials.environ_for("admin")),
                             timeout_s=60.0)

    def influx_query(self) -> Callable[[str], list[dict]]:
        client = self.influx()
        return lambda text: list(client.query(text, epoch="ns").get_points())

    # -- the run ------------------------------------------------------------------------------------------------

    def run(self) -> int:
        settings = self.settings
        up_s = self.bring_up()
        services = manager.all_services()
        joiner, topology = joiners.chosen(), choice.current()
        self.results.update(joiner=joiner, topology=topology, up_s=up_s, load_average_start=os.getloadavg(),
                            host=f"{socket.gethostname()} ({os.cpu_count()} cores)")
        run_dir = Path(settings.report_dir) / f"soak-{self.run_id}-{joiner}"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.results["run_dir"] = str(run_dir)
        bootstrap, security = self.kafka()
        admin = admin_client(bootstrap, **security, log_level=0)
        partitions = {topic: len(meta.partitions) for topic, meta in admin.list_topics(timeout=30).topics.items()
                      if topic in TOPICS}
        # Quiet: the soak stops and kills Kafka on purpose, and its own clients' connection errors say nothing new.
        offsets = BrokerOffsets(bootstrap, 10.0, security={**security, "log_level": 0})
        start_offsets = offsets.latest([(topic, p) for topic, count in partitions.items() for p in range(count)])
        if start_offsets is None:
            raise SystemExit("Kafka did not give the topics' offsets")
        planned = self.planned_faults(services, joiner, topology)
        table = timetable(settings.minutes * 60, time.time() - self.began, planned)
        starts = fault_starts(planned, table)
        plant = Plant(settings.machines, settings.axes, settings.seed, min(settings.probes, settings.machines))
        names = plant_names(settings.machines, self.run_tag, settings.seed)
        self.results.update(timetable=table.as_dict(), run_tag=self.run_tag, dots_in_names=dots_flow(),
                            plant={"machines": settings.machines, "axes": settings.axes,
                                   "quantities": list(plant.quantities), "names_example": names[:3],
                                   "probes": [names[i] for i in plant.probe_machines]},
                            faults_planned=[fault.describe() for fault in planned])
        self.say(f"soak {self.run_id}: JOINER={joiner} TOPOLOGY={topology}, {settings.machines} machines x "
                 f"{settings.axes} axes ({names[0]!r}, ...), {settings.days:g} days of backfill in about "
                 f"{table.backfill_s / 60:.0f} min, then {table.live_s / 60:.0f} min live, {len(planned)} faults; "
                 f"results in {run_dir}")
        now_ms = int(time.time() * 1000)
        mqtt = load_settings(MqttSettings, [], environ=credentials.environ_for("device"))
        clock_faults = (plan_clock_faults(settings.machines, plant.probe_machines, table.backfill_s)
                        if settings.faults and (not settings.fault_list or "clock" in settings.fault_list) else [])
        self.results["clock_faults"] = [{"machine": names[f.machine], "kind": f.kind, "offset_ms": f.offset_ms,
                                         "at_s": f.at_s} for f in clock_faults]
        plant_run = PlantRun(settings.machines, settings.axes, settings.seed, len(plant.probe_machines), tuple(names),
                             now_ms - int(settings.days * 86_400_000), settings.live_interval_ms,
                             settings.max_step_ms, run_dir, mqtt,
                             DEVICE_CLIENT_ID if mqtt.mqtt_username else f"soak-{os.getpid()}", tuple(clock_faults))
        process, shared = start(plant_run)
        published_from = time.time()
        backfill_end = published_from + table.backfill_s
        shared.set("backfill_end_s", backfill_end)
        pace = PaceController(self.start_rate(joiner), min_rows_s=50.0, max_rows_s=200_000.0)
        shared.set("rate_rows_s", pace.rate_rows_s)
        checkpoints = [paths.STATE_DIR / "spark_joiner" / "checkpoint", paths.STATE_DIR / "spark-joiner" / "checkpoint"]
        monitor = Monitor(services, partitions, offsets, run_dir, shared.snapshot,
                          lambda: {"soak-plant": process.pid or 0, "soak": os.getpid()},
                          interval_s=settings.sample_interval_s,
                          checkpoint_dirs=[path for path in checkpoints if joiner == "spark"])
        monitor.start()
        query = self.influx_query()
        probe = LatencyProbe(run_dir, names, query)
        probe.start()
        fault_thread = threading.Thread(target=self.inject_faults, args=(services, planned, starts, published_from,
                                                                          shared), name="soak-faults", daemon=True)
        fault_thread.start()
        publish_end = published_from + table.publish_s
        records_base = sum(start_offsets[(MACHINE_DATA.name, p)] for p in range(partitions[MACHINE_DATA.name]))
        overrun_said = False
        try:
            # Faults that took longer than planned (a restart slower on a loaded machine) keep the rows coming until
            # they are done, within FAULT_OVERRUN_S: a fault that lands after the last row proves nothing.
            while time.time() < publish_end or (fault_thread.is_alive() and time.time() < publish_end + FAULT_OVERRUN_S):
                if time.time() >= publish_end and not overrun_said:
                    overrun_said = True
                    self.say(f"publishing on until the faults are done (at most {FAULT_OVERRUN_S:.0f} s more)")
                if not process.is_alive():
                    raise RuntimeError(f"the plant's publisher exited ({process.exitcode}): see the log above")
                time.sleep(settings.sample_interval_s)
                sample = monitor.latest()
                if shared.live_since_s == 0:
                    if sample:
                        shared.set("rate_rows_s", pace.update(sample["at"], sample["publisher"]["rows_acked"],
                                                              backlog_rows(sample, records_base)))
                    # Faults still to come keep the backfill going (the pipeline at pace meets them), within reason.
                    if fault_thread.is_alive():
                        shared.set("backfill_end_s", max(backfill_end, min(time.time() + 60,
                                                                         published_from + 0.7 * table.publish_s)))
                if settings.progress:
                    self.say(self.progress_line(sample, shared, planned, plant_run))
        finally:
            shared.set("stop", 1)
            process.join(timeout=1200)
        fault_thread.join()
        published_to = time.time()
        self.say(f"published {int(shared.rows_acked):,} rows ({int(shared.records_sent):,} records) in "
                 f"{published_to - published_from:.0f} s; settling ...")
        settled_s = self.settle(monitor, records_base, shared)
        probe_end = time.monotonic() + 60
        while probe.pending and time.monotonic() < probe_end:
            time.sleep(1.0)
        probe.stop()
        end_offsets = offsets.latest([(topic, p) for topic, count in partitions.items() for p in range(count)])
        monitor.stop()
        self.results.update(health=self.health_rates(query, published_from, time.time()),
                            load_average_end=os.getloadavg())
        self.results.update(published_from=published_from, published_to=published_to,
                            live_from=shared.live_since_s or None, settled_s=settled_s,
                            rows=int(shared.rows_acked), records=int(shared.records_sent),
                            rounds=int(shared.rounds_acked), publish_failures=int(shared.failed),
                            faults=[record.as_dict() for record in self.fault_records],
                            latency_unseen=len(probe.unseen))
        self.results["backfill_pace"] = self.backfill_pace(monitor.samples, records_base, joiner)
        verdicts = self.check(run_dir, plant_run, plant, partitions, start_offsets, end_offsets or {}, bootstrap,
                              security, query)
        verdicts += self.end_state(services, published_from)
        done, detail = faults_done(planned, self.fault_records)
        verdicts.append(Verdict("every planned fault happened, confirmed", done, detail))
        windows = flat_windows(shared.live_since_s or published_to, published_to, self.undisturbed_from())
        flat = flatness(monitor.samples, probe.samples(), windows)
        unjudged = [v.what for v in flat.verdicts if v.holds is None]
        must_judge = self.settings.minutes >= FLATNESS_JUDGED_FROM_MINUTES
        detail = "; ".join(f"{v.what}: {'ok' if v.holds else 'NOT' if v.holds is False else 'not judged'}"
                           for v in flat.verdicts if v.holds is not True) or "every figure within its bound"
        if unjudged and must_judge:
            detail += f" (a run of {FLATNESS_JUDGED_FROM_MINUTES:.0f} minutes or more must judge every figure)"
        verdicts.append(Verdict("flat over time", flat.holds and not (unjudged and must_judge), detail,
                                {"verdicts": [v.as_dict() for v in flat.verdicts]}))
        self.results.update(flat_windows={"first": windows.first, "last": windows.last, "reason": windows.reason},
                            latencies=probe.samples(), verdicts=[asdict(v) for v in verdicts],
                            holds=all(v.holds for v in verdicts), ended_at=time.time())
        (run_dir / RESULTS_FILE).write_bytes(orjson.dumps(self.results, option=orjson.OPT_INDENT_2
                                                          | orjson.OPT_SERIALIZE_NUMPY))
        from .report import write_report
        report = write_report(run_dir)
        for verdict in verdicts:
            self.say(f"{'PASS' if verdict.holds else 'FAIL'}  {verdict.name}: {verdict.detail}")
        self.say(f"report: {report}")
        return 0 if self.results["holds"] else 1

    # -- pieces -------------------------------------------------------------------------------------------------

    def planned_faults(self, services: list[Service], joiner: str, topology: str) -> list[Fault]:
        if not self.settings.faults:
            return []
        if self.settings.fault_list:
            chosen = []
            for item in self.settings.fault_list.split(","):
                if item.strip() == "clock":
                    continue  # the plant's lying clocks (`clocks`), not a fault of the stack
                kind, target, *hold = item.strip().split(":")
                if kind not in fault_kinds.FAULT_KINDS:
                    raise SystemExit(f"--fault-list: no fault kind {kind!r} (kinds: {', '.join(fault_kinds.FAULT_KINDS)})")
                default_hold = {"stop": fault_kinds.STOP_HOLD_S, "freeze": fault_kinds.FREEZE_HOLD_S}.get(kind, 0.0)
                chosen.append(Fault(kind, target, float(hold[0]) if hold else default_hold))
            return chosen
        return plan_faults(services, joiner, topology != choice.SINGLE)

    def start_rate(self, joiner: str) -> float:
        if self.settings.start_rate:
            return self.settings.start_rate
        from .capacity_results import latest_capacity
        capacity = latest_capacity(Path(self.settings.report_dir), joiner)
        return 0.7 * capacity if capacity else 1000.0

    def backfill_pace(self, samples: list[dict[str, Any]], records_base: int, joiner: str) -> dict[str, Any]:
        """Rows/s into machine.data in each minute of the backfill, against the pipeline's capacity (the latest
        `make bench` figure of this joiner; else the backfill's own best minute): how much of the backfill ran at
        0.7 of it or more."""
        live = self.results.get("live_from") or float("inf")
        points = [(s["at"], s["offsets"]["machine.data"], s["publisher"]) for s in samples
                  if s.get("offsets") and s["at"] < live]
        if len(points) < 2:
            return {}
        began = points[0][0]
        per_minute: dict[int, list[tuple[float, int]]] = {}
        for at, records, _publisher in points:
            per_minute.setdefault(int((at - began) // 60), []).append((at, records))
        publisher = points[-1][2]
        per_row = publisher["records_sent"] / max(publisher["rows_sent"], 1)
        rates = [(values[-1][1] - values[0][1]) / (values[-1][0] - values[0][0]) / per_row
                 for _minute, values in sorted(per_minute.items()) if len(values) > 1 and values[-1][0] > values[0][0]]
        from .capacity_results import latest_capacity
        capacity = latest_capacity(Path(self.settings.report_dir), joiner)
        reference = capacity or max(rates, default=0.0)
        return {"rows_s_per_minute": rates, "capacity_rows_s": capacity, "reference_rows_s": reference,
                "minutes": len(rates), "minutes_at_0_7": sum(rate >= 0.7 * reference for rate in rates)}

    def inject_faults(self, services: list[Service], planned: list[Fault], starts: list[float], began: float,
                      shared: Any) -> None:
        injector = FaultInjector(services)
        for fault, at_s in zip(planned, starts):
            wait_s = began + at_s - time.time()
            if wait_s > 0:
                time.sleep(wait_s)
            if shared.stop:
                break
            self.fault_phase = f"{fault.describe()}: injecting"
            record = injector.inject(fault, on_phase=lambda phase, f=fault: setattr(
                self, "fault_phase", f"{f.describe()}: {phase}"))
            self.fault_records.append(record)
            self.fault_phase = f"{fault.describe()}: {'done' if record.error is None else 'FAILED: ' + record.error}"
            self.say(f"fault {len(self.fault_records)}/{len(planned)}: {fault.describe()}: "
                     + ("; ".join(record.confirmed) if record.error is None else f"NOT CONFIRMED: {record.error}"))

    def undisturbed_from(self) -> float:
        """When the last fault ended, plus a minute for the pipeline to recover."""
        ends = [record.ended_at for record in self.fault_records if record.ended_at]
        return max(ends) + 60.0 if ends else 0.0

    def progress_line(self, sample: dict[str, Any] | None, shared: Any, planned: list[Fault], run: PlantRun) -> str:
        elapsed = time.time() - self.began
        phase = "live" if shared.live_since_s else "backfill"
        event_ms = shared.event_ms or run.start_ms
        day = (event_ms - run.start_ms) / 86_400_000
        line = (f"{elapsed / 60:5.1f} min {phase:<8} event time {time.strftime('%m-%d %H:%M', time.gmtime(event_ms / 1000))}"
                f" (day {day:4.1f} of {self.settings.days:g})")
        if sample:
            rate = self._rate(sample)
            lags = ", ".join(f"{name} {values['lag']:,}" for name, values in sample["services"].items()
                             if values["lag"] is not None)
            line += f" | {rate[0]:,.0f} rows/s, {rate[1]:,.0f} records/s | lag {lags or '-'}"
        line += f" | faults {len(self.fault_records)}/{len(planned)}"
        if self.fault_phase and len(self.fault_records) < len(planned):
            line += f" ({self.fault_phase})"
        return line

    def _rate(self, sample: dict[str, Any]) -> tuple[float, float]:
        previous = getattr(self, "_previous_sample", None)
        self._previous_sample = sample
        if previous is None or sample["at"] <= previous["at"]:
            return 0.0, 0.0
        elapsed = sample["at"] - previous["at"]
        return ((sample["publisher"]["rows_acked"] - previous["publisher"]["rows_acked"]) / elapsed,
                (sample["publisher"]["records_sent"] - previous["publisher"]["records_sent"]) / elapsed)

    def settle(self, monitor: Monitor, records_base: int, shared: Any) -> float:
        """Wait until machine.data holds what was published and every stage's lag is 0 (at most
        SETTLE_DEADLINE_S); the seconds it took."""
        began = time.monotonic()
        stable = 0
        previous = None
        while time.monotonic() - began < SETTLE_DEADLINE_S:
            time.sleep(self.settings.sample_interval_s)
            sample = monitor.latest()
            if not sample or sample.get("offsets") is None:
                continue
            lags = [values["lag"] for values in sample["services"].values() if values["stage_state"] is not None]
            caught_up = all(lag == 0 for lag in lags) and all(
                values["healthy"] for values in sample["services"].values())
            stable = stable + 1 if caught_up and sample["offsets"] == previous else 0
            previous = sample["offsets"]
            if stable >= 2:
                break
        return time.monotonic() - began

    def check(self, run_dir: Path, run: PlantRun, plant: Plant, partitions: dict[str, int],
              start_offsets: dict, end_offsets: dict, bootstrap: str, security: dict[str, str],
              query: Callable[[str], list[dict]]) -> list[Verdict]:
        import numpy as np

        rounds = [orjson.loads(line) for line in (run_dir / ROUNDS_FILE).read_bytes().splitlines() if line]
        rounds.sort(key=lambda entry: entry["round"])
        round_times = np.array([entry["time_ms"] for entry in rounds], dtype=np.int64)
        self.results["event_days"], self.results["event_jump_days"] = event_coverage_days(
            round_times.tolist(), self.settings.max_step_ms)
        kills = [(record.began_at, record.mosquitto_saved_at) for record in self.fault_records
                 if record.mosquitto_saved_at is not None]
        at_risk = np.array([any(entry["published_at"] - 1.0 <= killed and entry["acked_at"] > saved
                                for killed, saved in kills) for entry in rounds], dtype=bool)
        clock_offsets: dict[int, np.ndarray] = {}
        for index, entry in enumerate(rounds):
            for machine, offset in (entry.get("clocks") or {}).items():
                clock_offsets.setdefault(int(machine), np.zeros(len(rounds), dtype=np.int64))[index] = offset
        data_partitions = partitions[MACHINE_DATA.name]
        context = CheckContext(bootstrap, security, run.machines, run.axes, run.seed, run.probes, run.names,
                               tuple(run.machine_phase_ms().tolist()), round_times, at_risk,
                               -(-SAMPLE_POINTS * 11 // 10 // data_partitions), level_bounds(),
                               self.settings.seed, clock_offsets)

        def spans(topic: str) -> list[PartitionRange]:
            return [PartitionRange(topic, p, start_offsets.get((topic, p), 0), end_offsets.get((topic, p), 0))
                    for p in range(partitions[topic])]

        began = time.monotonic()
        data, out = check_partitions(context, spans(MACHINE_DATA.name), spans(MACHINE_OUT.name),
                                     self.settings.check_processes)
        read_s = time.monotonic() - began
        verdicts = []
        problems = sum((result.problems for result in data), Counter())
        seen = {machine for result in data for machine in result.machines}
        absent = [run.names[machine] for machine in range(run.machines) if machine not in seen]
        if absent:  # a machine none of whose records is in machine.data: every row it published is lost
            problems["machine without a record in machine.data"] = len(absent)
        examples = {kind: [e for result in data for e in result.examples.get(kind, [])][:5] for kind in problems}
        if absent:
            examples["machine without a record in machine.data"] = absent[:5]
        lost = [pair for result in data for pair in result.lost_at_risk]
        records = sum(result.records for result in data)
        verdicts.append(Verdict(
            "machine.data holds every row, once", not problems,
            (f"{records:,} records of {sum(r.rows for r in data):,} rows, each once, at its time and value"
             if not problems else "; ".join(f"{count} {kind} (e.g. {examples[kind][:2]})"
                                             for kind, count in problems.items()))
            + f"; {int(at_risk.sum())} rounds acknowledged by Mosquitto after its last save before a SIGKILL, "
              f"{len(lost)} rows of them lost (counted, outside the pipeline's control)",
            {"records": records, "rows": sum(r.rows for r in data), "problems": dict(problems),
             "examples": examples, "lost_to_mosquitto_kill": len(lost),
             "rounds_at_risk": int(at_risk.sum()), "foreign_records": sum(r.foreign for r in data),
             "read_s": read_s}))
        join = compare_outputs(data, out)
        verdicts.append(Verdict(
            "machine.out = the reference join of machine.data", join.holds,
            f"{join.found:,} joins, the reference's {join.expected:,}: {join.missing} missing, {join.extra} extra, "
            f"{join.twice} twice" + (f" ({'; '.join(join.things_differing)})" if join.things_differing else ""),
            asdict(join)))
        raw_expected = sum((result.raw_per_hour for result in data), Counter())
        joined_expected = sum((result.joined_per_hour for result in data), Counter())
        prefix = run.names[0].split(".")[0].split(" - ")[0]
        windows = [window for result in data for window in result.windows]
        for measurement, expected in (("raw", raw_expected), ("joined", joined_expected)):
            counts = await_counts(query, measurement, prefix, expected, deadline_s=300.0)
            sample = compare_windows(query, windows, measurement)
            # At least SAMPLE_POINTS points, or (a small run) about all of them.
            holds = counts.holds and sample.holds and sample.points >= min(SAMPLE_POINTS, 0.9 * counts.expected)
            verdicts.append(Verdict(
                f"InfluxDB holds every {measurement} point", holds,
                f"{counts.found:,} points of {counts.expected:,} over {counts.hours} hours"
                + (f" (hours differing: {counts.hours_differing})" if counts.hours_differing else ", every hour equal")
                + f"; {sample.points:,} points of {sample.windows} random hour-long windows compared one by one"
                + (f": {sample.problems} differ, e.g. {sample.differing}" if sample.problems else ", all equal"),
                {"expected": counts.expected, "found": counts.found, "hours": counts.hours,
                 "hours_differing": counts.hours_differing, "sample_points": sample.points,
                 "sample_windows": sample.windows, "sample_problems": sample.problems}))
        outliers = [outlier for result in data for outlier in result.outliers]
        turned_away = [record for result in data for record in result.turned_away]
        verdicts.append(self.dead_letters(bootstrap, security, partitions, start_offsets, end_offsets, set(run.names),
                                          outliers, turned_away))
        return verdicts

    def dead_letters(self, bootstrap: str, security: dict[str, str], partitions: dict[str, int], start_offsets: dict,
                     end_offsets: dict, names: set[str], outliers: list[tuple[str, str, float, float]],
                     turned_away: list[tuple[str, str, float, float]]) -> Verdict:
        """machine.dlq holds, of the plant's records, exactly those the reference turns away, each once: its clock
        rule's outliers as `clock_outlier`, and the records late in their timeline or in conflict (a clock stepped
        back whose next reading fits the old timeline, say) with their own reasons; nothing else."""
        from .readback import read_values
        expected = {"outliers": Counter(outliers), "turned away": Counter(turned_away)}
        found: dict[str, Counter] = {kind: Counter() for kind in expected}
        others: Counter = Counter()
        for p in range(partitions[MACHINE_DLQ.name]):
            span = PartitionRange(MACHINE_DLQ.name, p, start_offsets.get((MACHINE_DLQ.name, p), 0),
                                  end_offsets.get((MACHINE_DLQ.name, p), 0))
            for batch in read_values(bootstrap, security, span):
                for value in batch:
                    letter = orjson.loads(value)
                    reason = str(letter.get("reason", ""))
                    try:
                        record = orjson.loads(letter.get("payload") or "")
                        key = (record["thing"], record["quantity"], record["phenomenonTime"], record["result"])
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        if any(name in (letter.get("payload") or "") for name in names):
                            others[f"{letter.get('stage')}: {reason[:120]}"] += 1
                        continue
                    if key[0] not in names:
                        continue
                    if reason.startswith("clock_outlier"):
                        found["outliers"][key] += 1
                    elif key in expected["turned away"]:
                        found["turned away"][key] += 1
                    else:
                        others[f"{letter.get('stage')}: {reason[:120]}"] += 1
        missing = {kind: expected[kind] - found[kind] for kind in expected}
        extra = {kind: found[kind] - expected[kind] for kind in expected}
        holds = not any(missing.values()) and not any(extra.values()) and not others
        parts = []
        for kind in expected:
            part = f"{sum(found[kind].values())} {kind} dead-lettered, the reference's {sum(expected[kind].values())}"
            if missing[kind]:
                part += f" ({sum(missing[kind].values())} missing, e.g. {list(missing[kind])[:2]})"
            if extra[kind]:
                part += f" ({sum(extra[kind].values())} not the reference's or twice, e.g. {list(extra[kind])[:2]})"
            parts.append(part)
        detail = "; ".join(parts) + (f"; other dead letters: " + "; ".join(
            f"{n} {reason}" for reason, n in others.most_common(5)) if others else "; nothing else")
        return Verdict("machine.dlq holds what the reference turns away and nothing else", holds, detail,
                       {"outliers_expected": sum(expected["outliers"].values()),
                        "outliers_found": sum(found["outliers"].values()),
                        "turned_away_expected": sum(expected["turned away"].values()),
                        "turned_away_found": sum(found["turned away"].values()),
                        "missing": sum(sum(c.values()) for c in missing.values()),
                        "extra": sum(sum(c.values()) for c in extra.values()), "others": dict(others)})

    def health_rates(self, query: Callable[[str], list[dict]], since: float, until: float
                     ) -> dict[str, list[tuple[float, float]]]:
        """Each stage's records out per second as it reported them (pipeline_health), its instances added up, per
        30 s."""
        from pipeline_core.health_metrics import HEALTH_MEASUREMENT
        from pipeline_core.influx_retention import HEALTH_POLICY
        try:
            result = self.influx().query(
                f'SELECT mean("records_out_per_s") AS rate FROM "{HEALTH_POLICY}"."{HEALTH_MEASUREMENT}" '
                f"WHERE time >= {int(since * 1000)}ms AND time <= {int(until * 1000)}ms "
                'GROUP BY time(30s), "stage", "instance" fill(none)', epoch="s")
        except Exception as error:  # noqa: BLE001 - the report goes without them
            log.warning("the stages' health points could not be read: %s", error)
            return {}
        added: dict[str, dict[float, float]] = {}
        for (_measurement, tags), points in result.items():
            stage = added.setdefault((tags or {}).get("stage", "?"), {})
            for point in points:
                if point.get("rate") is not None:
                    stage[point["time"]] = stage.get(point["time"], 0.0) + point["rate"]
        return {stage: sorted(values.items()) for stage, values in added.items()}

    def end_state(self, services: list[Service], since: float) -> list[Verdict]:
        entries = manager.status(services)
        unhealthy = [f"{entry.name} ({entry.state}, {entry.stage.state if entry.stage else 'healthy' if entry.healthy else 'not ready'})"
                     for entry in entries if not entry.healthy or entry.state != "RUNNING"]
        trouble = [f"{entry.name}: {entry.trouble}" for entry in entries if entry.trouble]
        try:
            client = influx_client(load_settings(InfluxSettings, [], environ=credentials.environ_for("admin")))
            found = losses.stage_losses(client, f"{int(time.time() - since) + 60}s")
            loss, known = found, True
        except Exception as error:  # noqa: BLE001 - the verdict says it is unknown
            loss, known = {"unknown": str(error)}, False
        return [
            Verdict("every stage healthy at the end", not unhealthy and not trouble,
                    "all healthy" if not unhealthy and not trouble else "; ".join(unhealthy + trouble),
                    {"unhealthy": unhealthy, "trouble": trouble}),
            Verdict("no loss outside the pipeline's control unless counted", known and not loss,
                    "none counted by the stages" if known and not loss else f"{loss}", {"losses": loss}),
        ]
