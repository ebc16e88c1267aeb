"""The MQTT -> Kafka bridge: rows in, one record per quantity out, nothing lost on a crash.

An MQTT row is acknowledged (manual PUBACK) only after Kafka confirmed every record made from it,
and the session is persistent (fixed client id, clean session off): rows the
connector read but did not finish, and rows published while it was down, are redelivered by the
broker when it comes back. Of a row sent again only the records Kafka does not hold yet are written
(`redelivery.py`), so neither a crash nor a broker restart writes a record twice.

No row stops it. A row that is not a valid row (`pipeline_core.validation`), and a record Kafka
refuses for the record itself (too large), go to machine.dlq with the reason; should processing a
row fail in a way nobody foresaw, that row is dead-lettered too, so it cannot stop the connector
on every restart. Kafka being away is no fault of any row: the producer never gives up on a
record (no delivery timeout by default), the rows stay unacknowledged, and the broker queues the
rows behind them until Kafka is back. What a restart of the Kafka client fixes (a fatal producer
error, a deleted topic, a finite `--delivery-timeout-ms` running out) the connector does itself:
a fresh producer, and the broker sends the unacknowledged rows again. It exits only when it needs
someone: the broker refuses its credentials or subscription, or Kafka its access to a topic.

One thread does everything: MQTT reads, splitting, `produce`, delivery callbacks and acks; the
Kafka client batches and sends in its own native threads. Each row goes the way `row_state.py` draws
(read from MQTT, sent to Kafka, confirmed, acknowledged; or failed, or let go), moved along by `bridge.py`;
this module is the connector's own life around it: start, the loop, a new MQTT connection, a fresh Kafka
side, the partition switch's turn, stop.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError
from paho.mqtt.enums import MQTTErrorCode

from pipeline_core.kafka_clients import ACCESS_ERRORS
from pipeline_core.lifecycle import StopSignal
from pipeline_core.logs import announce_ready
from pipeline_core.progress import Observation, ProgressReporter, StageCounters
from pipeline_core.retry import Backoff, Retries
from pipeline_core.settings import MACHINE_STATES_TOPIC

from .bridge import STAGE, Bridge
from .filters import covers, parse_filters
from .kafka_side import data_partitions_now, new_producer, producer_knows, read_topics
from .mqtt_session import MqttSession
from .settings import ConnectorSettings

log = logging.getLogger(__name__)

# Where devices publish (the broker's ACL): what the instances' filters together must cover.
DEVICE_TOPICS = f"{MACHINE_STATES_TOPIC}/#"
# A fresh Kafka client after a failure Kafka caused: no deadline (rows wait in the broker's queue meanwhile),
# pauses from 0.5 s up to this, back at the start once a record is delivered.
MAX_KAFKA_RETRY_DELAY_S = 30.0


@dataclass
class ConnectorCounters(StageCounters):
    """records in: MQTT rows; records out: Kafka records made from them."""

    rejected_rows: int = 0
    acked: int = 0
    rows_done: int = 0  # rows whose records Kafka confirmed (or took as dead letters): acknowledged, or QoS 0 let go
    reconnects: int = 0
    kafka_restarts: int = 0
    redelivered_records: int = 0  # of rows sent again, records Kafka already held: not written twice
    redelivered_dead_letters: int = 0  # of rows sent again, dead letters Kafka already held or had on their way


class Connector:
    def __init__(self, settings: ConnectorSettings, stop: StopSignal | None = None) -> None:
        self.settings = settings
        self.topic_filters = parse_filters(settings.topic_filters)  # FilterError before anything starts
        self.stop = stop or StopSignal()
        self.counters = ConnectorCounters()
        self.progress: ProgressReporter | None = None
        self.kafka_retries = Retries(Backoff(0.5, MAX_KAFKA_RETRY_DELAY_S))
        self.bridge = Bridge(settings, self.counters, self.kafka_retries, kafka_failed=self._kafka_failed,
                             needs_someone=self._needs_someone)
        self.mqtt = MqttSession(settings, self.topic_filters, self.bridge.read, self.stop,
                                wait=lambda seconds: self.bridge.producer.poll(seconds), refused=self._needs_someone)
        self.rows_to_redeliver = 0
        # Set when the connector must stop: says what is wrong and what to do.
        self.failure: str | None = None
        # Set when Kafka failed in a way a fresh producer fixes; the loop restarts the Kafka side.
        self.kafka_trouble: str | None = None
        self._admin = None  # for the data topic's partition count, once running

    def run(self) -> int:
        """Bridge until SIGTERM/SIGINT or an error that needs someone; returns the exit code."""
        if not any(covers(topic_filter, DEVICE_TOPICS) for topic_filter in self.topic_filters):
            log.warning("this instance takes only part of %s (%s): the filters of the other instances must cover "
                        "the rest, since the broker drops a row no session subscribes to, unseen by any connector",
                        DEVICE_TOPICS, self.settings.topic_filters)
        self._read_topics()
        self.mqtt.connect()
        ready = False
        progress = self.progress = ProgressReporter.for_stage(
            STAGE, self.counters, self.settings, observe=self._observe, logger=log, labels={"records_in": "rows in"},
            progress_counters=("rows_done",))
        bridge = self.bridge
        while not self.stop.is_set() and self.failure is None:
            # While rows wait for Kafka, come back quickly to ack them; otherwise wait for input.
            rc = self.mqtt.read(0.002 if bridge.unacked else 0.2)  # every row read: bridge.read
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._reconnect(rc)
            bridge.producer.poll(0)  # every answer of Kafka: bridge._answered
            self.mqtt.acknowledge(bridge.acknowledge_confirmed())
            if self.kafka_trouble is not None and self.failure is None:
                self._restart_kafka_side()
            elif self.failure is None:
                self._switch_step()
            if not ready and self.mqtt.subscribed:
                ready = True
                announce_ready(log, f"stream connector {self.settings.topic_filters!r} -> "
                                    f"{self.settings.data_topic!r} (dead letters: {self.settings.dlq_topic!r})")
            progress.maybe_report()
        try:
            return self._shutdown()
        finally:
            progress.close()

    def _kafka_failed(self, error: KafkaError) -> None:
        """A record did not reach Kafka, for no fault of its own (its row failed): a fresh Kafka side fixes it,
        unless Kafka refused access."""
        if error.code() in ACCESS_ERRORS:
            self.failure = (f"Kafka refused access ({error.str()}): grant the connector's principal Describe "
                            f"and Write on the topics {self.settings.data_topic} and {self.settings.dlq_topic} "
                            "(and Create, or create them), then start it again")
        elif self.kafka_trouble is None:
            self.kafka_trouble = error.str()

    def _needs_someone(self, what_to_do: str) -> None:
        self.failure = what_to_do

    def _read_topics(self, *, without_end: bool = False) -> None:
        topics = read_topics(self.settings, STAGE, self.stop, without_end=without_end,
                             while_waiting=None if self.progress is None else self.progress.maybe_report)
        if topics is not None:
            self.bridge.topics_read(topics)
            self._admin = topics.admin

    def _switch_step(self) -> None:
        """The partition switch's turn in the loop: look at the topic's partition count when due, hold rows while
        the joiners catch up, and place the held rows once it is decided by which count."""
        switch, topic = self.bridge.switch, self.settings.data_topic
        if switch.check_due():
            switch.observed(data_partitions_now(self._admin, topic) or switch.topic_partitions)
        if not switch.holding:
            switch.should_hold()
            return
        if switch.step(self.bridge.busy(), lambda count: producer_knows(self.bridge.producer, topic, count)):
            for message in switch.release():
                self.bridge.read(self.mqtt.client, None, message)

    def _reconnect(self, rc: MQTTErrorCode) -> None:
        log.warning("MQTT connection lost (%s); %d unacknowledged rows will be redelivered by the broker",
                    rc.name, len(self.bridge.unacked))
        # Their records may still reach Kafka; the broker sends the rows again, so they repeat exactly.
        self.bridge.let_go_all()
        self.counters.reconnects += 1
        self.mqtt.connect()

    def _restart_kafka_side(self) -> None:
        """A fresh producer, and a new MQTT connection on which the broker sends every unacknowledged
        row again, in order: what a restart of the connector would do, without exiting."""
        pause_s = self.kafka_retries.next_pause_s()
        log.error("Kafka did not take a record (%s): starting the Kafka client afresh in %.1f s; the broker sends "
                  "the %d unacknowledged rows again", self.kafka_trouble, pause_s, len(self.bridge.unacked))
        # Until the broker sends them again, the heartbeat still counts them as work waiting.
        self.rows_to_redeliver = len(self.bridge.unacked)
        self.bridge.let_go_all()
        self.bridge.drop_on_their_way()
        self._pause(pause_s)
        self.bridge.producer = new_producer(self.settings)
        self.kafka_trouble = None
        self.counters.kafka_restarts += 1
        self._read_topics(without_end=True)
        self.mqtt.connect()
        self.rows_to_redeliver = 0

    def _pause(self, seconds: float) -> None:
        """Wait, serving Kafka's callbacks, until `seconds` passed or a stop was requested."""
        end = time.monotonic() + seconds
        while not self.stop.is_set() and (left := end - time.monotonic()) > 0:
            self.bridge.producer.poll(min(left, 0.2))
            if self.progress is not None:
                self.progress.maybe_report()  # Kafka away: the restarts keep showing

    def _observe(self) -> Observation:
        # The lag: rows read from MQTT whose records Kafka has not all confirmed, so not acknowledged yet.
        # Work waiting as well: rows let go by a restart of the Kafka side, until the broker sends them again.
        switch = self.bridge.switch
        return Observation(lag=len(self.bridge.unacked) + len(switch.held), pending=self.rows_to_redeliver,
                           values={"kafka_queue": len(self.bridge.producer), "partitions_placed_by": switch.partitions,
                                   "data_partitions": switch.topic_partitions, "partition_switches": switch.switches},
                           waiting_for="Kafka" if self.rows_to_redeliver else None, note=switch.note)

    def _shutdown(self) -> int:
        """Flush Kafka, ack what it confirmed, then leave the broker; unread rows stay in the session."""
        left = self.bridge.producer.flush(self.settings.shutdown_timeout_s)
        if self.bridge.switch is not None:
            self.bridge.switch.close()  # held rows stay unacknowledged: the broker sends them again
        if self.failure is None:
            self.mqtt.acknowledge(self.bridge.acknowledge_confirmed())
        self.mqtt.leave(deadline_s=5.0)
        counters = self.counters
        summary = (f"rows {counters.records_in}, records {counters.records_out}, "
                   f"rejected rows {counters.rejected_rows}, "
                   f"dead letters {counters.dead_letters}, acknowledged {counters.acked}")
        if self.failure is not None:
            log.error("stopped: %s; %s (unacknowledged rows stay with the broker and come again)",
                      self.failure, summary)
            return 1
        if left:
            log.error("stopped with %d records unconfirmed by Kafka, their rows unacknowledged; %s", left, summary)
            return 1
        log.info("stopped cleanly: %s", summary)
        return 0
