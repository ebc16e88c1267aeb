"""Shared InfluxDB client set-up and line-protocol escaping: the one place the pipeline imports the
`influxdb` client library from.

That library's package imports its `DataFrameClient`, and with it pandas whenever pandas is installed (the Spark
joiner needs it): about 0.8 s and 80 MB in every process that talks to InfluxDB, which is every stage (its health
metrics) and every `python -m stack` command. The pipeline never uses `DataFrameClient`, so a placeholder stands in
for its module before the package is imported, and importing the client no longer imports pandas. A process that
imported `influxdb` before this module keeps the library's own module, which changes nothing but its start-up."""
from __future__ import annotations

import sys
import types


class _NoDataFrameClient:
    """Stands in for `influxdb.DataFrameClient`, which the pipeline does not use."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise ImportError("influxdb.DataFrameClient is not available in the pipeline's processes "
                          "(pipeline_core.influx keeps pandas out of them)")


if "influxdb" not in sys.modules:
    _placeholder = types.ModuleType("influxdb.dataframe_client", _NoDataFrameClient.__doc__)
    _placeholder.DataFrameClient = _NoDataFrameClient  # type: ignore[attr-defined]
    sys.modules["influxdb.dataframe_client"] = _placeholder

from influxdb import InfluxDBClient  # noqa: E402 (after the placeholder)
from influxdb.exceptions import InfluxDBClientError, InfluxDBServerError  # noqa: E402

from .records import InvalidRecord  # noqa: E402
from .settings import InfluxSettings  # noqa: E402

__all__ = ["InfluxDBClient", "InfluxDBClientError", "InfluxDBServerError", "escape_measurement", "escape_tag",
           "influx_client", "tls_arguments"]

_MEASUREMENT_ESCAPES = str.maketrans({",": r"\,", " ": r"\ "})
_TAG_ESCAPES = str.maketrans({",": r"\,", " ": r"\ ", "=": r"\="})


def influx_client(settings: InfluxSettings, timeout_s: float = 30.0) -> InfluxDBClient:
    """A client for the pipeline's database as the user in `settings`: a secure stack gives each process
    its principal's (`credentials.environ_for`); with none, the library's root/root, which InfluxDB
    ignores while its auth is off (the insecure native stack)."""
    return InfluxDBClient(host=settings.influxdb_host, port=settings.influxdb_port,
                          username=settings.influxdb_username or "root",
                          password=settings.influxdb_password or "root",
                          database=settings.influxdb_database, timeout=timeout_s, **tls_arguments(settings))


def tls_arguments(settings: InfluxSettings) -> dict[str, object]:
    """HTTPS verified with INFLUXDB_TLS_CA_FILE when it is set (InfluxDB reached across hosts), else plain HTTP."""
    ca_file = settings.influxdb_tls_ca_file
    return {"ssl": True, "verify_ssl": str(ca_file)} if ca_file else {}


def escape_measurement(name: str) -> str:
    """A measurement name in line protocol."""
    return name.translate(_MEASUREMENT_ESCAPES)


def escape_tag(value: str) -> str:
    """A tag key or value in line protocol; raises `InvalidRecord` for what it cannot carry."""
    if "\n" in value or "\r" in value:
        raise InvalidRecord(f"tag value {value!r} contains a line break")
    if value.endswith("\\"):
        # A trailing backslash would escape the separator after it and corrupt the line.
        raise InvalidRecord(f"tag value {value!r} ends with a backslash")
    return value.translate(_TAG_ESCAPES)
