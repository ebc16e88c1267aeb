"""Commands that act on the running stack take the settings it was started with, not the shell's: `make status`
from a shell without a cluster's node hosts or a stack's ports probed 127.0.0.1 and the default ports."""
from __future__ import annotations

from pathlib import Path

import pytest

from pipeline_core import paths
from stack import configuration


def test_the_running_stacks_settings_replace_the_shells_and_the_differences_are_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path)
    configuration.note(configuration.current({"KAFKA_NODE1_HOST": "kafka-1.plant.example", "MQTT_PORT": "18830",
                                              "INFLUXDB_ADMIN_PASSWORD": "secret"}))
    shell = {"MQTT_PORT": "1883", "SPARK_WORKER_CORES": "4", "INFLUXDB_ADMIN_PASSWORD": "other", "HOME": "/root"}

    ignored = configuration.take_noted(shell)

    assert shell == {"KAFKA_NODE1_HOST": "kafka-1.plant.example", "MQTT_PORT": "18830",
                     "INFLUXDB_ADMIN_PASSWORD": "other", "HOME": "/root"}  # a secret is never replaced by its digest
    assert ignored == ["MQTT_PORT='18830' (this shell: '1883')", "SPARK_WORKER_CORES=unset (this shell: '4')"]


def test_without_a_running_stack_the_shell_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paths, "STATE_DIR", tmp_path)
    shell = {"MQTT_PORT": "1883"}
    assert configuration.take_noted(shell) == [] and shell == {"MQTT_PORT": "1883"}
