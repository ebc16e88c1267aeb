"""`make clean && make up` as a user runs them, on a private stack: its own ports and state folder, so the
shared stack other tests use is never touched. Used by the start-from-nothing tests."""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer
from influxdb import InfluxDBClient

from pipeline_core import credentials
from pipeline_core.kafka_clients import consumer_config, security_config
from pipeline_core.records import decode_record
from pipeline_core.settings import KafkaSettings, load_settings
from pipeline_core.topics import MACHINE_DATA, MACHINE_OUT
from db_connector_support import JSON_ANSWERS
from stack.processes import free_loopback_ports
from support import Message, read_topic, unique

REPO_ROOT = Path(__file__).resolve().parents[1]
# Servers plus the pipeline; the joiner's name depends on JOINER.
SERVERS = ("mosquitto", "kafka", "influxdb")
JOINER_SERVICE = {"spark": "spark-joiner", "lsb": "lsb-joiner"}
# Spark's JVM, session and first batch on two shared cores; the servers before it.
UP_DEADLINE_S = 600
# How long after `make up` the last process started may take to leave supervisord's STARTING.
SETTLE_DEADLINE_S = 60
# Rows `make data` replays: enough for every machine's speed and torque to pair.
REPLAYED_ROWS = 60


@dataclass(frozen=True)
class StartResult:
    joiner: str
    seconds: float  # `make up`, wall time
    reported_seconds: float  # what `make up` printed ("stack up in ... s")
    states: dict[str, str]  # service -> 'state health restarts', as `make status` shows it


@dataclass(frozen=True)
class FirstJoin:
    latency_s: float  # first replayed record appended to machine.data -> first joined record written
    record: dict


