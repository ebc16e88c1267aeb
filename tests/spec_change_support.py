"""Join specs changed on a running stack: the spec files the runs apply, and the oracle of machine.out (each spec by
tests/join_reference.py over the records it reached: those of each partition from where it started to where it was
removed; no code of either joiner)."""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from join_reference import POWER, Spec, reference_join
from support import Message

PRODUCT = lambda left, right: left * right  # noqa: E731 (the spec file's formula "product")
# Each spec of the runs, as the oracle computes it.
REFERENCE = {
    "power": POWER,
    "torque_current": Spec("vaTorque_C", "vaCurr_C", "vaTorqueCurrent_C", PRODUCT, 1000.0),
    "current_load": Spec("vaCurr_C", "vaLoad_C", "vaCurrentLoad_C", PRODUCT, 1000.0),
}
_TOML = {
    "power": ('actSpeed_C{axis}', 'vaTorque_C{axis}', 'vaPower_C{axis}', "power"),
    "torque_current": ('vaTorque_C{axis}', 'vaCurr_C{axis}', 'vaTorqueCurrent_C{axis}', "product"),
    "current_load": ('vaCurr_C{axis}', 'vaLoad_C{axis}', 'vaCurrentLoad_C{axis}', "product"),
}
# The stack starts with the first; the second removes torque_current and adds current_load (which reads vaCurr,
# a quantity the removed spec's held records hold), power stays.
INITIAL = ("power", "torque_current")
CHANGED = ("power", "current_load")


def spec_file(folder: Path, names: tuple[str, ...], name: str) -> Path:
    path = folder / name
    path.write_text("".join(f'[[join]]\nname = "{spec}"\nleft = "{left}"\nright = "{right}"\noutput = "{output}"\n'
                            f'formula = "{formula}"\ndelta_time_s = 1.0\n\n'
                            for spec in names for left, right, output, formula in [_TOML[spec]]))
    return path


def bad_spec_file(folder: Path) -> Path:
    path = folder / "bad_specs.toml"
    path.write_text('[[join]]\nname = "broken"\nleft = "vaCurr_C{axis}"\nright = "vaLoad_C{axis}"\n'
                    'output = "vaBroken_C{axis}"\nformula = "cube"\n')
    return path


def expected_joins(initial: tuple[str, ...], changes: list[tuple[tuple[str, ...], dict[int, int]]]
                   ) -> Callable[[list[Message]], Counter[str]]:
    """The oracle of machine.out when the stack started with the specs `initial` and changed to each spec set of
    `changes` at the offsets given (partition -> offset; a partition not named: from its beginning)."""

    def expected(data: list[Message]) -> Counter[str]:
        ordered = sorted(data, key=lambda m: (m.placed_by, m.partition, m.offset))
        periods: dict[str, list[tuple[dict[int, int], dict[int, int] | None]]] = {name: [({}, None)]
                                                                                   for name in initial}
        running = set(initial)
        for names, at in changes:
            for name in running - set(names):
                start, _ = periods[name][-1]
                periods[name][-1] = (start, at)
            for name in set(names) - running:
                periods.setdefault(name, []).append((at, None))
            running = set(names)
        joins: Counter[str] = Counter()
        for name, spans in periods.items():
            for start, end in spans:
                records = [json.loads(m.value) for m in ordered if start.get(m.partition, 0) <= m.offset
                           and (end is None or m.offset < end.get(m.partition, 0))]
                joins.update(json.dumps(output, sort_keys=True) for output in reference_join(records, REFERENCE[name]))
        return joins

    return expected


def live_change_faults(replay_s: float, folder: Path) -> list:
    """What a run changes on its running stack, in order: a spec file with an error given to `python -m stack specs`
    (refused, nothing stopped), another spec file applied (torque_current removed, current_load added), machine.data
    grown from 5 to 8 partitions by the admin API, machine.dlq from 3 to 4 the same way, machine.out from 3 to 4 by
    `python -m stack grow` (what `make grow` runs). The spec files are written into `folder`."""
    from chaos_support import Fault
    bad, changed = bad_spec_file(folder), spec_file(folder, CHANGED, "changed_specs.toml")
    return [Fault(round(0.15 * replay_s, 1), "specs-refused", str(bad)),
            Fault(round(0.25 * replay_s, 1), "specs", str(changed)),
            Fault(round(0.45 * replay_s, 1), "grow", "machine.data=8"),
            Fault(round(0.55 * replay_s, 1), "grow", "machine.dlq=4"),
            Fault(round(0.65 * replay_s, 1), "make-grow", "machine.out=4")]


CONFIRMED = ["specs-refused", "specs", "grow machine.data", "grow machine.dlq", "make-grow machine.out"]


class LiveChanges:
    """A private stack (mixed in before its class) started with the initial spec file, whose expected joins follow
    the spec changes the run made, and that reads `status --json` before its `down` (growth_support)."""

    def start_with_specs(self, initial: Path) -> None:
        self.env.update(KAFKA_JOINER_JOIN_SPECS=str(initial), SPARK_JOINER_JOIN_SPECS=str(initial))
        self.expected_joins = lambda data: expected_joins(INITIAL, [(CHANGED, starts) for _, starts, _ in
                                                                    self.spec_changes])(data)


def check_live_changes(report, stack) -> list[str]:
    """What a run that made the live changes must show, beyond run_chaos's checks of every topic and InfluxDB: each
    change confirmed (the error named, the spec change applied, the counts Kafka gave back), the stream connector
    placing by 8 partitions and every stage caught up after it, every stage healthy at the end. Returns what
    fails."""
    from growth_support import unhealthy
    failing = []
    kinds = [line.split(":")[0].split(" /")[0] for line in report.confirmed]
    if [kind if kind.startswith(("grow", "make-grow")) else kind.split(" ")[0] for kind in kinds] != CONFIRMED:
        failing.append(f"changes confirmed: {report.confirmed}")
    elif not ("unknown formula 'cube'" in report.confirmed[0] and "added: current_load" in report.confirmed[1]
              and "removed: torque_current" in report.confirmed[1] and "5 -> 8 partitions" in report.confirmed[2]
              and "3 -> 4 partitions" in report.confirmed[4] and "caught up" in report.confirmed[4]):
        failing.append(f"changes said: {report.confirmed}")
    watch = stack.growth_watch
    if watch is not None:
        watch.join(timeout=120)
    if watch is None or watch.recovered_s is None:
        failing.append(f"not caught up after machine.data grew: {watch.lagging if watch else 'no watch'}")
    failing += unhealthy(getattr(stack, "final_status", None))
    return failing


def live_change_seconds(report, stack) -> tuple[float, float, float]:
    """The run's recoveries, in seconds: the joiners' stop for the spec change until healthy again (as `stack specs`
    said it), machine.data's growth until records were placed by 8 partitions and until every stage caught up."""
    said = next(line for line in report.confirmed if line.startswith("specs "))
    specs_s = float(re.search(r"healthy, ([0-9.]+) s after the stop", said).group(1))
    watch = stack.growth_watch
    return specs_s, watch.switched_s, watch.recovered_s


def live_change_figures(report, stack) -> str:
    """The run's measured costs and recoveries, one line."""
    specs_s, placed_s, caught_up_s = live_change_seconds(report, stack)
    return (f"joiners restarted on the new specs, healthy {specs_s:.1f} s after the stop; machine.data grown "
            f"5 -> 8: placed by 8 partitions {placed_s:.1f} s and every stage caught up {caught_up_s:.1f} s after "
            f"the growth")
