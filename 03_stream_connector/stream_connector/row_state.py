"""A row's way through the connector: the states an MQTT row passes through, each transition one method.

    read ──every record handed to the producer──▶ sent ──Kafka confirmed the last──▶ confirmed ──PUBACK──▶ acknowledged
      │                                            │
      └─────── a record did not reach Kafka, for no fault of its own ──────▶ failed
    read, sent, confirmed or failed ── a new MQTT connection or Kafka client ──▶ let go

A row waits for each record it sent (its own records, its dead letter) and for each record an earlier copy of
it sent that is still on its way (`redelivery.Redelivery`): once none is left, it is confirmed. A record
Kafka refuses for itself (too large, invalid) counts as settled once its dead letter took its place. Rows are
acknowledged in the order they arrived, as MQTT wants, so a confirmed row waits behind one that is not.

A row that arrives while the partition switch holds rows (`partition_switch`) is not read yet: it waits there,
unacknowledged, and is read once the switch has decided by which partition count its records are placed.

A failed row is never acknowledged: the connector starts its Kafka side afresh (or stops, when it needs
someone), letting the row go, and the broker sends it again. A row let go is the broker's again: it sends
the row again on the new connection, and Kafka's answers that still come for the old copy change nothing.
"""
from __future__ import annotations

from enum import Enum


class RowState(Enum):
    READ = "read from MQTT"
    SENT = "sent to Kafka"
    CONFIRMED = "confirmed by Kafka"
    ACKNOWLEDGED = "acknowledged"
    FAILED = "failed"
    LET_GO = "let go"


# Enum members as module constants: attribute access on an Enum class costs more, and these are read per record.
READ, SENT, CONFIRMED = RowState.READ, RowState.SENT, RowState.CONFIRMED
ACKNOWLEDGED, FAILED, LET_GO = RowState.ACKNOWLEDGED, RowState.FAILED, RowState.LET_GO


class Row:
    """One MQTT message on its way: its state, and the records it waits for."""

    __slots__ = ("mid", "qos", "topic", "state", "awaited")

    def __init__(self, mid: int, qos: int, topic: str) -> None:
        """Read from MQTT."""
        self.mid = mid
        self.qos = qos
        self.topic = topic  # the MQTT topic it came on: named in its dead letters
        self.state = READ
        self.awaited = 0  # records it waits for Kafka's answer to

    def awaits(self) -> None:
        """One more record to wait for: one of its own handed to the producer, or one an earlier copy sent."""
        self.awaited += 1

    def sent(self) -> None:
        """read -> sent: every record of it is handed to the producer or found on its way; confirmed at once
        when it waits for none (a row whose records Kafka holds already)."""
        if self.state is READ:
            self.state = SENT if self.awaited else CONFIRMED

    def settled(self) -> None:
        """A record it waited for is settled (confirmed; refused and replaced by its dead letter; or refused by the
        client at once, so no answer comes). The last one of a sent row: sent -> confirmed."""
        self.awaited -= 1
        if not self.awaited and self.state is SENT:
            self.state = CONFIRMED

    def acknowledge(self) -> None:
        """confirmed -> acknowledged: its PUBACK is queued (a QoS 0 row has none, and is done all the same)."""
        self.state = ACKNOWLEDGED

    def fail(self) -> None:
        """-> failed: a record of it did not reach Kafka for a reason not its own; it must not be acknowledged."""
        if self.state is not LET_GO:
            self.state = FAILED

    def let_go(self) -> None:
        """-> let go: the connector gave the row back to the broker (a new MQTT connection or Kafka client)."""
        self.state = LET_GO
