"""The join as its contract defines it, computed offline from machine.data records: the oracle of the chaos,
outage, cluster and disorder runs and of `make soak`. It shares no code with either joiner (nothing of
local_stream_buffer, kafka_joiner or spark_joiner is imported): it is written from the definitions in
docs/join.md and the docstrings of local_stream_buffer's cases, output and reorder modules.

A join spec pairs, per thing and axis, the left quantity's stream (actSpeed_C<axis>) with the right one's
(vaTorque_C<axis>) into an output quantity (vaPower_C<axis>).

Which records a stream joins, given its records in arrival order (Kafka's partition order):
- first its clock (docs/join.md, "Clocks that lie"): a record more than the spec's clock_step_ahead ahead of
  the newest record its stream's timeline has taken, or more than its bound plus clock_step_back behind it,
  is set aside; the records after it decide (a record at the time of one set aside is dropped and counts for
  nothing). Once clock_confirm further records take the timeline, the set-aside records are outliers:
  dropped. Once clock_confirm records in all lie together off the timeline (each within the same limits of the
  newest of them, or, behind the timeline, beyond them and still behind it), the clock moved: ahead, they
  continue the timeline; behind, the timeline ends and they begin the next one. A record ahead of records set
  aside ahead of the timeline, and fitting neither, shows time went on: they continue the timeline, and it is
  set aside in their place. Any other record that fits neither drops those set aside and is set aside itself.
  The timelines of a stream are numbered from 0; the n-th of one stream joins the n-th of the other;
- within a timeline, a record more than the spec's bound (max_out_of_orderness) behind the newest earlier
  record of its stream is late; one exactly at the bound is not;
- a record at the time of an earlier accepted record of its stream is a repeat (dropped) or a conflict
  (rejected): the first stays;
- a joiner dead-letters every record it turns away but repeats: outliers, late records and conflicts (with a
  record accepted, or with one set aside);
- the join sees the accepted records in time order, but only those at or before the stream's watermark,
  its newest time minus the bound (the rest wait for the stream to move on); with a bound of 0 that is
  every accepted record. Of a timeline that ended, the join sees every accepted record.

Which pairs the join emits over the records it saw (L left, R right): each record with its successor in the
other stream (the earliest record at or after it), and with its predecessor there (the latest at or before
it) once it has a successor, or once the other stream's timeline ended; pairs farther apart than delta_time
dropped. The case: same_time (equal
times); for l < r left_successor if r is l's successor, else right_predecessor; for l > r right_successor
if l is r's successor, else left_predecessor.

The output record of a pair: the thing, the output quantity, the mean of both times (an int when whole), the
formula's result as a float, both inputs (quantity, time, result as in their records), the case, and an id:
UUID5 in a fixed namespace of "thing/output quantity/left time/right time" (times as ints when whole).
"""
from __future__ import annotations

import math
import re
import uuid
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable

OUTPUT_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "machine-data-pipeline/local_stream_buffer/output")


def power(speed_rpm: float, torque_nm: float) -> float:
    """Mechanical power in W: 2π/60 · n · M."""
    return 2 * math.pi / 60 * speed_rpm * torque_nm


@dataclass(frozen=True)
class Spec:
    left: str  # quantity prefix before the axis number
    right: str
    output: str
    formula: Callable[[float, float], float]
    delta_time_ms: float | None
    bound_ms: float = 0.0
    # The clock rule's limits, as docs/join.md gives their defaults; clock_confirm 0 takes every record as it comes.
    clock_ahead_ms: float = 3_600_000.0
    clock_back_ms: float = 60_000.0
    clock_confirm: int = 2


# The shipped join_specs.toml: power of each axis, pairs at most 1 s apart, each stream in time order.
POWER = Spec("actSpeed_C", "vaTorque_C", "vaPower_C", power, delta_time_ms=1000.0)


def _plain(t: float) -> int | float:
    return int(t) if float(t).is_integer() else float(t)


