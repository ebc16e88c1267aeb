"""Settings of the machine-state simulator (flags > environment > defaults)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline_core.paths import STATE_DIR
from pipeline_core.settings import MqttSettings, setting

from .synthetic import DEFAULT_START_MS
from .topics import THING_TOPIC_TEMPLATE

# Per machine, the newest time of the rows --ending-now replays published into this state dir's stack.
DEFAULT_REPLAY_LOG = STATE_DIR / "simulator" / "replayed.json"
# The 5,000 real rows of three machines (not in time order), shipped as the default replay.
DEFAULT_EVENTS_FILE = Path(__file__).resolve().parents[1] / "data" / "test_events.json"


@dataclass(frozen=True)
class SimulatorSettings(MqttSettings):
    """Replay machine states from an events file (or synthetic ones) to MQTT at QoS 1."""

    events_file: Path = setting(DEFAULT_EVENTS_FILE, "SIMULATOR_EVENTS_FILE",
                                "events file to replay: one JSON row per line; .gz and .zip too")
    mqtt_topic: str = setting(THING_TOPIC_TEMPLATE, "SIMULATOR_MQTT_TOPIC",
                              "MQTT topic to publish the rows to; {thing} stands for the row's Thing, so each machine "
                              "has a topic of its own (a row without a Thing fit for a topic level goes to the part "
                              "before /{thing})", formerly=(None, "MQTT_TOPIC"))
    mqtt_client_id: str | None = setting(None, "SIMULATOR_CLIENT_ID", "MQTT client id (default: simulator-<pid>)")
    rate: float = setting(0.0, "SIMULATOR_RATE", "rows per second; 0 = as fast as acknowledged delivery allows")
    speedup: float = setting(0.0, "SIMULATOR_SPEEDUP",
                             "replay with the rows' own timing, this many times faster (0 = off)")
    limit: int = setting(0, "SIMULATOR_LIMIT", "publish at most this many rows (0 = all; with --loop or "
                                               "--synthetic: without end)")
    skip: int = setting(0, "SIMULATOR_SKIP", "leave out this many rows at the start")
    loop: bool = setting(False, "SIMULATOR_LOOP", "replay the file again and again, each pass later in time")
    ending_now: bool = setting(False, "SIMULATOR_ENDING_NOW",
                               "move the rows in time, spacing kept, so the newest is now (--synthetic without "
                               "--limit: the first): an old sample then lands inside InfluxDB's retention "
                               "(`make data` does this); further on where an earlier such replay (--replay-log) left "
                               "a machine later, so each machine's rows start a minute after its earlier ones")
    replay_log: Path | None = setting(DEFAULT_REPLAY_LOG, "SIMULATOR_REPLAY_LOG",
                                      "with --ending-now: the file noting, per machine, the newest time replayed, "
                                      "read to place this replay past it and written as it goes ('none': neither; "
                                      "`make clean` deletes it with the state dir)")
    order: str = setting("time", "SIMULATOR_ORDER", "time: each machine in time order; file: as the file "
                                                    "has them (exercises late data downstream)")
    synthetic: bool = setting(False, "SIMULATOR_SYNTHETIC", "generate rows instead of reading the events file")
    machines: int = setting(3, "SIMULATOR_MACHINES", "synthetic: number of machines", minimum=1)
    axes: int = setting(2, "SIMULATOR_AXES", "synthetic: drive axes per machine", minimum=1)
    seed: int = setting(42, "SIMULATOR_SEED", "random seed of --synthetic rows and of --disorder-ms "
                                              "(same seed, same rows in the same order)", minimum=None)
    disorder_ms: int = setting(0, "SIMULATOR_DISORDER_MS",
                               "bounded disorder: hold each row back by a random 0 to this many ms of event "
                               "time, so a row arrives at most this much behind the newest of its machine "
                               "(events file in time order; 0 = off)")
    start_ms: int = setting(DEFAULT_START_MS, "SIMULATOR_START_MS", "synthetic: epoch ms of the first row")
    interval_ms: int = setting(1000, "SIMULATOR_INTERVAL_MS", "synthetic: ms between a machine's rows")
    output: Path | None = setting(None, "SIMULATOR_OUTPUT",
                                  "write the rows to this file (.gz compresses) instead of publishing")
    window: int = setting(1000, "SIMULATOR_WINDOW", "rows published but not yet acknowledged, at most", minimum=1)
    inflight: int = setting(0, "SIMULATOR_INFLIGHT", "paho's own inflight limit; 0 = off, the window bounds "
                                                     "what is in flight (paho scans its in-flight set on "
                                                     "every PUBACK when a limit is set)")
    progress: bool = setting(True, "SIMULATOR_PROGRESS", "show a progress bar")
    drain_timeout_s: float = setting(60.0, "SIMULATOR_DRAIN_TIMEOUT_S",
                                     "how long to wait at the end for the last acknowledgements")
