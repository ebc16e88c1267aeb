"""InfluxDB 1.x behind the DB connector's sink interface: one line-protocol point per record, batched into one
request per retention policy (`writer.InfluxWriter`)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter

from pipeline_core.influx import influx_client
from pipeline_core.influx_retention import JOINED_POLICY, RAW_POLICY

from .points import PowerLevels, deadletter_point, record_line
from .settings import DbConnectorSettings
from .sink import Consumed, Refused, Sink, Source
from .writer import InfluxWriter

# An item: the point's line and the retention policy it goes into.
Point = tuple[str, str]
# Module globals: an enum member looked up on its class per record cost as much as a tenth of the conversion.
_DATA, _JOINED = Source.DATA, Source.JOINED
_line_of, _policy_of = itemgetter(0), itemgetter(1)


class InfluxSink(Sink[Point]):
    """Raw quantities into `raw`, join results into `joined`, a count point per dead letter into `raw`."""

    name = "InfluxDB"

    def __init__(self, writer: InfluxWriter, settings: DbConnectorSettings) -> None:
        self._writer = writer
        self._levels = PowerLevels.parse(settings.level_thresholds)
        self._data_measurement = settings.data_measurement
        self._joined_measurement = settings.joined_measurement
        self._deadletter_measurement = settings.deadletter_measurement
        self._where = f"InfluxDB {settings.influxdb_host}:{settings.influxdb_port}/{settings.influxdb_database}"

    def __str__(self) -> str:
        return self._where

    @classmethod
    def from_settings(cls, settings: DbConnectorSettings) -> InfluxSink:
        return cls(InfluxWriter(influx_client(settings), settings.influxdb_database, settings), settings)

    def setup(self) -> None:
        self._writer.ensure_database()

    def convert(self, record: Consumed) -> Point:
        source = record.source
        if source is _DATA:
            return record_line(record.value, self._data_measurement), RAW_POLICY
        if source is _JOINED:
            return record_line(record.value, self._joined_measurement, self._levels), JOINED_POLICY
        return deadletter_point(self._deadletter_measurement, record.value, record.timestamp_ms, record.partition,
                                record.offset), RAW_POLICY

    def write(self, items: Sequence[Point]) -> list[Refused]:
        """One request per retention policy (split further only where InfluxDB refuses points)."""
        policies = set(map(_policy_of, items))
        if len(policies) == 1:  # the common batch, taken apart without a Python loop per item
            return self._writer.write(list(map(_line_of, items)), policies.pop())
        indices_by_policy: dict[str, list[int]] = {}
        for index, (_line, policy) in enumerate(items):
            indices_by_policy.setdefault(policy, []).append(index)
        refused = []
        for policy, indices in indices_by_policy.items():
            for point in self._writer.write([items[index][0] for index in indices], policy):
                refused.append(Refused(indices[point.index], point.reason))
        return sorted(refused, key=lambda point: point.index)

    def health_values(self) -> Mapping[str, int]:
        return {"influxdb_requests": self._writer.requests, "influxdb_retries": self._writer.retries}
