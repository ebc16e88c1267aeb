"""The pipeline database's retention policies and the continuous queries that keep its long-term history.

Every point goes into a policy named for what it is, so each kind of data is kept as long as it is useful
and the database stays bounded:

* ``raw``: the raw quantities of machine.data (and the dead-letter counts), default 30 days;
* ``joined``: the join results of machine.out, default 90 days;
* ``health``: the stages' `pipeline_health` points (one per stage every 10 s), default 7 days;
* ``history``: one point per minute, thing and quantity (mean, min, max, sum, count) of the raw quantities
  and of the join results, computed by continuous queries, default 104 weeks (two years); and the same per
  10 minutes and per hour, each computed from the one below it, so a view over days or weeks reads a tenth or
  a sixtieth of the minutes (the dashboards pick the coarsest that still fills their width); and of the raw
  quantities, the records per machine (every quantity of it added up: `count` of ``machinedata_by_thing_1m``,
  ``_10m``, ``_1h``, each from the tier beside it), so counting or ranking a plant's machines reads a series per
  machine, not one per machine and quantity. And the stages' counters per machine (`machine_health`, a point per
  machine every 10 s, each counter since its process started) per 10 minutes, the highest of each (its value at
  the interval's end) as `max_<counter>` in ``machine_health_10m``, per stage, process and machine.

`ensure_retention` creates the database, the policies and the continuous queries, and alters a policy's
duration or replaces a query when the settings changed; it is idempotent. The native stack calls it when
InfluxDB has started; `python -m stack influxdb` does the same for any InfluxDB (Compose's set-up runs it).
Needs an InfluxDB admin. Durations are InfluxQL literals (`30d`, `12h`, `104w`) or `INF` (kept forever).
"""
from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, fields
from datetime import datetime, timezone

from .influx import InfluxDBClient, influx_client
from .settings import InfluxSettings, load_settings, setting

log = logging.getLogger(__name__)

RAW_POLICY = "raw"
JOINED_POLICY = "joined"
HEALTH_POLICY = "health"
HISTORY_POLICY = "history"

# The DB connector's measurements (its settings default to these) and their downsampled history.
DATA_MEASUREMENT = "machinedata"
JOINED_MEASUREMENT = "joined"
DEADLETTER_MEASUREMENT = "deadletters"
HISTORY_SUFFIX = "_1m"
HISTORY_INTERVAL = "1m"
# A continuous query recomputes the last 10 minutes every minute, so points that reach InfluxDB up to
# 10 minutes after their time (the pipeline's lag, a DB connector catching up) are in the history too.
HISTORY_RESAMPLE_FOR = "10m"


@dataclass(frozen=True)
class RollupTier:
    """A coarser history computed from a finer one: `<measurement>_<interval>` from `<measurement>_<source>`,
    every `every` over the last `resample_for`. Running more often than its interval, a continuous query writes
    its current interval from what is there so far and overwrites it as more arrives; `resample_for` reaches back
    past the finer tier's own 10 minutes of late points."""

    interval: str
    source: str
    every: str
    resample_for: str


COARSER_TIERS = (RollupTier("10m", "1m", every="1m", resample_for="30m"),
                 RollupTier("1h", "10m", every="5m", resample_for="2h"))
_INTERVAL_NS = {"10m": 600 * 10**9, "1h": 3600 * 10**9}
# The records per machine: a measurement's counts per tier, its quantities added up (`<measurement>_by_thing_<tier>`).
THING_ROLLUP_MEASUREMENTS = (DATA_MEASUREMENT,)
THING_ROLLUP_SUFFIX = "_by_thing"
# Per machine, what a stage counted of it (pipeline_core.health_metrics writes it), and its 10-minute history.
MACHINE_HEALTH_MEASUREMENT = "machine_health"
MACHINE_HEALTH_TIER = "10m"
# Each per-machine tier's schedule: as the tier it adds up is kept (the 1-minute one every minute over the last 10).
_TIER_SCHEDULE = {HISTORY_INTERVAL: (HISTORY_INTERVAL, HISTORY_RESAMPLE_FOR),
                  **{tier.interval: (tier.every, tier.resample_for) for tier in COARSER_TIERS}}

