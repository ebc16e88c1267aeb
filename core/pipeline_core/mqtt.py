"""A paho-mqtt client tuned for throughput, and the single-threaded network loop that drives it.

Both the stream connector and the simulator (which imports this module) move thousands of small
QoS 1 messages per second. Profiling paho 2.2 showed two costs that have nothing to do with MQTT:
it reads every packet with three or more `recv` system calls (command byte, length bytes, body),
and its background thread wakes through a socket pair on every publish. `FastClient` reads the
socket in large chunks, and `pump` drives the client from the caller's own thread, so callbacks
run on that thread with no locking and no thread hand-off.
"""
from __future__ import annotations

import select
import ssl
import struct
import time
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.client import PUBACK
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from pipeline_core.retry import Backoff
from pipeline_core.settings import MACHINE_STATES_TOPIC, MqttSettings

READ_CHUNK_BYTES = 256 * 1024
PUBLISH_QOS1 = 0x32  # packet type PUBLISH (0x30) with QoS bits 01; DUP and RETAIN masked out
PUBACK_HEADER = struct.Struct("!BBH")  # packet type, remaining length 2, message id
# MQTT 3.1.1 PUBACKs carry neither: one shared instance of each stands for all of them.
PUBACK_SUCCESS = ReasonCode(PacketTypes.PUBACK)
NO_PROPERTIES = Properties(PacketTypes.PUBACK)
# Packets handled per `pump` before control returns to the caller (who polls Kafka, sends acks).
MAX_PACKETS_PER_PUMP = 2000
# The one client id the device user may connect with when the broker authenticates (02_mqtt_broker,
# "Security"): bound to its user, so no other user can take a session such as the stream connector's.
DEVICE_CLIENT_ID = "simulator"
# The stream connector's client id and subscription by default: the stack gives a new broker store its session.
CONNECTOR_CLIENT_ID = "stream-connector"
CONNECTOR_TOPIC_FILTER = f"{MACHINE_STATES_TOPIC}/#"
# Reconnecting to the broker (the simulator and the stream connector): no deadline, the broker is waited for;
# a restarted broker is found again within MAX_RECONNECT_DELAY_S.
MAX_RECONNECT_DELAY_S = 5.0
RECONNECT_BACKOFF = Backoff(0.2, MAX_RECONNECT_DELAY_S)


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """A QoS 1 message as `FastClient` hands it to `on_message` (what paho's MQTTMessage offers
    that the pipeline reads, without the thread condition paho builds for every message)."""

    topic_bytes: bytes
    payload: bytes
    mid: int
    qos: int
    retain: bool
    dup: bool

    @property
    def topic(self) -> str:
        return self.topic_bytes.decode("utf-8", errors="replace")


class FastClient(mqtt.Client):
    """paho's Client, reading its socket through a buffer instead of one `recv` per packet field,
    and parsing incoming MQTT 3.1.1 QoS 1 PUBLISH packets (paho spends ~45 µs on each) and PUBACKs
    (paho builds reason-code and property objects for each) itself.

    Everything else (CONNACK, SUBACK, PINGRESP, QoS 0/2, MQTT 5, packets split across reads) goes
    through paho's own reader. `on_message` receives a `ReceivedMessage` for the QoS 1
    messages parsed here.
    """

    _read_socket: object = None
    _read_buffer: bytes = b""
    _read_position: int = 0

    def _packet_read(self) -> MQTTErrorCode:
        if self._in_packet["command"] != 0 or self._protocol == MQTTProtocolVersion.MQTTv5:
            return super()._packet_read()
        acked = self._buffered_puback()
        if acked is not None:
            self._last_bytes_received = time.monotonic()
            if acked not in self._out_messages:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
            return self._do_on_publish(acked, PUBACK_SUCCESS, NO_PROPERTIES)
        message = self._buffered_qos1_publish()
        if message is None:
            return super()._packet_read()
        self._last_bytes_received = time.monotonic()
        self.on_message(self, self._userdata, message)
        if not self._manual_ack:
            return self._send_puback(message.mid)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _buffered_puback(self) -> int | None:
        """The message id of the next packet, if it is a PUBACK lying whole in the buffer (consumed)."""
        start = self._read_position
        if self._read_socket is not self._sock or len(self._read_buffer) - start < 4:
            return None
        kind, length, mid = PUBACK_HEADER.unpack_from(self._read_buffer, start)
        if kind != PUBACK or length != 2:
            return None
        self._read_position = start + 4
        return mid

    def _buffered_qos1_publish(self) -> ReceivedMessage | None:
        """The next packet, if it is a QoS 1 PUBLISH lying whole in the buffer (consumed), else None."""
        if self.on_message is None or not self.has_buffered_input():
            return None
        buffer, start = self._read_buffer, self._read_position
        command = buffer[start]
        if command & 0xF6 != PUBLISH_QOS1:
            return None
        length, multiplier, position = 0, 1, start + 1
        for position in range(start + 1, min(start + 5, len(buffer))):
            byte = buffer[position]
            length += (byte & 0x7F) * multiplier
            multiplier *= 128
            if not byte & 0x80:
                break
        else:
            return None  # the length itself is split across reads
        body, end = position + 1, position + 1 + length
        if end > len(buffer) or length < 4:
            return None
        topic_end = body + 2 + int.from_bytes(buffer[body:body + 2], "big")
        if topic_end + 2 > end:
            return None  # malformed: let paho report it
        self._read_position = end
        return ReceivedMessage(buffer[body + 2:topic_end], buffer[topic_end + 2:end],
                               int.from_bytes(buffer[topic_end:topic_end + 2], "big"), 1,
                               bool(command & 0x01), bool(command & 0x08))

    def _sock_recv(self, bufsize: int) -> bytes:
        # paho asks for 1 byte, then the length bytes, then the body: serve all from one read.
        if self._read_socket is not self._sock:  # a new connection: the old buffer is stale
            self._read_socket, self._read_buffer, self._read_position = self._sock, b"", 0
        if self._read_position >= len(self._read_buffer):
            if self._sock is None:
                raise ConnectionError("not connected")
            # paho's own read: BlockingIOError when empty, TLS's want-read/want-write mapped to it.
            self._read_buffer = super()._sock_recv(READ_CHUNK_BYTES)
            self._read_position = 0
            if not self._read_buffer:
                return b""  # the broker closed the connection
        chunk = self._read_buffer[self._read_position:self._read_position + bufsize]
        self._read_position += len(chunk)
        return chunk

    def ack_all(self, mids: list[int]) -> None:
        """PUBACK these QoS 1 messages, in this order, with one socket write (paho writes one per ack)."""
        if mids:
            self._packet_queue(PUBACK, b"".join([PUBACK_HEADER.pack(PUBACK, 2, mid) for mid in mids]), 0, 0)

    def has_buffered_input(self) -> bool:
        """True when bytes already read from the socket wait to be parsed (select would not see them)."""
        return self._read_socket is self._sock and self._read_position < len(self._read_buffer)

    def tls_pending(self) -> bool:
        """True when TLS decrypted bytes that were not read yet (select would not see them either)."""
        return isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0


