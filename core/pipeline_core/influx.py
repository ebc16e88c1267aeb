"""Shared InfluxDB client set-up."""
from __future__ import annotations

from influxdb import InfluxDBClient

from .settings import InfluxSettings


def influx_client(settings: InfluxSettings, timeout_s: float = 30.0) -> InfluxDBClient:
    """A client for the pipeline's database; user/password only when configured (Compose)."""
    return InfluxDBClient(host=settings.influxdb_host, port=settings.influxdb_port,
                          username=settings.influxdb_username or "root",
                          password=settings.influxdb_password or "root",
                          database=settings.influxdb_database, timeout=timeout_s)