# A duration as the settings give it (whole hours, days or weeks) and as InfluxDB shows it (720h0m0s).
_DURATION = re.compile(r"^(?:(\d+)([hdw])|INF)$")
_UNIT_S = {"h": 3600, "d": 86400, "w": 7 * 86400}
_SHOWN_PART = re.compile(r"(\d+)([hms])")
_SHOWN_UNIT_S = {"h": 3600, "m": 60, "s": 1}


@dataclass(frozen=True)
class RetentionSettings(InfluxSettings):
    """How long the pipeline's InfluxDB database keeps each kind of point (InfluxQL durations or INF)."""

    influxdb_raw_retention: str = setting("30d", "INFLUXDB_RAW_RETENTION",
                                          "how long raw quantities (machine.data) and dead-letter counts are kept")
    influxdb_joined_retention: str = setting("90d", "INFLUXDB_JOINED_RETENTION",
                                             "how long join results (machine.out) are kept")
    influxdb_health_retention: str = setting("7d", "INFLUXDB_HEALTH_RETENTION",
                                             "how long the stages' health points (pipeline_health) are kept")
    influxdb_history_retention: str = setting("104w", "INFLUXDB_HISTORY_RETENTION",
                                              "how long the 1-minute history of raw and joined data is kept")


def duration_s(duration: str) -> int:
    """Seconds of an InfluxQL duration as the settings give it (`30d`) or InfluxDB shows it (`720h0m0s`);
    0 for INF (InfluxDB's 'forever')."""
    text = duration.strip()
    match = _DURATION.match(text)
    if match:
        return int(match.group(1)) * _UNIT_S[match.group(2)] if match.group(1) else 0
    parts = _SHOWN_PART.findall(text)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != text:
        raise ValueError(f"{duration!r} is not a retention duration")
    return sum(int(n) * _SHOWN_UNIT_S[u] for n, u in parts)


def policies(settings: RetentionSettings) -> dict[str, str]:
    """Policy name -> duration, checked."""
    wanted = {RAW_POLICY: settings.influxdb_raw_retention, JOINED_POLICY: settings.influxdb_joined_retention,
              HEALTH_POLICY: settings.influxdb_health_retention, HISTORY_POLICY: settings.influxdb_history_retention}
    for name, duration in wanted.items():
        if not _DURATION.match(duration.strip()):  # no unit below InfluxDB's minimum of an hour
            raise ValueError(f"INFLUXDB_{name.upper()}_RETENTION={duration!r}: give a whole number of hours, "
                             "days or weeks (12h, 30d, 104w) or INF")
    return wanted


def history_query(database: str, measurement: str, policy: str, where: str = "") -> str:
    """The SELECT INTO of one continuous query: per minute, thing and quantity, the mean, min, max, sum and
    count of `result` in `policy`.`measurement`, into history.`measurement`_1m (sum and count let a coarser
    view weigh the minutes: sum("sum") / sum("count")). `where`: a time range, when run by hand."""
    return (f'SELECT mean("result") AS "mean", min("result") AS "min", max("result") AS "max", '
            f'sum("result") AS "sum", count("result") AS "count" '
            f'INTO "{database}"."{HISTORY_POLICY}"."{measurement}{HISTORY_SUFFIX}" '
            f'FROM "{database}"."{policy}"."{measurement}" {f"WHERE {where} " if where else ""}'
            f'GROUP BY time({HISTORY_INTERVAL}), "thing", "quantity"')


def rollup_query(database: str, measurement: str, tier: RollupTier, where: str = "") -> str:
    """The SELECT INTO of a coarser tier: the finer tier's sums, counts, minima and maxima added up per
    `tier.interval`, thing and quantity, and the mean they make."""
    source = f'"{database}"."{HISTORY_POLICY}"."{measurement}_{tier.source}"'
    return (f'SELECT sum("sum") / sum("count") AS "mean", min("min") AS "min", max("max") AS "max", '
            f'sum("sum") AS "sum", sum("count") AS "count" '
            f'INTO "{database}"."{HISTORY_POLICY}"."{measurement}_{tier.interval}" '
            f'FROM {source} {f"WHERE {where} " if where else ""}GROUP BY time({tier.interval}), "thing", "quantity"')


