"""A QoS 1 MQTT publisher over one persistent connection, with a window of unacknowledged rows.

Facts that shaped it (Mosquitto 2.0.11, paho-mqtt 2.2): with an inflight limit set, paho scans its
whole in-flight set on every PUBACK (a large limit is slow, and even 100 cost a fifth of the
publisher's time), and paho refuses a publish once 65,535 are unacknowledged. So the publisher's
own window (default 1000) bounds what is unacknowledged and paho's limit is off by default. Every
publish return code is checked; a row counts as delivered only when its PUBACK came back.
"""
from __future__ import annotations

import logging
import time

from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from pipeline_core.settings import MqttSettings
from pipeline_core.mqtt import RECONNECT_BACKOFF, new_client, pump

log = logging.getLogger(__name__)

# A broker that accepted the connection answers within milliseconds; after this long, connect anew.
CONNACK_DEADLINE_S = 10.0


class PublishError(RuntimeError):
    """The broker could not be reached or refused the connection."""


class Publisher:
    def __init__(self, settings: MqttSettings, client_id: str, *, window: int = 1000,
                 inflight: int = 0) -> None:
        if not 1 <= window < 65_535 or inflight < 0:
            raise ValueError("need 1 <= window < 65535 and inflight >= 0")
        self.settings = settings
        self.window = window
        self.client = new_client(settings, client_id, protocol=MQTTProtocolVersion.MQTTv311,
                                 clean_session=True)
        self.client.max_inflight_messages_set(inflight)
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.sent = 0  # handed to paho and queued or on the wire
        self.acked = 0  # PUBACK received
        self.failed = 0  # refused by paho, or never acknowledged
        self._connected = False
        self._refused: str | None = None

    @property
    def unacked(self) -> int:
        return self.sent - self.acked

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self._refused = f"MQTT broker refused the connection: {reason_code}"
        else:
            self._connected = True

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        self.acked += 1

    def connect(self, deadline_s: float = 10.0) -> None:
        host, port = self.settings.mqtt_host, self.settings.mqtt_port
        try:
            self.client.connect(host, port, keepalive=30)
        except OSError as error:
            raise PublishError(f"cannot reach the MQTT broker at {host}:{port}: {error}") from None
        if not self._await_connack(deadline_s):
            raise PublishError(f"no answer from the MQTT broker at {host}:{port}: it closed the connection "
                               f"or sent no CONNACK within {deadline_s:.0f} s")

    def publish(self, topic: str, payload: bytes | str) -> None:
        """Publish one row at QoS 1, first waiting while the window is full."""
        while self.sent - self.acked >= self.window:
            self.pump(0.05)
        info = self.client.publish(topic, payload, qos=1)
        # paho keeps every QoS 1 message it did not refuse outright (QUEUE_SIZE) and sends it again
        # after the reconnect: NO_CONN (the link was down) and CONN_LOST (it broke while this row was
        # written, as a broker restart does) included. Counted as failed, such a row still got its
        # PUBACK later, and `unacked` then ran one short: `drain` could stop before the last row.
        if info.rc != MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
            self.sent += 1
        else:
            self.failed += 1
            log.error("publish refused by the client (rc %s: %s)", int(info.rc), info.rc.name)

    def pump(self, timeout: float) -> None:
        """Handle acknowledgements (waiting up to `timeout` s for them); reconnect if the link broke."""
        if pump(self.client, timeout) != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self._reconnect()

    def _reconnect(self) -> None:
        """Connect again and return once the broker's CONNACK arrived, which is when paho sends the
        unacknowledged rows again, in publish order.

        Returning as soon as the socket is open let the caller publish new rows into it (the rows due
        during the reconnect's pauses, a burst) before the CONNACK, so they reached the broker ahead
        of the older rows sent again: a few rows out of order per broker restart."""
        pauses_s = RECONNECT_BACKOFF.pauses_s()
        log.warning("MQTT connection lost with %d rows unacknowledged; reconnecting", self.unacked)
        while True:
            delay = next(pauses_s)
            self._connected = False
            try:
                self.client.reconnect()
                if self._await_connack(CONNACK_DEADLINE_S):
                    return
                log.warning("MQTT broker closed the connection or did not answer it; retrying in %.1f s", delay)
            except OSError as error:
                log.warning("MQTT reconnect failed: %s; retrying in %.1f s", error, delay)
            time.sleep(delay)

    def _await_connack(self, deadline_s: float) -> bool:
        """Pump until the CONNACK came; False when the connection broke again or the deadline passed."""
        end = time.monotonic() + deadline_s
        while not self._connected:
            if self._refused:
                raise PublishError(self._refused)
            if time.monotonic() > end or pump(self.client, 0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return False
        return True

    def drain(self, deadline_s: float) -> int:
        """Wait until every row is acknowledged or the deadline passed; unacknowledged rows fail."""
        end = time.monotonic() + deadline_s
        while self.unacked and time.monotonic() < end:
            self.pump(0.05)
        missing = self.unacked
        self.failed += missing
        return missing

    def close(self) -> None:
        self.client.disconnect()
