"""FastClient's own reading of QoS 1 PUBLISH packets, and its batched PUBACKs, over a socket pair."""
from __future__ import annotations

import socket
import struct
import threading

import pytest
from paho.mqtt.client import _ConnectionState
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from pipeline_core.settings import ConnectionSettings
from pipeline_core.mqtt import new_client
from support import wait_for


def publish_packet(topic: bytes, payload: bytes, qos: int, mid: int = 0, dup: bool = False,
                   retain: bool = False) -> bytes:
    body = struct.pack("!H", len(topic)) + topic + (struct.pack("!H", mid) if qos else b"") + payload
    length, encoded = len(body), b""
    while True:
        digit, length = length % 128, length // 128
        encoded += bytes([digit | (0x80 if length else 0)])
        if not length:
            break
    return bytes([0x30 | qos << 1 | dup << 3 | retain]) + encoded + body


@pytest.fixture
def connected():
    """A FastClient wired to one end of a socket pair, as if connected; yields (client, peer, received)."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    client = new_client(ConnectionSettings(), "unit", protocol=MQTTProtocolVersion.MQTTv311, manual_ack=True)
    client._sock = ours
    client._state = _ConnectionState.MQTT_CS_CONNECTED
    received = []
    client.on_message = lambda _c, _u, m: received.append((m.topic, m.payload, m.mid, m.qos, bool(m.dup),
                                                           bool(m.retain)))
    yield client, peer, received
    peer.close()
    ours.close()


def read_all(client) -> None:
    for _ in range(100):
        if client.loop_read() != MQTTErrorCode.MQTT_ERR_SUCCESS or not client.has_buffered_input():
            return


def test_messages_whole_split_and_of_other_qos_all_arrive_in_order(connected):
    client, peer, received = connected
    big = b"x" * 300_000  # larger than one socket read: paho's reader takes it in parts
    packets = [publish_packet(b"a/b", b'{"n": 1}', 1, mid=1),
               publish_packet(b"a/b", b'{"n": 2}', 0),
               publish_packet(b"t", b"", 1, mid=65535, dup=True, retain=True),
               publish_packet(b"a/b", big, 1, mid=3),
               publish_packet(b"a/\xc3\xa9", b'{"n": 4}', 1, mid=4)]
    stream = b"".join(packets)
    half = len(packets[0]) + 3  # the second packet is cut in the middle of its header
    peer.sendall(stream[:half])
    read_all(client)
    sender = threading.Thread(target=peer.sendall, args=(stream[half:],))  # more than the socket buffer
    sender.start()
    wait_for(lambda: read_all(client) or len(received) >= len(packets), 10, "every message", interval_s=0)
    sender.join()
    assert received == [("a/b", b'{"n": 1}', 1, 1, False, False), ("a/b", b'{"n": 2}', 0, 0, False, False),
                        ("t", b"", 65535, 1, True, True), ("a/b", big, 3, 1, False, False),
                        ("a/é", b'{"n": 4}', 4, 1, False, False)]


def test_acks_go_out_together_in_order(connected):
    client, peer, _ = connected
    client.ack_all([7, 1, 300])
    assert peer.recv(100) == bytes.fromhex("40020007" "40020001" "4002012c")
