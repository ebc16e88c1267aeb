"""One joiner at a time, one configuration at a time: the names the stack hands a joiner's position over between
are the ones each joiner derives from its own settings, and the settings `up` compares are the ones the stack and
the stages read."""
from __future__ import annotations

from pathlib import Path

import pytest

from kafka_joiner.settings import KafkaJoinerSettings
from pipeline_core.settings import load_settings
from spark_joiner.settings import SparkJoinerSettings
from stack import configuration, joiners
from stack.processes import StackError


def test_the_standalone_joiners_group_and_changelog_are_the_joiners_own(monkeypatch) -> None:
    for name in ("KAFKA_JOINER_GROUP_ID", "KAFKA_JOINER_INPUT_TOPIC", "KAFKA_JOINER_STATE_TOPIC"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings(KafkaJoinerSettings, ["--input-partitioned-by-thing"], environ={})
    position = joiners.position_of("lsb", cluster=False)
    assert (position.group_id, position.input_topic, position.state_topic) == (
        settings.group_id, settings.input_topic, settings.state_topic_name())
    monkeypatch.setenv("KAFKA_JOINER_GROUP_ID", "plant-7")
    monkeypatch.setenv("KAFKA_JOINER_INPUT_TOPIC", "plant.data")
    position = joiners.position_of("lsb", cluster=True)
    assert (position.group_id, position.state_topic) == ("plant-7", "plant-7.plant.data.state")


def test_the_spark_joiners_sink_group_is_the_one_its_checkpoint_names(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    for name in ("SPARK_JOINER_CHECKPOINT_DIR", "SPARK_JOINER_TRANSACTIONAL_ID", "SPARK_JOINER_INPUT_TOPIC"):
        monkeypatch.delenv(name, raising=False)
    single = joiners.position_of("spark", cluster=False)
    assert single.checkpoint_dir == tmp_path / "spark_joiner" / "checkpoint"
    assert single.group_id == SparkJoinerSettings(checkpoint_dir=single.checkpoint_dir).sink_transactional_id()
    # The cluster's joiner gets its checkpoint on its command line (topology.SparkSubmittedJoiner).
    cluster = joiners.position_of("spark", cluster=True)
    assert cluster.checkpoint_dir == tmp_path / "spark-joiner" / "checkpoint"
    assert cluster.group_id == SparkJoinerSettings(checkpoint_dir=cluster.checkpoint_dir).sink_transactional_id()
    monkeypatch.setenv("SPARK_JOINER_CHECKPOINT_DIR", str(tmp_path / "elsewhere"))
    moved = joiners.position_of("spark", cluster=False)
    assert moved.group_id == SparkJoinerSettings(checkpoint_dir=tmp_path / "elsewhere").sink_transactional_id()
    monkeypatch.setenv("SPARK_JOINER_TRANSACTIONAL_ID", "spark-joiner.mine")
    assert joiners.position_of("spark", cluster=False).group_id == "spark-joiner.mine"


def test_without_joiner_the_one_the_state_dir_runs_is_chosen(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    monkeypatch.delenv("JOINER", raising=False)
    assert joiners.chosen() == "spark"
    joiners.record("lsb")
    assert joiners.chosen() == "lsb"
    monkeypatch.setenv("JOINER", "spark")
    assert joiners.chosen() == "spark"
    monkeypatch.setenv("JOINER", "flink")
    with pytest.raises(StackError, match="JOINER='flink': choose one of lsb, spark"):
        joiners.chosen()


def test_the_settings_are_what_the_stack_and_the_stages_read() -> None:
    environ = {"KAFKA_JOINER_JOIN_SPECS": "/specs.toml", "PROGRESS_INTERVAL_S": "10", "MQTT_PORT": "1883",
               "SECURITY": "on", "STACK_TLS": "", "STACK_STATE_DIR": "/s", "STACK_CACHE_DIR": "/c",
               "STACK_DISK_WARN_FREE_GIB": "5", "HOME": "/root", "PATH": "/bin", "JOINER": "lsb", "TOPOLOGY": "single",
               "SIMULATOR_RATE": "5", "KAFKA_SASL_PASSWORD": "hunter2"}
    settings = configuration.current(environ)
    assert set(settings) == {"KAFKA_JOINER_JOIN_SPECS", "PROGRESS_INTERVAL_S", "MQTT_PORT", "KAFKA_SASL_PASSWORD"}
    assert "hunter2" not in settings["KAFKA_SASL_PASSWORD"]  # kept as a digest only
    # SECURITY=on lasts in the credentials file: a later `make up` without it runs the same secure stack.


def test_a_changed_setting_is_named_with_what_to_run(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    configuration.check({"MQTT_PORT": "1"})  # nothing noted: a stack started before the note, or none
    started = configuration.current({"KAFKA_JOINER_JOIN_SPECS": "/a.toml", "PROGRESS_INTERVAL_S": "10",
                                     "KAFKA_SASL_PASSWORD": "old"})
    configuration.note(started)
    assert oct((tmp_path / "supervisor" / "settings.json").stat().st_mode & 0o777) == "0o600"
    configuration.check(dict(started))  # the same: nothing to say
    changed = configuration.current({"KAFKA_JOINER_JOIN_SPECS": "/b.toml", "SPARK_JOINER_BUCKETS": "8",
                                     "KAFKA_SASL_PASSWORD": "new"})
    with pytest.raises(StackError) as refused:
        configuration.check(changed)
    message = str(refused.value)
    assert ("KAFKA_JOINER_JOIN_SPECS='/a.toml' (now '/b.toml'); KAFKA_SASL_PASSWORD (changed); "
            "PROGRESS_INTERVAL_S='10' (now unset); SPARK_JOINER_BUCKETS unset (now '8')") in message
    assert "old" not in message and "new'" not in message
    assert "`make down`, then `make up` with the new settings" in message