class PrivateStack:
    """The native stack of this checkout on free ports and a state folder of its own; `secure`: `make up
    SECURITY=on`."""

    def __init__(self, state_dir: Path, *, secure: bool = False) -> None:
        mqtt, kafka, controller, influx, rpc = free_loopback_ports(5)
        self.state_dir = state_dir
        self.bootstrap = f"127.0.0.1:{kafka}"
        self.env = {
            **os.environ, "STACK": "native", "STACK_STATE_DIR": str(state_dir),
            "MQTT_HOST": "127.0.0.1", "MQTT_PORT": str(mqtt), "KAFKA_PORT": str(kafka),
            "KAFKA_CONTROLLER_PORT": str(controller), "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "INFLUXDB_HOST": "127.0.0.1", "INFLUXDB_PORT": str(influx), "INFLUXDB_RPC_PORT": str(rpc),
            "SECURITY": "on" if secure else "off",
        }
        for name in ("PIPELINE_CREDENTIALS_FILE", "KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD"):
            self.env.pop(name, None)  # the stack's own file, in its state folder, says who is who

    @property
    def kafka_security(self) -> dict[str, str]:
        """The admin's Kafka client settings on this stack (empty when it is not secure)."""
        values = credentials.read_credentials(self.state_dir / "credentials.env")
        if not values:
            return {}
        environ = {**self.env, **credentials.environment("admin", values)}
        return security_config(load_settings(KafkaSettings, [], environ=environ))

    def influx(self) -> InfluxDBClient:
        """A client of the stack's InfluxDB and its database, as the reader when the stack is secure."""
        values = credentials.read_credentials(self.state_dir / "credentials.env")
        environ = {**self.env, **credentials.environment("reader", values)} if values else self.env
        return InfluxDBClient("127.0.0.1", int(self.env["INFLUXDB_PORT"]), database="machinedata", timeout=30,
                              username=environ.get("INFLUXDB_USERNAME"), password=environ.get("INFLUXDB_PASSWORD"),
                              headers=dict(JSON_ANSWERS))

    def make(self, *args: str, joiner: str | None = None, timeout_s: float = UP_DEADLINE_S
             ) -> subprocess.CompletedProcess[str]:
        env = {**self.env, **({"JOINER": joiner} if joiner else {})}
        return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout_s)

    def start_from_nothing(self, joiner: str) -> StartResult:
        """`make clean`, then `make up JOINER=joiner`; fails with the output of whichever failed."""
        cleaned = self.make("clean")
        assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
        assert not self.state_dir.exists()
        began = time.monotonic()
        up = self.make("up", joiner=joiner)
        seconds = time.monotonic() - began
        assert up.returncode == 0, f"make up JOINER={joiner} failed:\n{up.stdout}{up.stderr}"
        reported = re.search(r"stack up in ([0-9.]+) s", up.stdout)
        assert reported, up.stdout
        return StartResult(joiner, seconds, float(reported.group(1)), self.settled_states(joiner))

    def settled_states(self, joiner: str, deadline_s: float = SETTLE_DEADLINE_S) -> dict[str, str]:
        """`make status` once every process is healthy and past supervisord's STARTING (its startsecs, which the
        last process started may still be in when `make up` returns), or as it is at the deadline."""
        wanted = healthy_states(joiner)
        end = time.monotonic() + deadline_s
        while True:
            states = self.states(joiner)
            if {name: states.get(name) for name in wanted} == wanted or time.monotonic() > end:
                return states
            time.sleep(0.5)

    def states(self, joiner: str) -> dict[str, str]:
        """Each process's line of `make status`: `state health restarts`, e.g. 'RUNNING healthy 0'."""
        status = self.make("status", joiner=joiner, timeout_s=120)
        assert status.returncode == 0, status.stdout + status.stderr
        header, *lines = status.stdout.splitlines()
        columns = header.split()
        assert columns[:3] == ["service", "state", "health"] and columns[5] == "restarts", header
        table = lines[:lines.index("")] if "" in lines else lines  # the process table ends at a blank line
        return {row[0]: f"{row[1]} {row[2]} {row[5]}" for row in (line.split() for line in table)}

    def first_join(self, rows: int | None = REPLAYED_ROWS) -> FirstJoin:
        """Replay `rows` rows (None: the whole events file) with `make data`; the first joined record in
        machine.out, and how long after the first replayed record reached machine.data it was written (both
        are Kafka record times of this machine)."""
        began_ms = time.time() * 1000  # records written before (a test's bad ones) are no replayed rows
        replayed = self.make("data", *([f"N={rows}"] if rows is not None else []), "DATA_ARGS=--no-progress",
                             timeout_s=120 if rows is not None else 600)
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        joined = first_record(self.bootstrap, MACHINE_OUT.name, deadline_s=300, since_ms=began_ms,
                              security=self.kafka_security)
        record = decode_record(joined.value)
        data = read_topic(self.bootstrap, MACHINE_DATA.name, idle_s=0.5, security=self.kafka_security)
        first_row_ms = min(message.timestamp_ms for message in data if message.timestamp_ms >= began_ms)
        return FirstJoin((joined.timestamp_ms - first_row_ms) / 1000, record)

    def down(self) -> None:
        self.make("clean", timeout_s=300)


def first_record(bootstrap: str, topic: str, deadline_s: float, since_ms: float = 0,
                 security: dict[str, str] | None = None) -> Message:
    """The first committed record of `topic` (by record time, written at `since_ms` or later) once one arrives."""
    consumer = Consumer(consumer_config(bootstrap, unique("test-first"), **(security or {})))
    consumer.subscribe([topic])
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            # Records of several partitions may come at once: take the earliest of what arrived with it.
            batch = [m for m in (message, *consumer.consume(1000, 0.5))
                     if m.error() is None and m.timestamp()[1] >= since_ms]
            if not batch:
                continue
            first = min(batch, key=lambda m: m.timestamp()[1])
            return Message(first.key(), first.value(), first.partition(), first.offset(), first.timestamp()[1])
    finally:
        consumer.close()
    raise AssertionError(f"no record in {topic} within {deadline_s:.0f} s")


def healthy_states(joiner: str) -> dict[str, str]:
    """Every process of the stack running under supervisord, answering its health check, never restarted
    (supervisord would restart a stage that failed after its start, hiding the failure)."""
    return dict.fromkeys((*SERVERS, "stream-connector", JOINER_SERVICE[joiner], "db-connector"),
                         "RUNNING healthy 0")


def assert_all_healthy(result: StartResult) -> None:
    wanted = healthy_states(result.joiner)
    assert {name: result.states.get(name) for name in wanted} == wanted, result.states
