"""The shared record schema and settings loader every stage relies on."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest

from db_connector.settings import DbConnectorSettings
from kafka_joiner.settings import KafkaJoinerSettings
from pipeline_core.records import InvalidRecord, dead_letter, decode_record, encode_record, record_key
from pipeline_core.settings import ConnectionSettings, load_settings, setting
from simulator.settings import SimulatorSettings
from spark_joiner.settings import SparkJoinerSettings
from stream_connector.settings import ConnectorSettings

GOOD = {"thing": "R0815", "quantity": "actSpeed_C11", "phenomenonTime": 1554096460415, "result": 288.2}


def test_round_trip_and_key() -> None:
    assert decode_record(encode_record(GOOD)) == GOOD
    assert record_key("R0815", "actSpeed_C11") == "R0815.actSpeed_C11"


@pytest.mark.parametrize("payload, reason", [
    (b"{not json", "malformed JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (json.dumps({**GOOD, "result": "fast"}).encode(), "result must be a finite number"),
    (json.dumps({**GOOD, "result": True}).encode(), "result must be a finite number"),
    (b'{"thing": "R0815", "quantity": "q", "phenomenonTime": 1554096460415, "result": NaN}',
     "result must be a finite number"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "thing"}).encode(), "missing field(s): thing"),
    (json.dumps({**GOOD, "quantity": ""}).encode(), "quantity must be a non-empty string"),
    (b"\xff\xfe", "malformed JSON"),
    (None, "empty record: no value"),
    (b"[" * 100_000 + b"]" * 100_000, "malformed JSON"),
    (b'{"result": 1' + b"0" * 5000 + b"}", "malformed JSON"),  # more digits than Python reads
    # Names: text (no lone surrogate), 1 to 256 characters; anything else is a name.
    (json.dumps({**GOOD, "thing": "\ud800"}).encode(), "is no text"),
    (b'{"thing": "\xed\xa0\x80", "quantity": "q", "phenomenonTime": 1554096460415, "result": 1}', "is no text"),
    (json.dumps({**GOOD, "quantity": "a\udc00b"}).encode(), "is no text"),
    (json.dumps({**GOOD, "quantity": "q" * 257}).encode(), "longer than 256"),
    # Times: epoch milliseconds of the valid range, taken as they are.
    (json.dumps({**GOOD, "phenomenonTime": 1554096460}).encode(), "outside the valid time range"),
    (json.dumps({**GOOD, "phenomenonTime": 1e20}).encode(), "outside the valid time range"),
    (json.dumps({**GOOD, "phenomenonTime": "2019-04-01T05:27:40Z"}).encode(), "phenomenonTime must be a finite"),
])
def test_invalid_records_say_why(payload: bytes, reason: str) -> None:
    with pytest.raises(InvalidRecord, match=reason.replace("(", r"\(").replace(")", r"\)")):
        decode_record(payload)


def test_integers_beyond_64_bits_are_encoded_and_beyond_floats_refused() -> None:
    huge = {**GOOD, "result": -(2**70)}
    assert decode_record(encode_record(huge)) == huge
    with pytest.raises(InvalidRecord, match="result must be a finite number"):
        decode_record(b'{"thing": "R0815", "quantity": "q", "phenomenonTime": 1554096460415, "result": 1'
                      + b"0" * 400 + b"}")


def test_a_quantity_may_hold_a_dot_and_names_may_hold_spaces_and_any_script() -> None:
    record = {**GOOD, "thing": "Säge 4", "quantity": "axis.speed / 1/min"}
    assert decode_record(encode_record(record)) == record


def test_encoding_refuses_nan_rather_than_writing_invalid_json() -> None:
    with pytest.raises(ValueError):
        encode_record({**GOOD, "result": math.nan})


def test_dead_letter_keeps_the_payload_text_or_bytes() -> None:
    text = json.loads(dead_letter("bad", b'{"a": 1}', "connector", topic="t", partition=None))
    assert text["reason"] == "bad" and text["payload"] == '{"a": 1}' and text["topic"] == "t"
    assert "partition" not in text
    binary = json.loads(dead_letter("bad", b"\xff\x00", "connector"))
    assert binary["payloadBase64"] == "/wA="


@dataclasses.dataclass(frozen=True)
class StageSettings(ConnectionSettings):
    batch_size: int = setting(500, "TEST_BATCH_SIZE", "records per batch")
    dry_run: bool = setting(False, "TEST_DRY_RUN", "do nothing")


def test_settings_precedence_flag_over_env_over_default() -> None:
    assert load_settings(StageSettings, [], environ={}).batch_size == 500
    assert load_settings(StageSettings, [], environ={"TEST_BATCH_SIZE": "7"}).batch_size == 7
    assert load_settings(StageSettings, ["--batch-size", "9"], environ={"TEST_BATCH_SIZE": "7"}).batch_size == 9
    assert load_settings(StageSettings, [], environ={"TEST_DRY_RUN": "yes"}).dry_run is True
    assert load_settings(StageSettings, ["--no-dry-run"], environ={"TEST_DRY_RUN": "1"}).dry_run is False


def test_bootstrap_servers_from_environment() -> None:
    settings = load_settings(ConnectionSettings, [], environ={"KAFKA_BOOTSTRAP_SERVERS": "kafka:19092"})
    assert settings.kafka_bootstrap_servers == "kafka:19092"


def test_bad_environment_value_is_a_clear_error() -> None:
    with pytest.raises(SystemExit, match="TEST_BATCH_SIZE='many'"):
        load_settings(StageSettings, [], environ={"TEST_BATCH_SIZE": "many"})


@pytest.mark.parametrize("cls", [ConnectionSettings, SimulatorSettings, ConnectorSettings, KafkaJoinerSettings,
                                 SparkJoinerSettings, DbConnectorSettings], ids=lambda cls: cls.__name__)
def test_no_password_shows_in_help_or_repr(cls, capsys) -> None:
    """A password from the environment (a secure stack's stages take theirs from the credentials file) is
    neither printed by --help nor in the settings' repr, which logs and tracebacks show."""
    secret = "s3cret-never-shown"
    environ = {field.metadata["env"]: secret for field in dataclasses.fields(cls)
               if "password" in field.name and field.metadata.get("env")}
    assert environ  # every stage has at least one password setting
    with pytest.raises(SystemExit):
        load_settings(cls, ["--help"], environ=environ)
    assert secret not in capsys.readouterr().out
    assert secret not in repr(load_settings(cls, [], environ=environ))
