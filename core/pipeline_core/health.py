"""Protocol-level health checks that need no client library state."""
from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path


def mqtt_ready(host: str, port: int, timeout: float = 1.0, *, refusal_counts: bool = False) -> bool:
    """Send an anonymous MQTT 3.1.1 CONNECT and expect a CONNACK that accepts it, or with
    `refusal_counts` (a broker that authenticates) one that refuses it "not authorised": either way
    the broker serves MQTT, without a probe holding any user's credentials."""
    client_id = b"stack-health"
    variable_header = b"\x00\x04MQTT\x04\x02\x00\x05"  # protocol, level 4, clean session, keepalive 5 s
    payload = len(client_id).to_bytes(2, "big") + client_id
    body = variable_header + payload
    packet = bytes([0x10, len(body)]) + body
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(packet)
            reply = conn.recv(4)
            conn.sendall(b"\xe0\x00")  # DISCONNECT
    except OSError:
        return False
    return reply[:2] == b"\x20\x02" and reply[3:4] in ((b"\x00", b"\x05") if refusal_counts else (b"\x00",))


def influxdb_ready(port: int, host: str = "127.0.0.1", timeout: float = 1.0, ca_file: Path | None = None) -> bool:
    """InfluxDB answers `/ping` with 204 No Content once it serves queries (over HTTPS verified with `ca_file` when
    given)."""
    scheme, context = ("https", ssl.create_default_context(cafile=str(ca_file))) if ca_file else ("http", None)
    try:
        with urllib.request.urlopen(f"{scheme}://{host}:{port}/ping", timeout=timeout, context=context) as reply:
            return reply.status == 204
    except (OSError, urllib.error.URLError):
        return False
