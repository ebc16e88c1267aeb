"""Where the project keeps its code, downloaded artifacts and runtime state."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Git-ignored: downloaded jars. Survives `make clean`, so a clean restart needs no network.
CACHE_DIR = Path(os.environ.get("STACK_CACHE_DIR", REPO_ROOT / ".cache"))
KAFKA_LIBS = CACHE_DIR / "kafka" / "libs"
SPARK_JARS = CACHE_DIR / "spark" / "jars"
# Git-ignored: configs rendered for this machine, data, logs and PID files. `make clean` deletes it.
STATE_DIR = Path(os.environ.get("STACK_STATE_DIR", REPO_ROOT / ".stack"))

MQTT_BROKER_DIR = REPO_ROOT / "02_mqtt_broker"
KAFKA_DIR = REPO_ROOT / "04_kafka"
INFLUXDB_GRAFANA_DIR = REPO_ROOT / "08_influxdb_grafana"