def thing_rollup_query(database: str, measurement: str, interval: str, where: str = "") -> str:
    """The SELECT INTO of the records per machine of one tier: the tier's counts added up per interval and thing."""
    return (f'SELECT sum("count") AS "count" '
            f'INTO "{database}"."{HISTORY_POLICY}"."{measurement}{THING_ROLLUP_SUFFIX}_{interval}" '
            f'FROM "{database}"."{HISTORY_POLICY}"."{measurement}_{interval}" {f"WHERE {where} " if where else ""}'
            f'GROUP BY time({interval}), "thing"')


def machine_health_query(database: str, where: str = "") -> str:
    """The SELECT INTO of the stages' per-machine counters per 10 minutes: each counter's highest, per stage,
    process and machine (every tag)."""
    return (f'SELECT max(*) INTO "{database}"."{HISTORY_POLICY}"."{MACHINE_HEALTH_MEASUREMENT}_{MACHINE_HEALTH_TIER}" '
            f'FROM "{database}"."{HEALTH_POLICY}"."{MACHINE_HEALTH_MEASUREMENT}" {f"WHERE {where} " if where else ""}'
            f'GROUP BY time({MACHINE_HEALTH_TIER}), *')


def _aligned_where(start: str, end: str, interval: str) -> str:
    """`start` to `end` (RFC 3339) widened to whole `interval`s: a coarser tier's intervals the range touches."""
    size_ns = _INTERVAL_NS[interval]
    start_ns = _epoch_ns(start) // size_ns * size_ns
    end_ns = -(-_epoch_ns(end) // size_ns) * size_ns
    return f"time >= {start_ns} AND time < {end_ns}"


def _epoch_ns(moment: str) -> int:
    parsed = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(parsed.timestamp()) * 10**9 + parsed.microsecond * 1000


def backfill_history(client: InfluxDBClient, database: str, start: str, end: str) -> int:
    """Compute the history of a time range by hand (RFC 3339 times): what the continuous queries did not see,
    such as data loaded more than 10 minutes after its time. Every tier, finest first, each coarser one over the
    whole intervals the range touches. Returns the points written."""
    written = 0
    for measurement, policy in ((DATA_MEASUREMENT, RAW_POLICY), (JOINED_MEASUREMENT, JOINED_POLICY)):
        queries = [history_query(database, measurement, policy, f"time >= '{start}' AND time < '{end}'"),
                   *(rollup_query(database, measurement, tier, _aligned_where(start, end, tier.interval))
                     for tier in COARSER_TIERS)]
        if measurement in THING_ROLLUP_MEASUREMENTS:
            queries.append(thing_rollup_query(database, measurement, HISTORY_INTERVAL,
                                              f"time >= '{start}' AND time < '{end}'"))
            queries.extend(thing_rollup_query(database, measurement, tier.interval,
                                              _aligned_where(start, end, tier.interval)) for tier in COARSER_TIERS)
        for query in queries:
            written += sum(int(point["written"]) for point in client.query(query, method="POST").get_points())
    query = machine_health_query(database, _aligned_where(start, end, MACHINE_HEALTH_TIER))
    return written + sum(int(point["written"]) for point in client.query(query, method="POST").get_points())


def continuous_queries(database: str) -> dict[str, str]:
    """Continuous query name -> its CREATE statement."""
    queries = {}
    for measurement, policy in ((DATA_MEASUREMENT, RAW_POLICY), (JOINED_MEASUREMENT, JOINED_POLICY)):
        name = f"{measurement}{HISTORY_SUFFIX}"
        queries[name] = (f'CREATE CONTINUOUS QUERY "{name}" ON "{database}" '
                         f'RESAMPLE EVERY {HISTORY_INTERVAL} FOR {HISTORY_RESAMPLE_FOR} '
                         f'BEGIN {history_query(database, measurement, policy)} END')
        for tier in COARSER_TIERS:
            name = f"{measurement}_{tier.interval}"
            queries[name] = (f'CREATE CONTINUOUS QUERY "{name}" ON "{database}" '
                             f'RESAMPLE EVERY {tier.every} FOR {tier.resample_for} '
                             f'BEGIN {rollup_query(database, measurement, tier)} END')
    for measurement in THING_ROLLUP_MEASUREMENTS:
        for interval, (every, resample_for) in _TIER_SCHEDULE.items():
            name = f"{measurement}{THING_ROLLUP_SUFFIX}_{interval}"
            queries[name] = (f'CREATE CONTINUOUS QUERY "{name}" ON "{database}" '
                             f'RESAMPLE EVERY {every} FOR {resample_for} '
                             f'BEGIN {thing_rollup_query(database, measurement, interval)} END')
    name = f"{MACHINE_HEALTH_MEASUREMENT}_{MACHINE_HEALTH_TIER}"
    every, resample_for = _TIER_SCHEDULE[MACHINE_HEALTH_TIER]
    queries[name] = (f'CREATE CONTINUOUS QUERY "{name}" ON "{database}" RESAMPLE EVERY {every} FOR {resample_for} '
                     f'BEGIN {machine_health_query(database)} END')
    return queries


def _rows(result: object) -> list[dict]:
    return list(result.get_points())  # type: ignore[attr-defined]


def _same_query(shown: str, created: str) -> bool:
    """InfluxDB shows a continuous query rewritten a little (quoting, `:MEASUREMENT`): compare them loosely."""
    def norm(text: str) -> str:
        return re.sub(r'[\s"]', "", text).lower()
    return norm(shown) == norm(created)


def ensure_retention(client: InfluxDBClient, database: str, settings: RetentionSettings) -> list[str]:
    """Create the database, its policies and continuous queries, or bring them to the settings; returns
    what changed, for a log line. Idempotent."""
    wanted = policies(settings)
    changes: list[str] = []
    client.query(f'CREATE DATABASE "{database}"', method="POST")
    existing = {row["name"]: row for row in _rows(client.query(f'SHOW RETENTION POLICIES ON "{database}"'))}
    for name, duration in wanted.items():
        literal = duration.strip()
        if name not in existing:
            client.query(f'CREATE RETENTION POLICY "{name}" ON "{database}" DURATION {literal} REPLICATION 1'
                         + (" DEFAULT" if name == RAW_POLICY else ""), method="POST")
            changes.append(f"created policy {name} ({literal})")
        elif duration_s(existing[name]["duration"]) != duration_s(literal):
            client.query(f'ALTER RETENTION POLICY "{name}" ON "{database}" DURATION {literal}', method="POST")
            changes.append(f"policy {name}: {existing[name]['duration']} -> {literal}")
    shown = {name: query for series in client.query("SHOW CONTINUOUS QUERIES").raw.get("series", [])
             if series.get("name") == database for name, query in series.get("values", [])}
    for name, statement in continuous_queries(database).items():
        if name in shown and _same_query(shown[name], statement):
            continue
        if name in shown:
            client.query(f'DROP CONTINUOUS QUERY "{name}" ON "{database}"', method="POST")
        client.query(statement, method="POST")
        changes.append(f"{'replaced' if name in shown else 'created'} continuous query {name}")
    if changes:
        log.info("InfluxDB %s: %s", database, "; ".join(changes))
    return changes


def provision(settings: RetentionSettings) -> list[str]:
    """`ensure_retention` on the settings' InfluxDB and database: what the stack runs once InfluxDB answers.
    A retention setting InfluxDB would refuse ends the program with the reason."""
    try:
        policies(settings)
    except ValueError as error:
        raise SystemExit(f"InfluxDB retention: {error}") from None
    return ensure_retention(influx_client(settings), settings.influxdb_database, settings)


def retention_settings(settings: InfluxSettings) -> RetentionSettings:
    """The retention settings from the environment, for the InfluxDB and database of `settings`: what a
    writer uses to create the policies when it finds them missing (a database dropped under it)."""
    durations = load_settings(RetentionSettings, [])
    return dataclasses.replace(durations, **{f.name: getattr(settings, f.name) for f in fields(InfluxSettings)})


def policy_missing(error: Exception) -> bool:
    """InfluxDB's answer to a write into a policy (or database) that does not exist."""
    return getattr(error, "code", None) == 404 or "retention policy not found" in str(error)
