"""Every stage's settings are checked at start, and named by one scheme.

A wrong value (negative, not finite, no port, a boolean that is neither true nor false) stops the stage with a
message naming the flag and the environment variable to change, however it was given; every stage's variables
start with its name, every time value names its unit, and no stage offers a setting it never reads."""
from __future__ import annotations

import ast
import dataclasses
import logging
from pathlib import Path

import pytest

from db_connector.settings import DbConnectorSettings
from grafana_report.__main__ import ReportSettings
from kafka_joiner.settings import KafkaJoinerSettings
from live_dashboards.settings import LiveDashboardsSettings
from pipeline_core.influx_retention import RetentionSettings
from pipeline_core.settings import (ConnectionSettings, InfluxSettings, KafkaSettings, MqttSettings, ProgressSettings,
                                    check_settings, load_settings)
from simulator.settings import SimulatorSettings
from spark_joiner.settings import SparkJoinerSettings
from stream_connector.settings import ConnectorSettings

ROOT = Path(__file__).resolve().parents[2]
# Each stage's settings, the prefix of its own variables, and its package.
STAGES = [
    (SimulatorSettings, "SIMULATOR_", "01_simulator/simulator"),
    (ConnectorSettings, "STREAM_CONNECTOR_", "03_stream_connector/stream_connector"),
    (KafkaJoinerSettings, "KAFKA_JOINER_", "05_local_stream_buffer/kafka_joiner"),
    (SparkJoinerSettings, "SPARK_JOINER_", "06_spark_joiner/spark_joiner"),
    (DbConnectorSettings, "DB_CONNECTOR_", "07_db_connector/db_connector"),
    (ReportSettings, "REPORT_", "08_influxdb_grafana/grafana_report"),
    (LiveDashboardsSettings, "LIVE_DASHBOARDS_", "08_influxdb_grafana/live_dashboards"),
]
SHARED = (MqttSettings, KafkaSettings, InfluxSettings, ProgressSettings, RetentionSettings)
# Words that make a setting a time value, which must then end in its unit.
TIME_WORDS = ("timeout", "interval", "delay", "linger", "deadline", "trigger", "grace", "wait", "align")
STAGE_IDS = [cls.__name__ for cls, _prefix, _package in STAGES]


def own_fields(cls: type) -> list[dataclasses.Field]:
    shared = {field.name for group in SHARED for field in dataclasses.fields(group)}
    return [field for field in dataclasses.fields(cls) if field.name not in shared]


@pytest.mark.parametrize("cls, prefix, package", STAGES, ids=STAGE_IDS)
def test_a_stage_names_its_variables_by_itself_and_its_times_by_their_unit(cls: type, prefix: str,
                                                                           package: str) -> None:
    for field in own_fields(cls):
        env = field.metadata["env"]
        assert env.startswith(prefix), (field.name, env)
        measured = field.name.split("_per_")[0]  # max_offsets_per_trigger counts offsets
        if any(word in TIME_WORDS for word in measured.split("_")):
            assert field.name.endswith(("_s", "_ms")) and env.endswith(("_S", "_MS")), (field.name, env)


@pytest.mark.parametrize("cls, prefix, package", STAGES, ids=STAGE_IDS)
def test_a_stage_offers_only_settings_it_reads(cls: type, prefix: str, package: str) -> None:
    """Each setting is read somewhere in the stage's package, or in `pipeline_core` (which the shared groups
    configure: clients, progress): a flag that nothing reads would be a promise nobody keeps."""
    read: set[str] = set()
    for folder in (ROOT / package, ROOT / "core" / "pipeline_core"):
        for path in folder.rglob("*.py"):  # a definition is no attribute: settings.py counts for its methods only
            read |= {node.attr for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)}
    assert [field.name for field in dataclasses.fields(cls) if field.name not in read] == []


@pytest.mark.parametrize("cls, prefix, package", STAGES, ids=STAGE_IDS)
def test_every_default_passes_the_checks(cls: type, prefix: str, package: str) -> None:
    assert check_settings(load_settings(cls, [], environ={})) == []


@pytest.mark.parametrize("given, expected", [
    (["--progress-interval-s", "-1"], "--progress-interval-s / PROGRESS_INTERVAL_S: -1.0 is below 0"),
    (["--linger-ms", "-5"], "--linger-ms / STREAM_CONNECTOR_LINGER_MS: -5 is below 0"),
    (["--max-quantities", "0"], "--max-quantities / STREAM_CONNECTOR_MAX_QUANTITIES: 0 is below 1"),
    (["--shutdown-timeout-s", "nan"], "--shutdown-timeout-s / STREAM_CONNECTOR_SHUTDOWN_TIMEOUT_S: nan is not a "
                                      "finite number"),
    (["--mqtt-port", "70000"], "--mqtt-port / MQTT_PORT: 70000 is not a port (1-65535)"),
])
def test_a_wrong_flag_stops_the_stage_naming_flag_and_variable(given: list[str], expected: str,
                                                               capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stopped:
        load_settings(ConnectorSettings, given, environ={})
    assert stopped.value.code == 2
    assert expected in capsys.readouterr().err


def test_a_wrong_variable_stops_the_stage_naming_both(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        load_settings(KafkaJoinerSettings, [], environ={"KAFKA_JOINER_COMMIT_INTERVAL_MS": "-100",
                                                         "INFLUXDB_PORT": "0"})
    error = capsys.readouterr().err
    assert "--commit-interval-ms / KAFKA_JOINER_COMMIT_INTERVAL_MS: -100 is below 0" in error
    assert "--influxdb-port / INFLUXDB_PORT: 0 is not a port (1-65535)" in error  # every problem, not the first


@pytest.mark.parametrize("text, value", [("1", True), ("TRUE", True), ("yes", True), (" on ", True),
                                         ("0", False), ("false", False), ("No", False), ("off", False)])
def test_a_boolean_variable_takes_the_usual_words(text: str, value: bool) -> None:
    assert load_settings(ProgressSettings, [], environ={"HEALTH_METRICS": text}).health_metrics is value


@pytest.mark.parametrize("text", ["ture", "2", "", "enabled"])
def test_any_other_boolean_word_is_an_error_not_false(text: str) -> None:
    with pytest.raises(SystemExit, match=r"HEALTH_METRICS=.* \(--health-metrics\): not a boolean"):
        load_settings(ProgressSettings, [], environ={"HEALTH_METRICS": text})


def test_the_stream_connectors_former_variables_are_still_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        settings = load_settings(ConnectorSettings, [], environ={"DATA_TOPIC": "plant1.data",
                                                                 "CONNECTOR_LINGER_MS": "7"})
    assert (settings.data_topic, settings.linger_ms) == ("plant1.data", 7)
    assert "DATA_TOPIC is deprecated: use STREAM_CONNECTOR_DATA_TOPIC" in caplog.text
    assert "CONNECTOR_LINGER_MS is deprecated: use STREAM_CONNECTOR_LINGER_MS" in caplog.text


def test_the_spark_joiner_offers_no_mqtt_setting() -> None:
    assert not any(field.name.startswith("mqtt_") for field in dataclasses.fields(SparkJoinerSettings))
    assert {field.name for field in dataclasses.fields(ConnectionSettings)} >= {"mqtt_host", "kafka_bootstrap_servers"}
