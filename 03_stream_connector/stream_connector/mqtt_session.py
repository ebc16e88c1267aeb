"""The connector's MQTT side: one persistent session, read on the connector's own thread, acknowledged by hand.

Fixed client id, clean session off: after a crash, a restart or a new connection the broker sends the rows
the connector read and did not acknowledge again, and the rows published meanwhile. Acknowledgements are
manual (`acknowledge`), sent once Kafka confirmed a row. MQTT 3.1.1, not 5: paho decodes MQTT 5 properties
on every message, which cost ten times the rest of reading a row (measured: 59 vs 5 µs per message).
"""
from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable

from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from pipeline_core.lifecycle import StopSignal
from pipeline_core.mqtt import RECONNECT_BACKOFF, new_client, pump

from .settings import ConnectorSettings

log = logging.getLogger(__name__)


class MqttSession:
    """The session's client: connects (and connects again), subscribes, reads rows into `on_message`.

    `wait(seconds)` is called between attempts to reach the broker, so that Kafka's answers still arrive;
    `refused(what to do)` when the broker refuses the credentials or the subscription, which takes someone."""

    def __init__(self, settings: ConnectorSettings, topic_filters: list[str], on_message: Callable[..., None],
                 stop: StopSignal, *, wait: Callable[[float], object], refused: Callable[[str], None]) -> None:
        self.settings = settings
        self.topic_filters = topic_filters
        self.subscribed = False
        self._stop = stop
        self._wait = wait
        self._refused = refused
        self.client = new_client(settings, settings.mqtt_client_id, protocol=MQTTProtocolVersion.MQTTv311,
                                 clean_session=False, manual_ack=True)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = on_message

    def connect(self) -> None:
        """Connect, retrying with growing pauses while the broker cannot be reached (or until stopped)."""
        pauses_s = RECONNECT_BACKOFF.pauses_s()
        while not self._stop.is_set():
            delay = next(pauses_s)
            try:
                self.client.connect(self.settings.mqtt_host, self.settings.mqtt_port, keepalive=30)
                return
            except OSError as error:
                log.warning("MQTT broker %s:%d unreachable (%s); retrying in %.1f s", self.settings.mqtt_host,
                            self.settings.mqtt_port, error, delay)
                self._wait(delay)

    def read(self, timeout_s: float) -> MQTTErrorCode:
        """Wait up to `timeout_s` for input, hand every row that came to `on_message`, send what is queued;
        anything but MQTT_ERR_SUCCESS: the connection is lost."""
        return pump(self.client, timeout_s)

    def acknowledge(self, mids: list[int]) -> None:
        """PUBACK these rows, in this order (queued; `read` sends them)."""
        self.client.ack_all(mids)

    def leave(self, deadline_s: float) -> None:
        """Send the queued PUBACKs without reading (and so starting) any further rows, then disconnect: the rows
        not read stay queued in the session."""
        end = time.monotonic() + deadline_s
        sock = self.client.socket()
        while sock is not None and self.client.want_write() and time.monotonic() < end:
            select.select([], [sock], [], 0.05)
            if self.client.loop_write() != MQTTErrorCode.MQTT_ERR_SUCCESS:
                break
        self.client.disconnect()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self._refused(f"MQTT broker refused the connection: {reason_code}; check --mqtt-username/"
                          "--mqtt-password (MQTT_USERNAME/MQTT_PASSWORD) and the broker's ACL, then start again")
            return
        log.info("connected to MQTT %s:%d as %r (session present: %s)", self.settings.mqtt_host,
                 self.settings.mqtt_port, self.settings.mqtt_client_id, flags.session_present)
        client.subscribe([(topic_filter, 1) for topic_filter in self.topic_filters])
        # A present session still holds the subscription: rows flow (and come again) before the SUBACK.
        self.subscribed = self.subscribed or flags.session_present

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        refused = [code for code in reason_codes if code.is_failure]
        if refused:
            self._refused(f"MQTT broker refused the subscription to {self.settings.topic_filters!r}: {refused[0]}; "
                          "check --topic-filters and the broker's ACL, then start again")
            return
        self.subscribed = True
