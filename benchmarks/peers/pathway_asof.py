"""Pathway's as-of join (``Table.asof_join``) over Kafka, as its documentation sets it up.

The input table reads ``machine.data`` (JSON) with ``pw.io.kafka.read``; per join spec, two tables hold the
left and the right side (thing, axis, time, value). Then, by ``mode``:

- ``backward``: every left record with the latest right record at or before it (``Direction.BACKWARD``),
  kept if at most delta_time earlier;
- ``both``: the closest Pathway comes to the neighbour join: four as-of joins, every left record with the
  right record before it and the one after it (``BACKWARD``, ``FORWARD``) and every right record with the
  left record before and after it, kept within delta_time, and the union deduplicated by pair.

Pathway keeps its results up to date as input arrives: a left record joined with the right record then
latest is retracted (a record with ``diff`` -1) and joined again when a right record between them comes.
``pw.io.kafka.write`` writes both, with ``time`` and ``diff`` fields, at-least-once (no transactions).
Run as ``python -m benchmarks.peers.pathway_asof <settings.json>`` in the venv of
``venvs.REQUIREMENTS["pathway"]``; one worker thread, Pathway's default.
"""
from __future__ import annotations

import time as clock
import traceback
from typing import Any

import pathway as pw

from benchmarks.peers import peer_io


class Record(pw.Schema):
    thing: str
    quantity: str
    phenomenonTime: float
    result: float


def side(records: pw.Table, spec: peer_io.PeerSpec, index: int) -> pw.Table:
    """The records of one side of a spec, with their axis."""
    with_axis = records.select(thing=pw.this.thing, quantity=pw.this.quantity, ms=pw.this.phenomenonTime,
                               res=pw.this.result,
                               axis=pw.apply_with_type(lambda quantity: spec.axis(index, quantity) or "",
                                                       str, pw.this.quantity),
                               matches=pw.apply_with_type(lambda quantity: spec.axis(index, quantity) is not None,
                                                          bool, pw.this.quantity))
    return with_axis.filter(pw.this.matches)


def asof_pairs(first: pw.Table, second: pw.Table, direction: Any, first_is_left: bool) -> pw.Table:
    """Every record of ``first`` with the record of ``second`` as of it in ``direction``, as pairs
    (left ms, right ms, ...) whatever side ``first`` is."""
    joined = first.asof_join(second, first.ms, second.ms, first.thing == second.thing, first.axis == second.axis,
                             how=pw.JoinMode.LEFT, direction=direction)
    left, right = (first, second) if first_is_left else (second, first)
    pairs = joined.select(thing=first.thing, axis=first.axis, lq=left.quantity, lms=left.ms, lres=left.res,
                          rq=right.quantity, rms=right.ms, rres=right.res)
    matched = pairs.filter(pw.this.rms.is_not_none() & pw.this.lms.is_not_none())
    return matched.with_columns(**{name: pw.unwrap(pw.this[name])
                                   for name in ("lq", "lms", "lres", "rq", "rms", "rres")})


def joined(records: pw.Table, spec: peer_io.PeerSpec, mode: str) -> pw.Table:
    left, right = side(records, spec, 0), side(records, spec, 1)
    backward, forward = pw.temporal.Direction.BACKWARD, pw.temporal.Direction.FORWARD
    if mode == "backward":
        pairs = asof_pairs(left, right, backward, True)
    else:
        pairs = pw.Table.concat_reindex(asof_pairs(left, right, backward, True),
                                        asof_pairs(left, right, forward, True),
                                        asof_pairs(right, left, backward, False),
                                        asof_pairs(right, left, forward, False))
    within = pairs.filter(pw.apply_with_type(lambda lms, rms: spec.within_delta(lms, rms), bool,
                                             pw.this.lms, pw.this.rms))
    if mode != "backward":
        within = within.groupby(pw.this.thing, pw.this.axis, pw.this.lms, pw.this.rms).reduce(
            pw.this.thing, pw.this.axis, pw.this.lms, pw.this.rms, lq=pw.reducers.any(pw.this.lq),
            lres=pw.reducers.any(pw.this.lres), rq=pw.reducers.any(pw.this.rq), rres=pw.reducers.any(pw.this.rres))

    def side_json(quantity: str, ms: float, res: float) -> pw.Json:
        return pw.Json({"quantity": quantity, "phenomenonTime": ms, "result": res})

    return within.select(
        thing=pw.this.thing,
        quantity=pw.apply_with_type(spec.output_quantity, str, pw.this.axis),
        phenomenonTime=(pw.this.lms + pw.this.rms) / 2,
        result=pw.apply_with_type(spec.combine, float, pw.this.lres, pw.this.rres),
        left=pw.apply_with_type(side_json, pw.Json, pw.this.lq, pw.this.lms, pw.this.lres),
        right=pw.apply_with_type(side_json, pw.Json, pw.this.rq, pw.this.rms, pw.this.rres))


def main() -> None:
    settings = peer_io.load_settings()
    status = peer_io.Status(settings["status_file"])
    try:
        kafka = {"bootstrap.servers": settings["bootstrap"], "group.id": settings["group"],
                 "auto.offset.reset": "earliest", "session.timeout.ms": "6000"}
        records = pw.io.kafka.read(kafka, topic=settings["input_topic"], format="json", schema=Record,
                                   autocommit_duration_ms=100)

        outputs = [joined(records, spec, settings["mode"]) for spec in peer_io.specs(settings)]
        output = outputs[0] if len(outputs) == 1 else pw.Table.concat_reindex(*outputs)
        # The input count goes to the status through one sink with the output's count: a sink has a time's
        # changes once every table it reads has closed that time, so the count of the records read by then
        # comes when their results are out, not before.
        counts = pw.Table.concat_reindex(records.reduce(count=pw.reducers.count(), inputs=True),
                                         output.reduce(count=pw.reducers.count(), inputs=False))

        def on_count(key: Any, row: dict[str, Any], time: int, is_addition: bool) -> None:
            if is_addition and row["inputs"]:
                status.set(inputs=row["count"])

        pw.io.subscribe(counts, on_change=on_count)
        pw.io.kafka.write(output, {"bootstrap.servers": settings["bootstrap"]}, topic_name=settings["output_topic"],
                          format="json")
        # Its first input is read as the engine starts; the count below comes only with a mini-batch's results.
        status.set(first_input_at=clock.time())
        pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    except Exception:  # noqa: BLE001 - the bench shows the peer's failure
        status.set(error=traceback.format_exc(limit=3)[-2000:])
        raise


if __name__ == "__main__":
    main()
