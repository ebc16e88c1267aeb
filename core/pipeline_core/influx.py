"""Shared InfluxDB client set-up and line-protocol escaping: the one place the pipeline imports the
`influxdb` client library from.

That library's package imports its `DataFrameClient`, and with it pandas whenever pandas is installed (the Spark
joiner needs it): about 0.8 s and 80 MB in every process that talks to InfluxDB, which is every stage (its health
metrics) and every `python -m stack` command. The pipeline never uses `DataFrameClient`, so a placeholder stands in
for its module before the package is imported, and importing the client no longer imports pandas. A process that
imported `influxdb` before this module keeps the library's own module, which changes nothing but its start-up."""
from __future__ import annotations

import json
import re
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
           "influx_client", "shown_name", "stored_name", "tls_arguments"]

# What InfluxDB 1.x cannot take and give back as it is in a tag value (measured with Debian's influxd 1.6): a line
# feed ends a line-protocol line; a backslash at the end escapes the separator after it; InfluxQL reads no NUL
# (its end of input) and no carriage return (read as a line feed) in a query's string or regular expression, so a
# dashboard's `WHERE thing =~ /.../` could not name such a tag. And the mark that starts a stored escape.
_NOT_AS_IT_IS = re.compile(r'[\x00\n\r]|\\\Z|\A\\"')
_STORED_MARK = '\\"'
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


def stored_name(name: str) -> str:
    """A name (thing, quantity, a join's case) as its InfluxDB tag value: the name as it is, unless InfluxDB cannot
    carry it so (it holds a NUL, a line feed or a carriage return, or ends with a backslash) or it starts with the
    escape's mark (a backslash and a double quote); then a backslash followed by the name as a JSON string
    (``Press\\n3`` with a line feed becomes ``\\"Press\\n3"``). Every name written as it is holds none of these,
    so `shown_name` tells the two apart and gives back the name."""
    if _NOT_AS_IT_IS.search(name) is None:
        return name
    return "\\" + json.dumps(name, ensure_ascii=False)


def shown_name(value: str) -> str:
    """The name an InfluxDB tag value stands for (`stored_name`'s inverse): what readers show."""
    if not value.startswith(_STORED_MARK):
        return value
    try:
        name = json.loads(value[1:])
    except ValueError:  # not written by stored_name: shown as it is
        return value
    return name if isinstance(name, str) else value


def escape_tag(value: str) -> str:
    """A tag key or value in line protocol; raises `InvalidRecord` for what it cannot carry."""
    if "\n" in value or "\r" in value:
        raise InvalidRecord(f"tag value {value!r} contains a line break")
    if value.endswith("\\"):
        # A trailing backslash would escape the separator after it and corrupt the line.
        raise InvalidRecord(f"tag value {value!r} ends with a backslash")
    return value.translate(_TAG_ESCAPES)
