"""`python -m benchmarks.mosquitto_persistence`: what a SIGKILL of Mosquitto loses, and what saving
more often costs, for each persistence setting.

Mosquitto keeps its queues in memory and writes its whole database (every session, every queued
message) to disk on a schedule. A SIGKILL loses what it acknowledged since the last save and had not
yet handed on. Measured here on a bare broker (its own port and folder), with the stream connector's
kind of session (persistent, QoS 1) away, as during the connector's restart or a Kafka outage:

- loss: publish `--rows` rows at QoS 1 (every PUBACK back), SIGKILL the broker `--kill-after-s`
  later, start it again, and count what the session receives;
- cost: with `--queue` rows already waiting for the session, publish `--cost-rows` more as fast as the
  acknowledgements allow and at `--rate`, each for at most `--cost-max-s`; rows/s, and the broker's CPU seconds per
  1,000 rows.

Its figures are recorded as ``mosquitto_persistence`` (``..._during_publication`` with `--kill-rate`).
"""
from __future__ import annotations

import argparse
import getpass
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from paho.mqtt.enums import MQTTProtocolVersion

from pipeline_core.health import mqtt_ready
from pipeline_core.mqtt import new_client, pump, wait_connected
from pipeline_core.settings import MqttSettings
from simulator.publisher import Publisher
from stack.processes import free_loopback_ports

from benchmarks.results import Results

TOPIC = "bench/persistence"
SESSION_ID = "bench-persistent-session"
# name -> the persistence lines of the broker's config
SETTINGS = {
    "autosave_interval 10 (shipped before)": "autosave_interval 10",
    "autosave_interval 1": "autosave_interval 1",
    "autosave_on_changes, interval 1000": "autosave_on_changes true\nautosave_interval 1000",
    "autosave_on_changes, interval 100": "autosave_on_changes true\nautosave_interval 100",
    "autosave_on_changes, interval 1": "autosave_on_changes true\nautosave_interval 1",
}
ROW = {"Thing": "bench", "actSpeed_C1": 1234.5, "actTorque_C1": 12.25, "actCurrent_C1": 3.5,
       "id": "00000000-0000-0000-0000-000000000000"}


@dataclass(frozen=True)
class Measured:
    setting: str
    published: int
    received: int
    saves: int


