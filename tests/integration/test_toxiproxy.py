"""Toxiproxy (ops/stack/toxiproxy.py) in front of a real TCP echo server: it passes bytes through unchanged,
its latency toxics delay the link and removing them restores it, and stopping it leaves no process behind.

Needs no stack: the server is built from its Go module on first use (about a minute; once per session)."""
from __future__ import annotations

import random
import socket
import socketserver
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stack.processes import command_line
from stack.toxiproxy import (DELAY_TOXICS, TOXIPROXY_VERSION, ToxiproxyServer, delay_link, ensure_installed,
                             restore_link)
from stack.processes import free_loopback_ports
from support import port_open, wait_for

ROUND_TRIP_MS = 200
ROUND_TRIPS = 15  # per measurement: its median shrugs off a few slow ones on a busy machine
MESSAGE = bytes(range(64))


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True  # a connection left open never holds up the shutdown


@pytest.fixture(scope="session")
def toxiproxy_binary() -> Path:
    return ensure_installed()  # the first run builds it: once for the session, not per test


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP echo server on 127.0.0.1, on a port the system picks."""
    with _EchoServer(("127.0.0.1", 0), _EchoHandler) as server:
        # shutdown() returns at the loop's next poll: every 50 ms, not the default half second.
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="echo-server", daemon=True)
        thread.start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()
            thread.join()


@pytest.fixture
def toxiproxy(toxiproxy_binary: Path) -> Iterator[ToxiproxyServer]:
    with ToxiproxyServer(free_loopback_ports(1)[0], binary=toxiproxy_binary) as server:
        yield server


def _proxy_port(server: ToxiproxyServer, name: str, echo_port: int) -> int:
    """A proxy to the echo server on a port Toxiproxy picks (listen port 0): none chosen here can be taken."""
    created = server.client.create_proxy(name, "127.0.0.1:0", f"127.0.0.1:{echo_port}")
    return int(created["listen"].rsplit(":", 1)[1])


def _connect(port: int) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    # Each request goes out at once: Nagle's algorithm would hold a small write back for an ACK.
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        assert chunk, f"the connection closed after {len(data)} of {size} bytes"
        data += chunk
    return bytes(data)


def _median_round_trip_ms(connection: socket.socket) -> float:
    """The median time of a request and its whole answer, over ROUND_TRIPS of them one after the other."""
    times_ms = []
    for _ in range(ROUND_TRIPS):
        started = time.perf_counter()
        connection.sendall(MESSAGE)
        assert _receive_exactly(connection, len(MESSAGE)) == MESSAGE
        times_ms.append((time.perf_counter() - started) * 1000)
    return statistics.median(times_ms)


def test_the_server_is_the_pinned_release(toxiproxy: ToxiproxyServer) -> None:
    assert toxiproxy.client.version() == TOXIPROXY_VERSION.removeprefix("v")


def test_bytes_pass_through_unchanged(toxiproxy: ToxiproxyServer, echo_port: int) -> None:
    port = _proxy_port(toxiproxy, "echo", echo_port)
    payload = random.Random(20261206).randbytes(1 << 20) + bytes(range(256))  # the same bytes on every run
    with _connect(port) as connection:
        # Sent from a thread while the echo is read back: one after the other, both ways' buffers would fill.
        sender = threading.Thread(target=connection.sendall, args=(payload,))
        sender.start()
        echoed = _receive_exactly(connection, len(payload))
        sender.join()
    assert echoed == payload
    assert toxiproxy.client.proxies()["echo"]["upstream"] == f"127.0.0.1:{echo_port}"


def test_delay_slows_the_link_and_restoring_it_brings_it_back(toxiproxy: ToxiproxyServer, echo_port: int) -> None:
    client = toxiproxy.client
    port = _proxy_port(toxiproxy, "echo", echo_port)
    # One connection throughout: the toxics act on a link already open, as a link between hosts slows mid-run.
    with _connect(port) as connection:
        plain_ms = _median_round_trip_ms(connection)
        delay_link(client, "echo", ROUND_TRIP_MS)
        toxics = {toxic["name"]: toxic for toxic in client.proxies()["echo"]["toxics"]}
        assert {name: (toxics[name]["stream"], toxics[name]["attributes"]["latency"])
                for name in DELAY_TOXICS.values()} == {"delay_upstream": ("upstream", ROUND_TRIP_MS // 2),
                                                       "delay_downstream": ("downstream", ROUND_TRIP_MS // 2)}
        delayed_ms = _median_round_trip_ms(connection)
        # The toxics hold each chunk for their latency from when the proxy read it, and a timer never fires early:
        # the delay adds at least the whole round trip to the plain one.
        assert delayed_ms >= plain_ms + ROUND_TRIP_MS, (
            f"round trip {delayed_ms:.1f} ms with a {ROUND_TRIP_MS} ms delay, {plain_ms:.1f} ms without")
        restore_link(client, "echo")
        assert client.proxies()["echo"]["toxics"] == []
        restored_ms = _median_round_trip_ms(connection)
    # Well under the delay, and under either half of it: no toxic is left on either way.
    assert restored_ms < plain_ms + ROUND_TRIP_MS / 4, (
        f"round trip {restored_ms:.1f} ms after the delay was removed, {plain_ms:.1f} ms before it")


def test_deleted_proxy_stops_listening(toxiproxy: ToxiproxyServer, echo_port: int) -> None:
    port = _proxy_port(toxiproxy, "echo", echo_port)
    assert port_open("127.0.0.1", port)
    toxiproxy.client.delete_proxy("echo")
    assert toxiproxy.client.proxies() == {}
    wait_for(lambda: not port_open("127.0.0.1", port), 10, "the deleted proxy's port to close")


def test_stopping_the_server_leaves_no_process(toxiproxy_binary: Path, echo_port: int) -> None:
    api_port = free_loopback_ports(1)[0]
    with ToxiproxyServer(api_port, binary=toxiproxy_binary) as server:
        assert server.process is not None
        pid = server.process.pid
        proxy_port = _proxy_port(server, "echo", echo_port)
        assert str(toxiproxy_binary) in (command_line(pid) or "")
    # Waited for and reaped: no process, not even a zombie, holds the PID; nothing listens on its ports.
    assert server.process.returncode is not None
    assert command_line(pid) is None
    assert not port_open("127.0.0.1", api_port) and not port_open("127.0.0.1", proxy_port)