def timelines(records: list[dict[str, Any]], spec: Spec
              ) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """One stream's records (arrival order) as its clock rule places them: the records each timeline takes, in the
    order it takes them, the outliers dropped, and the conflicts with a record set aside (another result at its
    time)."""
    lines: list[list[dict[str, Any]]] = [[]]
    outliers: list[dict[str, Any]] = []
    conflicts: list[dict[str, Any]] = []
    aside: list[dict[str, Any]] = []
    votes = 0
    newest: float | None = None  # of the records the last timeline took (kept as it grows: a stream is long)

    def fits(t: float, newest: float) -> bool:
        return newest - spec.bound_ms - spec.clock_back_ms <= t <= newest + spec.clock_ahead_ms

    def latest(times: list[dict[str, Any]], than: float | None) -> float:
        found = max(r["phenomenonTime"] for r in times)
        return found if than is None else max(than, found)

    for record in records:
        t = record["phenomenonTime"]
        taken = lines[-1]
        if not spec.clock_confirm or newest is None or (not aside and fits(t, newest)):
            taken.append(record)
            newest = latest([record], newest)
        elif any(r["phenomenonTime"] == t for r in aside):
            # A repeat or conflict of a record set aside: the first stays.
            conflicts += [record for r in aside if r["phenomenonTime"] == t and r["result"] != record["result"]][:1]
        elif not aside:
            aside, votes = [record], 0
        elif fits(t, newest):
            taken.append(record)
            newest = latest([record], newest)
            votes += 1
            if votes == spec.clock_confirm:
                outliers += aside
                aside = []
        elif fits(t, max(r["phenomenonTime"] for r in aside)) or (
                aside[0]["phenomenonTime"] < newest
                and max(r["phenomenonTime"] for r in aside) < t < newest - spec.bound_ms - spec.clock_back_ms):
            aside.append(record)
            if len(aside) == spec.clock_confirm:
                if aside[0]["phenomenonTime"] > newest:
                    taken += aside
                    newest = latest(aside, newest)
                else:
                    lines.append(aside)
                    newest = latest(aside, None)
                aside = []
        elif aside[0]["phenomenonTime"] > newest and t > max(r["phenomenonTime"] for r in aside):
            taken += aside  # time went on ahead again, past them: they were readings after a gap
            newest = latest(aside, newest)
            aside, votes = [record], 0
        else:
            outliers += aside
            aside, votes = [record], 0
    return lines, outliers, conflicts


def _accepting(records: list[dict[str, Any]], bound_ms: float
               ) -> tuple[dict[float, dict[str, Any]], float, list[dict[str, Any]]]:
    """Of one stream's timeline (records in the order it took them): the accepted records by time, the newest
    time, and the records turned away (late, or a conflict with an accepted record; repeats go without a word)."""
    accepted: dict[float, dict[str, Any]] = {}
    turned_away: list[dict[str, Any]] = []
    newest = -math.inf
    for record in records:
        t = record["phenomenonTime"]
        if t < newest - bound_ms:
            turned_away.append(record)  # late
        elif t in accepted:
            if accepted[t]["result"] != record["result"]:
                turned_away.append(record)  # a conflict; a repeat is dropped silently
        else:
            accepted[t] = record
            newest = max(newest, t)
    return accepted, newest, turned_away


def _stream_joins(records: list[dict[str, Any]], bound_ms: float, ended: bool = False) -> list[dict[str, Any]]:
    """The records of one stream's timeline (in the order it took them) the join sees, in time order."""
    accepted, newest, _ = _accepting(records, bound_ms)
    watermark = math.inf if ended else newest - bound_ms
    return [accepted[t] for t in sorted(accepted) if t <= watermark]


def _pairs(left: list[float], right: list[float], delta_ms: float | None, left_ended: bool = False,
           right_ended: bool = False) -> list[tuple[float, float, str]]:
    def successor(t: float, others: list[float]) -> float | None:
        index = bisect_left(others, t)
        return others[index] if index < len(others) else None

    def predecessor(t: float, others: list[float]) -> float | None:
        index = bisect_right(others, t)
        return others[index - 1] if index else None

    found: set[tuple[float, float]] = set()
    for times, others, is_left, others_ended in ((left, right, True, right_ended), (right, left, False, left_ended)):
        for t in times:
            after = successor(t, others)
            if after is None and not others_ended:
                continue
            for partner in (after, predecessor(t, others)):
                if partner is not None:
                    found.add((t, partner) if is_left else (partner, t))
    pairs = []
    for lt, rt in sorted(found):
        if delta_ms is not None and abs(lt - rt) > delta_ms:
            continue
        if lt == rt:
            case = "same_time"
        elif lt < rt:
            case = "left_successor" if successor(lt, right) == rt else "right_predecessor"
        else:
            case = "right_successor" if successor(rt, left) == lt else "left_predecessor"
        pairs.append((lt, rt, case))
    return pairs


