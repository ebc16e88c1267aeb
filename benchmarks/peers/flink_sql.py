"""PyFlink SQL's event-time joins of two streams, as Flink's SQL guide sets them up, over the Kafka SQL connector.

The input table reads ``machine.data`` (JSON) with an event-time attribute from phenomenonTime and a watermark
trailing by the run's disorder bound (``t - max_out_of_orderness - 1 ms``; 1 ms on an input in time order),
per partition, the least of them the job's. No idle timeout: on a backlog that keeps a partition the busy
machine has not read from for a while from being passed over, and then its records dropped as late. Two views split it
into the left and the right side of each join spec (thing, axis, time, value). Then, by ``mode``:

- ``interval``: ``r.t BETWEEN l.t - delta AND l.t + delta``, every left record with every right record within
  delta_time of it (an inner interval join: pairs out as soon as both sides are there; the watermark bounds
  the state and drops records behind it);
- ``temporal``: ``JOIN right_versions FOR SYSTEM_TIME AS OF l.t``, every left record with the version of the
  right side as of its time, i.e. the latest right record at or before it, kept if at most delta_time
  earlier; the versioned table is the right side deduplicated to its latest row per (thing, axis), the view
  Flink's guide gives for an append-only stream, whose primary key and event time the planner infers. A left
  record is joined when the watermark passes it.

The output goes to the Kafka SQL sink exactly once (Kafka transactions committed by checkpoints, every
``checkpoint_interval_ms``). The source is bounded by the run's end offsets: the job ends once it has read
the run's input, flushing what waits for the watermark. Flink's own Kafka SQL connector is one jar from
Maven Central (``venvs.flink_connector_jar``); Java 17. Run as ``python -m benchmarks.peers.flink_sql
<settings.json>`` in the venv of ``venvs.REQUIREMENTS["flink"]``.
"""
from __future__ import annotations

import signal
import sys
import time
import traceback
from typing import Any

from pyflink.table import EnvironmentSettings, TableEnvironment

from benchmarks.peers import peer_io

FORMULA_SQL = {
    "power": "2 * PI() / 60 * l.res * r.res",
    "product": "l.res * r.res",
    "difference": "l.res - r.res",
    "ratio": "l.res / NULLIF(r.res, 0)",
}


def literal(text: str) -> str:
    """A SQL string literal (Flink reads backslashes as they are)."""
    return "'" + text.replace("'", "''") + "'"


def interval(milliseconds: float) -> str:
    return f"INTERVAL '{milliseconds / 1000:.3f}' SECOND"