class Broker:
    """mosquitto with a given persistence setting, in a folder of its own, started and killed here."""

    def __init__(self, folder: Path, persistence: str) -> None:
        self.folder = folder
        (self.port,) = free_loopback_ports(1)
        self.config = folder / "mosquitto.conf"
        self.log = folder / "mosquitto.log"
        (folder / "data").mkdir(parents=True, exist_ok=True)
        self.settings = MqttSettings(mqtt_port=self.port)
        self.process: subprocess.Popen | None = None
        self.configure(persistence)

    def configure(self, persistence: str) -> None:
        """Write the config; a running broker takes it up at its next start."""
        self.config.write_text(
            # As root, Mosquitto would drop to user `mosquitto`, who cannot write this folder.
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\nuser {getpass.getuser()}\npersistence true\n"
            f"persistence_location {self.folder / 'data'}/\n{persistence}\n"
            "max_inflight_messages 100\nmax_queued_messages 1000000\nmax_queued_bytes 268435456\n"
            f"log_dest file {self.log}\nlog_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
            "connection_messages false\n")

    def start(self) -> None:
        # A log file, not stdout: Mosquitto flushes it per line, so the saves can be counted.
        self.process = subprocess.Popen([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(self.config)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        _wait(lambda: mqtt_ready("127.0.0.1", self.port), 30, "the broker to answer")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=120)

    def save_now(self) -> None:
        """SIGUSR1: Mosquitto writes its database; returns once the file changed."""
        database = self.folder / "data" / "mosquitto.db"
        before = database.stat().st_mtime_ns if database.exists() else 0
        self.process.send_signal(signal.SIGUSR1)
        _wait(lambda: database.exists() and database.stat().st_mtime_ns != before, 300, "the save")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def saves(self) -> int:
        if not self.log.exists():
            return 0
        return self.log.read_text(errors="replace").count("Saving in-memory database")


def _wait(check, deadline_s: float, what: str) -> None:
    end = time.monotonic() + deadline_s
    while not check():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def open_session(settings: MqttSettings) -> None:
    """The connector's kind of session: persistent, subscribed at QoS 1, then away."""
    client = new_client(settings, SESSION_ID, protocol=MQTTProtocolVersion.MQTTv311, clean_session=False)
    client.connect(settings.mqtt_host, settings.mqtt_port)
    if not wait_connected(client, 10):
        raise RuntimeError("no CONNACK")
    subscribed = []
    client.on_subscribe = lambda *_args: subscribed.append(True)
    client.subscribe(TOPIC, qos=1)
    end = time.monotonic() + 10
    while not subscribed and time.monotonic() < end:
        pump(client, 0.05)
    client.disconnect()
    pump(client, 0.1)


def receive_session(settings: MqttSettings, idle_s: float = 3.0) -> set[int]:
    """Connect as the session and collect the sequence numbers of what it receives until idle."""
    received: set[int] = set()
    last = [time.monotonic()]

    def on_message(client, userdata, message) -> None:
        received.add(json.loads(message.payload)["seq"])
        last[0] = time.monotonic()

    client = new_client(settings, SESSION_ID, protocol=MQTTProtocolVersion.MQTTv311, clean_session=False)
    client.on_message = on_message
    client.connect(settings.mqtt_host, settings.mqtt_port)
    if not wait_connected(client, 10):
        raise RuntimeError("no CONNACK")
    last[0] = time.monotonic()
    while time.monotonic() - last[0] < idle_s:
        pump(client, 0.05)
    client.disconnect()
    return received


def publish(settings: MqttSettings, first: int, rows: int, rate: float = 0.0,
            max_s: float = math.inf, drain_s: float = 120.0) -> tuple[int, float, int]:
    """Publish rows numbered first.. at QoS 1 (at `rate` rows/s, 0: as fast as acks allow), none begun after
    `max_s`, and wait up to `drain_s` for their PUBACKs; the rows published, the seconds until the last PUBACK (or
    the wait's end), and the rows not acknowledged."""
    publisher = Publisher(settings, f"bench-publisher-{uuid.uuid4().hex[:8]}")
    publisher.connect()
    started = time.perf_counter()
    published = 0
    for index in range(rows):
        if time.perf_counter() - started > max_s:
            break
        published += 1
        if rate:
            due = started + index / rate
            while (wait := due - time.perf_counter()) > 0:
                publisher.pump(min(wait, 0.05))
        publisher.publish(TOPIC, json.dumps({**ROW, "Timestamp": 1_554_076_800_000 + first + index,
                                             "seq": first + index}))
    missing = publisher.drain(drain_s)
    seconds = time.perf_counter() - started
    publisher.close()
    return published, seconds, missing


def measure_loss(folder: Path, name: str, rows: int, kill_after_s: float, rate: float = 0.0) -> Measured:
    """With `rate`, the kill comes `kill_after_s` into a publication at that rate (the publisher rides
    it out and sends its unacknowledged rows again); without, `kill_after_s` after the last PUBACK."""
    broker = Broker(folder, SETTINGS[name])
    broker.start()
    saves = []

    def kill_and_restart() -> None:
        saves.append(broker.saves())
        broker.kill()
        broker.start()

    try:
        open_session(broker.settings)
        broker.save_now()  # the session exists on disk, as a connector's long-lived one does
        if rate:
            fault = threading.Timer(kill_after_s, kill_and_restart)
            fault.start()
            _published, _seconds, missing = publish(broker.settings, 0, rows, rate)
            fault.join()
        else:
            _published, _seconds, missing = publish(broker.settings, 0, rows)
            time.sleep(kill_after_s)  # the fault's moment, not a synchronisation
            kill_and_restart()
        assert missing == 0, f"{missing} rows unacknowledged"
        received = receive_session(broker.settings)
        return Measured(name, rows, len(received & set(range(rows))), saves[0])
    finally:
        broker.stop()


def measure_cost(folder: Path, name: str, queue: int, rows: int, rate: float, max_s: float,
                 recorded: Results) -> str:
    # The queue is filled under the rare time-based saves (filling it under a save per change would take
    # hours), then the broker is restarted gracefully (it saves) with the setting measured.
    broker = Broker(folder, SETTINGS["autosave_interval 10 (shipped before)"])
    broker.start()
    try:
        open_session(broker.settings)
        publish(broker.settings, 0, queue)
        broker.stop()
        broker.configure(SETTINGS[name])
        broker.start()
        database = folder / "data" / "mosquitto.db"
        saved_mb = database.stat().st_size / 1e6
        save_started = time.perf_counter()
        broker.save_now()
        save_s = time.perf_counter() - save_started
        lines = [f"{name}: queue {queue:,} rows, database {saved_mb:.1f} MB, one save {save_s:.2f} s"]
        recorded.add(f"{name}, {queue:,} rows queued: the database", saved_mb, "MB")
        recorded.add(f"{name}, {queue:,} rows queued: one save", save_s, "s")
        for label, pace in (("as fast as acks allow", 0.0), (f"at {rate:,.0f} rows/s", rate)):
            cpu, saves = broker.cpu_s(), broker.saves()
            published, seconds, missing = publish(broker.settings, queue, rows, pace, max_s, max_s)
            cpu = broker.cpu_s() - cpu
            acknowledged = published - missing
            lines.append(f"  {label}: {acknowledged / seconds:,.0f} rows/s, broker CPU {1000 * cpu / acknowledged:.3f} "
                         f"s per 1,000 rows ({cpu / seconds:.0%} of a core), {broker.saves() - saves} saves, "
                         f"{missing} unacknowledged")
            recorded.add(f"{name}, publishing {label}", acknowledged / seconds, "rows/s")
            recorded.add(f"{name}, publishing {label}: the broker's CPU per 1,000 rows",
                         1000 * cpu / acknowledged, "s")
            queue += published
        return "\n".join(lines)
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--kill-after-s", type=float, default=2.0)
    parser.add_argument("--kill-rate", type=float, default=0.0,
                        help="kill while publishing the rows at this rate (0: after the last PUBACK)")
    parser.add_argument("--queue", type=int, default=100_000, help="rows waiting when the cost is measured "
                                                                    "(0: skip the cost)")
    parser.add_argument("--cost-rows", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--cost-max-s", type=float, default=60.0,
                        help="seconds each cost publication may take at most (a save per change is that slow)")
    parser.add_argument("--repeat", type=int, default=1, help="loss trials per setting")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    recorded = Results("mosquitto_persistence_during_publication" if args.kill_rate else "mosquitto_persistence")
    for name in args.settings:
        for trial_index in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="mosquitto-persistence-") as folder:
                measured = measure_loss(Path(folder), name, args.rows, args.kill_after_s, args.kill_rate)
            moment = (f"{args.kill_after_s:g} s into {measured.published:,} rows at {args.kill_rate:,.0f} rows/s"
                      if args.kill_rate else f"{args.kill_after_s:g} s after {measured.published:,} acknowledged rows")
            print(f"{name}: SIGKILL {moment}: "
                  f"{measured.received:,} delivered after the restart, {measured.published - measured.received:,} "
                  f"lost ({measured.saves} saves before the kill)", flush=True)
            trial = f" (trial {trial_index + 1})" if args.repeat > 1 else ""
            recorded.add(f"{name}: rows lost of {measured.published:,}, SIGKILL {moment}{trial}",
                         measured.published - measured.received, "rows", count=True)
        if args.queue:
            with tempfile.TemporaryDirectory(prefix="mosquitto-persistence-") as folder:
                print(measure_cost(Path(folder), name, args.queue, args.cost_rows, args.rate, args.cost_max_s,
                                   recorded), flush=True)
    recorded.write()


if __name__ == "__main__":
    main()