def output_record(thing: str, spec: Spec, axis: str, left: dict[str, Any], right: dict[str, Any],
                  case: str) -> dict[str, Any]:
    lt, rt = _plain(left["phenomenonTime"]), _plain(right["phenomenonTime"])
    quantity = f"{spec.output}{axis}"
    return {
        "thing": thing,
        "quantity": quantity,
        "phenomenonTime": _plain((lt + rt) / 2),
        "result": float(spec.formula(left["result"], right["result"])),
        "left": {"quantity": left["quantity"], "phenomenonTime": lt, "result": left["result"]},
        "right": {"quantity": right["quantity"], "phenomenonTime": rt, "result": right["result"]},
        "case": case,
        "id": str(uuid.uuid5(OUTPUT_ID_NAMESPACE, f"{thing}/{quantity}/{lt}/{rt}")),
    }


def _joined_streams(records: Iterable[dict[str, Any]], spec: Spec) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """The records of joined quantities, per (thing, axis, side), in arrival order."""
    sides = ((spec.left, "left"), (spec.right, "right"))
    patterns = {side: re.compile(re.escape(prefix) + r"(\d+)\Z") for prefix, side in sides}
    streams: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for record in records:
        for side, pattern in patterns.items():
            if matched := pattern.match(record["quantity"]):
                streams.setdefault((record["thing"], matched.group(1), side), []).append(record)
    return streams


def reference_join(records: Iterable[dict[str, Any]], spec: Spec = POWER) -> list[dict[str, Any]]:
    """The output records of `records` (each stream's in arrival order), by thing, axis and left time."""
    streams = _joined_streams(records, spec)
    outputs = []
    for thing, axis in sorted({(thing, axis) for thing, axis, _side in streams}):
        left_lines = timelines(streams.get((thing, axis, "left"), []), spec)[0]
        right_lines = timelines(streams.get((thing, axis, "right"), []), spec)[0]
        for line in range(min(len(left_lines), len(right_lines))):
            left_ended, right_ended = line < len(left_lines) - 1, line < len(right_lines) - 1
            left = {r["phenomenonTime"]: r for r in _stream_joins(left_lines[line], spec.bound_ms, left_ended)}
            right = {r["phenomenonTime"]: r for r in _stream_joins(right_lines[line], spec.bound_ms, right_ended)}
            for lt, rt, case in _pairs(sorted(left), sorted(right), spec.delta_time_ms, left_ended, right_ended):
                output = output_record(thing, spec, axis, left[lt], right[rt], case)
                if math.isfinite(output["result"]):
                    outputs.append(output)
    return outputs


def reference_outliers(records: Iterable[dict[str, Any]], spec: Spec = POWER) -> list[dict[str, Any]]:
    """The records of joined streams the clock rule drops as outliers, by thing, axis, side and arrival."""
    streams = _joined_streams(records, spec)
    return [outlier for stream in sorted(streams) for outlier in timelines(streams[stream], spec)[1]]


def reference_turned_away(records: Iterable[dict[str, Any]], spec: Spec = POWER) -> list[dict[str, Any]]:
    """The records of joined streams turned away other than as outliers, each of which a joiner dead-letters: late
    in their timeline, or in conflict with a record accepted or set aside at their time (not repeats)."""
    turned_away = []
    for _stream, stream_records in sorted(_joined_streams(records, spec).items()):
        lines, _outliers, conflicts = timelines(stream_records, spec)
        turned_away += conflicts
        for line in lines:
            turned_away += _accepting(line, spec.bound_ms)[2]
    return turned_away