def statements(settings: dict[str, Any]) -> list[str]:
    """The DDL and the INSERT of the job."""
    bounded = ";".join(f"partition:{partition},offset:{offset}"
                       for partition, offset in enumerate(settings["end_offsets"]))
    # Flink's bounded out-of-orderness: the watermark trails the newest time by the bound and 1 ms, so that
    # records of the newest time (another machine's, in the same partition) are not yet behind it.
    watermark = f"t - {interval(settings['max_out_of_orderness_s'] * 1000 + 1)}"
    ddl = [f"""
        CREATE TABLE records (
            thing STRING, quantity STRING, phenomenonTime DOUBLE, `result` DOUBLE,
            t AS TO_TIMESTAMP_LTZ(CAST(phenomenonTime AS BIGINT), 3),
            WATERMARK FOR t AS {watermark}
        ) WITH (
            'connector' = 'kafka', 'topic' = {literal(settings['input_topic'])},
            'properties.bootstrap.servers' = {literal(settings['bootstrap'])},
            'properties.group.id' = {literal(settings['group'])},
            'scan.startup.mode' = 'earliest-offset',
            'scan.bounded.mode' = 'specific-offsets', 'scan.bounded.specific-offsets' = {literal(bounded)},
            'format' = 'json', 'json.ignore-parse-errors' = 'true'
        )""", f"""
        CREATE TABLE joined (
            thing STRING, quantity STRING, phenomenonTime DOUBLE, `result` DOUBLE,
            `left` ROW<quantity STRING, phenomenonTime DOUBLE, `result` DOUBLE>,
            `right` ROW<quantity STRING, phenomenonTime DOUBLE, `result` DOUBLE>
        ) WITH (
            'connector' = 'kafka', 'topic' = {literal(settings['output_topic'])},
            'properties.bootstrap.servers' = {literal(settings['bootstrap'])},
            'sink.delivery-guarantee' = 'exactly-once',
            'sink.transactional-id-prefix' = {literal(settings['group'])},
            'properties.transaction.timeout.ms' = '600000',
            'format' = 'json'
        )"""]
    selects = []
    for index, spec in enumerate(peer_io.specs(settings)):
        for side, regex in (("l", spec.left_regex), ("r", spec.right_regex)):
            ddl.append(f"""
                CREATE TEMPORARY VIEW side_{side}{index} AS
                SELECT thing, REGEXP_EXTRACT(quantity, {literal(regex)}, 1) AS axis, quantity,
                       phenomenonTime AS ms, `result` AS res, t
                FROM records WHERE REGEXP(quantity, {literal(regex)})""")
        within = "" if spec.delta_ms is None else f"l.ms - r.ms <= {spec.delta_ms}"
        output = f"""
            SELECT l.thing, CONCAT({literal(spec.output_prefix)}, l.axis, {literal(spec.output_suffix)}),
                   (l.ms + r.ms) / 2, {FORMULA_SQL[spec.formula]},
                   ROW(l.quantity, l.ms, l.res), ROW(r.quantity, r.ms, r.res)"""
        if settings["mode"] == "interval":
            if spec.delta_ms is None:
                raise ValueError(f"join '{spec.name}': an interval join needs a delta_time to bound its state")
            selects.append(f"""{output}
                FROM side_l{index} AS l, side_r{index} AS r
                WHERE l.thing = r.thing AND l.axis = r.axis
                  AND r.t BETWEEN l.t - {interval(spec.delta_ms)} AND l.t + {interval(spec.delta_ms)}""")
        else:
            ddl.append(f"""
                CREATE TEMPORARY VIEW versions_r{index} AS
                SELECT thing, axis, quantity, ms, res, t FROM (
                    SELECT *, ROW_NUMBER() OVER (PARTITION BY thing, axis ORDER BY t DESC) AS row_number_
                    FROM side_r{index})
                WHERE row_number_ = 1""")
            selects.append(f"""{output}
                FROM side_l{index} AS l
                JOIN versions_r{index} FOR SYSTEM_TIME AS OF l.t AS r ON l.thing = r.thing AND l.axis = r.axis
                {'WHERE ' + within if within else ''}""")
    return [*ddl, "INSERT INTO joined " + " UNION ALL ".join(selects)]


def main() -> None:
    settings = peer_io.load_settings()
    status = peer_io.Status(settings["status_file"])
    try:
        environment = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
        config = environment.get_config()
        config.set("pipeline.jars", f"file://{settings['connector_jar']}")
        config.set("execution.checkpointing.interval", f"{settings['checkpoint_interval_ms']} ms")
        config.set("parallelism.default", str(settings["parallelism"]))
        config.set("pipeline.name", f"join-peers {settings['mode']} join")
        *ddl, insert = statements(settings)
        for statement in ddl:
            environment.execute_sql(statement)
        result = environment.execute_sql(insert)
        client = result.get_job_client()
        while client.get_job_status().result().name not in ("RUNNING", "FINISHED", "FAILED", "CANCELED"):
            time.sleep(0.05)
        status.set(first_input_at=time.time())  # the job's tasks run: its sources read from here
        result.wait()
        status.set(finished=True)
    except Exception:  # noqa: BLE001 - the bench shows the peer's failure
        status.set(error=traceback.format_exc(limit=3)[-2000:])
        raise
    # Stay until stopped, so the bench can read the CPU time of this process and its JVM.
    signal.pause()


if __name__ == "__main__":
    sys.exit(main())
