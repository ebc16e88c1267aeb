"""A QoS 1 MQTT publisher over one persistent connection, with a window of unacknowledged rows.

Facts that shaped it (Mosquitto 2.0.11, paho-mqtt 2.2): with an inflight limit set, paho scans its
whole in-flight set on every PUBACK (a large limit is slow, and even 100 cost a fifth of the
publisher's time), and paho refuses a publish once 65,535 are unacknowledged. So the publisher's
own window (default 1000) bounds what is unacknowledged and paho's limit is off by default. Every
publish return code is checked; a row counts as delivered only when its PUBACK came back.

**A row the broker refuses.** Mosquitto answers a PUBLISH it refuses (a topic that is no valid
UTF-8 for MQTT, `simulator.topics.fits_a_level`) by closing the connection, without the PUBACKs
of the rows it took just before; paho then sends every unacknowledged row again after the
reconnect, and the broker closes the connection again: one row would stall every row behind it.
So a connection lost within `SUSPECT_LOSS_S` of its CONNACK, with rows unacknowledged, makes
the next connection send those rows again one at a time, each after the last one's PUBACK: the
row in flight when the connection goes is the one refused. Refused `REFUSALS_TO_SET_ASIDE` times
under its topic, that topic's rows go to the fallback topic (`row_topic`'s, `machine/states`)
from then on; refused under the fallback too, the row is set aside with its reason (logged, and
counted in the summary). Then the rows flow on as before.

**Stopping.** `request_stop` (SIGTERM, Ctrl-C) ends every wait, reconnects included, within
the seconds it is given: what is still unacknowledged then counts as failed.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from pipeline_core.settings import MqttSettings
from pipeline_core.mqtt import RECONNECT_BACKOFF, new_client, pump

log = logging.getLogger(__name__)

# A broker that accepted the connection answers within milliseconds; after this long, connect anew.
CONNACK_DEADLINE_S = 10.0
# A connection lost this soon after its CONNACK, rows unacknowledged, may have been closed by the broker for one of
# them (it takes a broker a few milliseconds to reach the row it refuses among those sent again).
SUSPECT_LOSS_S = 5.0
# Connections lost with a row alone in flight before it counts as refused under its topic.
REFUSALS_TO_SET_ASIDE = 2
_PUMP_S = 0.05


class PublishError(RuntimeError):
    """The broker could not be reached or refused the connection."""


@dataclass
class _Held:
    """An unacknowledged row, sent again one at a time after a suspect loss."""

    topic: str
    payload: bytes | str
    refusals: int = 0
    rerouted: bool = False


class Publisher:
    def __init__(self, settings: MqttSettings, client_id: str, *, window: int = 1000,
                 inflight: int = 0, fallback_topic: str | None = None) -> None:
        if not 1 <= window < 65_535 or inflight < 0:
            raise ValueError("need 1 <= window < 65535 and inflight >= 0")
        self.settings = settings
        self.window = window
        self.fallback_topic = fallback_topic
        self.client = new_client(settings, client_id, protocol=MQTTProtocolVersion.MQTTv311,
                                 clean_session=True)
        self.client.max_inflight_messages_set(inflight)
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish
        self.sent = 0  # handed to paho and queued or on the wire
        self.acked = 0  # PUBACK received
        self.failed = 0  # refused by paho, or never acknowledged
        self.set_aside = 0  # refused by the broker under its topic and under the fallback topic
        self.rerouted = 0  # published under the fallback topic, the broker refusing their own
        self.refused_topics: set[str] = set()
        self._connected = False
        self._connack_monotonic = 0.0  # monotonic time of the last CONNACK
        self._refused: str | None = None
        self._careful: deque[_Held] | None = None  # rows to send again one at a time, oldest first
        self._stop_by: float | None = None  # monotonic: every wait ends by then (request_stop)
        self.stop_reason: str | None = None
        self._give_up_at: float | None = None  # monotonic: the end of the current drain

    @property
    def unacked(self) -> int:
        return self.sent - self.acked - self.set_aside

    @property
    def stopping(self) -> bool:
        return self._stop_by is not None

    def request_stop(self, within_s: float, reason: str) -> None:
        """Publish nothing more, and end every wait (for PUBACKs, for the broker) within `within_s` seconds."""
        if self._stop_by is None:
            self._stop_by = time.monotonic() + within_s
            self.stop_reason = reason

    def _out_of_time(self) -> bool:
        now = time.monotonic()
        return any(limit is not None and now >= limit for limit in (self._stop_by, self._give_up_at))

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            self._refused = f"MQTT broker refused the connection: {reason_code}"
        else:
            self._connected = True
            self._connack_monotonic = time.monotonic()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        self.acked += 1

    def connect(self, deadline_s: float = 10.0) -> None:
        host, port = self.settings.mqtt_host, self.settings.mqtt_port
        try:
            self.client.connect(host, port, keepalive=30)
        except OSError as error:
            raise PublishError(f"cannot reach the MQTT broker at {host}:{port}: {error}") from None
        if not self._await_connack(deadline_s):
            if self.stopping:
                raise PublishError(f"stopped by {self.stop_reason} before the MQTT broker at {host}:{port} answered")
            raise PublishError(f"no answer from the MQTT broker at {host}:{port}: it closed the connection "
                               f"or sent no CONNACK within {deadline_s:.0f} s")

    def publish(self, topic: str, payload: bytes | str) -> bool:
        """Publish one row at QoS 1, first waiting while the window is full. False when a stop was requested
        before it could go out (it did not)."""
        while self.unacked >= self.window:
            if self.stopping:
                return False
            self.pump(_PUMP_S)
        if self.stopping:
            return False
        if topic in self.refused_topics and self.fallback_topic is not None:
            topic = self.fallback_topic
            self.rerouted += 1
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
        return True

    def pump(self, timeout: float) -> None:
        """Handle acknowledgements (waiting up to `timeout` s for them); reconnect if the link broke."""
        if self.client.socket() is None and self._out_of_time():
            return  # given up on the broker: nothing to wait for
        if pump(self.client, timeout) != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self._connection_lost()

    def _connection_lost(self) -> None:
        if (self._careful is None and self.unacked
                and time.monotonic() - self._connack_monotonic < SUSPECT_LOSS_S):
            self._hold_unacknowledged()
        self._reconnect()

    def _hold_unacknowledged(self) -> None:
        """Take the unacknowledged rows from paho, to be sent again one at a time (`_send_held`)."""
        client = self.client
        with client._out_message_mutex:
            self._careful = deque(_Held(message.topic, message.payload) for message in client._out_messages.values())
            client._out_messages.clear()
            client._inflight_messages = 0
        log.warning("MQTT connection lost %.1f s after it was made, %d rows unacknowledged: sending them again one "
                    "at a time, to find a row the broker refuses", time.monotonic() - self._connack_monotonic,
                    len(self._careful))

    def _reconnect(self) -> None:
        """Connect again and return once the broker's CONNACK arrived, which is when paho sends the
        unacknowledged rows again, in publish order (or this sends the held ones, one by one); return
        without a connection when out of time (a stop, or the end of a drain).

        Returning as soon as the socket is open let the caller publish new rows into it (the rows due
        during the reconnect's pauses, a burst) before the CONNACK, so they reached the broker ahead
        of the older rows sent again: a few rows out of order per broker restart."""
        pauses_s = RECONNECT_BACKOFF.pauses_s()
        log.warning("MQTT connection lost with %d rows unacknowledged; reconnecting", self.unacked)
        while not self._out_of_time():
            delay = next(pauses_s)
            self._connected = False
            try:
                self.client.reconnect()
                if self._await_connack(CONNACK_DEADLINE_S):
                    if self._send_held():
                        return
                    continue  # lost again, a held row in flight: connect anew
                log.warning("MQTT broker closed the connection or did not answer it; retrying in %.1f s", delay)
            except OSError as error:
                log.warning("MQTT reconnect failed: %s; retrying in %.1f s", error, delay)
            self._sleep(delay)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not self._out_of_time():
            time.sleep(min(left, _PUMP_S))

    def _await_connack(self, deadline_s: float) -> bool:
        """Pump until the CONNACK came; False when the connection broke again or the deadline passed."""
        end = time.monotonic() + deadline_s
        while not self._connected:
            if self._refused:
                raise PublishError(self._refused)
            if (time.monotonic() > end or self._out_of_time()
                    or pump(self.client, 0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS):
                return False
        return True

    def _send_held(self) -> bool:
        """Send the held rows one at a time, each once the one before was acknowledged; False when the connection
        was lost with one of them in flight (counted against it) or the time ran out."""
        held = self._careful
        while held:
            row = held[0]
            topic = row.topic
            if topic in self.refused_topics and self.fallback_topic is not None:
                topic = self.fallback_topic
                if not row.rerouted:
                    row.rerouted = True
                    self.rerouted += 1
            info = self.client.publish(topic, row.payload, qos=1)
            while not info.is_published():
                lost = pump(self.client, _PUMP_S) != MQTTErrorCode.MQTT_ERR_SUCCESS
                if lost or self._out_of_time():
                    self._forget(info.mid)  # held here: paho must not send it again by itself
                    if lost:
                        self._refusal(row, topic)
                    return False
            held.popleft()
        self._careful = None
        log.info("MQTT: the rows held after a lost connection are all acknowledged; publishing on")
        return True

    def _forget(self, mid: int) -> None:
        client = self.client
        with client._out_message_mutex:
            if client._out_messages.pop(mid, None) is not None:
                client._inflight_messages = max(0, client._inflight_messages - 1)

    def _refusal(self, row: _Held, topic: str) -> None:
        """The connection went while `row` alone was in flight under `topic`."""
        row.refusals += 1
        if row.refusals < REFUSALS_TO_SET_ASIDE:
            return
        row.refusals = 0
        preview = row.payload[:200]
        if topic != self.fallback_topic and self.fallback_topic is not None:
            self.refused_topics.add(topic)
            log.warning("the MQTT broker closed the connection each of the %d times a row was sent alone under topic "
                        "%r: that topic's rows go to %r from now on (row: %r)", REFUSALS_TO_SET_ASIDE, topic,
                        self.fallback_topic, preview)
            return
        assert self._careful is not None
        self._careful.popleft()
        self.set_aside += 1
        self.failed += 1
        log.error("row set aside: the MQTT broker closed the connection each of the %d times it was sent alone under "
                  "topic %r (row: %r)", REFUSALS_TO_SET_ASIDE, topic, preview)

    def drain(self, deadline_s: float) -> int:
        """Wait until every row is acknowledged or the deadline passed (sooner after `request_stop`), reconnecting
        as needed; unacknowledged rows fail."""
        self._give_up_at = time.monotonic() + deadline_s
        try:
            while self.unacked and not self._out_of_time():
                self.pump(_PUMP_S)
        finally:
            self._give_up_at = None
        missing = self.unacked
        self.failed += missing
        return missing

    def close(self) -> None:
        self.client.disconnect()
