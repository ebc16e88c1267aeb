"""Shared InfluxDB client set-up and line-protocol escaping."""
from __future__ import annotations

from influxdb import InfluxDBClient

from .records import InvalidRecord
from .settings import InfluxSettings

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
