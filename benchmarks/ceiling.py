"""Each joiner against its ceiling, the same source and sink with no join in between: the figures' arithmetic
and the lines ``make bench`` prints (pure, no Kafka or Spark)."""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import NamedTuple

STANDALONE_TARGET = 0.7  # of its pass-through's records/s
SPARK_TARGET = 0.5


class Run(NamedTuple):
    """One measured run: input records, seconds from the first record consumed to the last output committed,
    and the CPU seconds its processes spent."""

    records: int
    seconds: float
    cpu_s: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")

    @property
    def cpu_us_per_record(self) -> float:
        return self.cpu_s / self.records * 1e6 if self.records else float("nan")


class Ratio(NamedTuple):
    """A joiner against its ceiling over alternating rounds of the same input: per round the joiner's
    records/s over the pass-through's; the median of the rounds; and the CPU per record of both (medians)."""

    rounds: tuple[float, ...]
    joiner_cpu_us: float
    ceiling_cpu_us: float

    @property
    def median(self) -> float:
        return statistics.median(self.rounds) if self.rounds else float("nan")

    @property
    def cpu_ratio(self) -> float:
        """The pass-through's CPU per record over the joiner's: the ratio the rates tend to where CPU bounds
        both, and much steadier than the rates on a shared machine."""
        return self.ceiling_cpu_us / self.joiner_cpu_us if self.joiner_cpu_us > 0 else float("nan")


def ratio(joiner: Sequence[Run], ceiling: Sequence[Run]) -> Ratio:
    """Pair the rounds in order (round i of the joiner with round i of its pass-through)."""
    if len(joiner) != len(ceiling):
        raise ValueError(f"{len(joiner)} joiner rounds against {len(ceiling)} pass-through rounds")
    rounds = tuple(j.records_per_s / c.records_per_s for j, c in zip(joiner, ceiling))
    cpu = [statistics.median(run.cpu_us_per_record for run in runs) if runs else float("nan")
           for runs in (joiner, ceiling)]
    return Ratio(rounds, cpu[0], cpu[1])


def verdict(value: float, target: float) -> str:
    """'met' or 'NOT met' against a ratio target (a NaN, from a run that measured nothing, is not met)."""
    return "met" if value >= target else "NOT met"


def ratio_line(label: str, result: Ratio, target: float) -> str:
    """One workload's ratio, e.g. ``all-joinable: 0.31 of the pass-through's records/s (rounds 0.29, 0.33), target
    ...; CPU ...`` (the rounds only where there are several)."""
    rounds = f" (rounds {', '.join(f'{value:.2f}' for value in result.rounds)})" if len(result.rounds) > 1 else ""
    return (f"{label}: {result.median:.2f} of the pass-through's records/s{rounds}, target >= {target:.1f} "
            f"{verdict(result.median, target)}; CPU per record {result.joiner_cpu_us:.1f} µs against "
            f"{result.ceiling_cpu_us:.1f} µs ({result.cpu_ratio:.2f})")


def run_line(label: str, round_: int, run: Run) -> str:
    """One run's row of the ceiling table."""
    return (f"  {label:<34} {round_:>5} {run.records:>10,} {run.seconds:>8.1f} {run.records_per_s:>10,.0f} "
            f"{run.cpu_us_per_record:>13.1f}")


RUN_HEADER = (f"  {'':<34} {'round':>5} {'records':>10} {'seconds':>8} {'records/s':>10} {'CPU µs/record':>13}")


def cost_lines(phases: Mapping[str, float], records: int, measured_us: float | None = None) -> list[str]:
    """Per-record CPU of each phase (``phases``: CPU seconds over ``records`` input records), its share of
    their sum, and the sum beside a measured whole (the rest is the loop around the phases, or noise)."""
    if records <= 0:
        raise ValueError("no records")
    per_record = {phase: seconds / records * 1e6 for phase, seconds in phases.items()}
    total = sum(per_record.values())
    width = max((len(phase) for phase in per_record), default=0)
    lines = [f"  {phase:<{width}} {us:6.2f} µs  {us / total if total else 0:4.0%}" for phase, us in per_record.items()]
    summary = f"  {'sum':<{width}} {total:6.2f} µs"
    if measured_us is not None:
        summary += f"; the joiner measured {measured_us:.1f} µs per record in the same run"
    lines.append(summary)
    return lines