def new_client(settings: MqttSettings, client_id: str, *, protocol: MQTTProtocolVersion,
               clean_session: bool | None = None, manual_ack: bool = False) -> FastClient:
    """A client for the broker in `settings` (credentials and TLS included), not yet connected."""
    client = FastClient(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol,
                        clean_session=clean_session, manual_ack=manual_ack)
    if settings.mqtt_username:
        client.username_pw_set(settings.mqtt_username, settings.mqtt_password)
    if settings.mqtt_tls_ca_file:
        # The broker's certificate must be signed by this CA and name the host connected to.
        client.tls_set(ca_certs=str(settings.mqtt_tls_ca_file), cert_reqs=ssl.CERT_REQUIRED)
    return client


def pump(client: FastClient, timeout: float) -> MQTTErrorCode:
    """Wait up to `timeout` s for the socket, then handle what arrived and send what is queued.

    Returns paho's error code: anything but MQTT_ERR_SUCCESS means the connection is lost.
    """
    sock = client.socket()
    if sock is None:
        return MQTTErrorCode.MQTT_ERR_NO_CONN
    if not client.has_buffered_input() and not client.tls_pending():
        try:
            select.select([sock], [sock] if client.want_write() else [], [], timeout)
        except (OSError, ValueError):
            return MQTTErrorCode.MQTT_ERR_CONN_LOST
    for _ in range(MAX_PACKETS_PER_PUMP):
        rc = client.loop_read()
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return rc
        if not client.has_buffered_input():
            break
    if client.want_write():
        rc = client.loop_write()
        if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return rc
    return client.loop_misc()


def wait_connected(client: FastClient, deadline_s: float) -> bool:
    """Pump until the CONNACK arrived; False at the deadline."""
    end = time.monotonic() + deadline_s
    while not client.is_connected():
        if time.monotonic() > end or pump(client, 0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS:
            return False
    return True


def open_session(settings: MqttSettings, client_id: str, topic: str, deadline_s: float = 10.0) -> None:
    """Create a persistent QoS 1 session subscribed to `topic`: the broker queues rows from now on."""
    client = new_client(settings, client_id, protocol=MQTTProtocolVersion.MQTTv311, clean_session=False)
    granted: list[int] = []
    client.on_subscribe = lambda _c, _u, mid, _codes, _p: granted.append(mid)
    client.connect(settings.mqtt_host, settings.mqtt_port)
    if not wait_connected(client, deadline_s):
        raise ConnectionError(f"no CONNACK from {settings.mqtt_host}:{settings.mqtt_port}")
    client.subscribe(topic, qos=1)
    end = time.monotonic() + deadline_s
    while not granted and time.monotonic() < end:
        pump(client, 0.1)
    client.disconnect()
    if not granted:
        raise ConnectionError(f"no SUBACK for {topic!r}")


def drop_session(settings: MqttSettings, client_id: str, deadline_s: float = 10.0) -> None:
    """Make the broker forget a persistent session (and its queued rows): connect once, clean."""
    client = new_client(settings, client_id, protocol=MQTTProtocolVersion.MQTTv311, clean_session=True)
    client.connect(settings.mqtt_host, settings.mqtt_port)
    wait_connected(client, deadline_s)
    client.disconnect()
