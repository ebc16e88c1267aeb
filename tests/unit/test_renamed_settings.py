"""A renamed setting keeps its old flag and environment variable, with a warning naming the new ones."""
from __future__ import annotations

import logging

import pytest

from pipeline_core.settings import load_settings
from spark_joiner.settings import SparkJoinerSettings


def test_the_trigger_is_set_by_its_unit_bearing_flag_and_variable() -> None:
    assert load_settings(SparkJoinerSettings, ["--trigger-s", "0.2"]).trigger_s == 0.2
    assert load_settings(SparkJoinerSettings, [], environ={"SPARK_JOINER_TRIGGER_S": "0.3"}).trigger_s == 0.3


def test_the_former_trigger_flag_still_sets_it_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert load_settings(SparkJoinerSettings, ["--trigger-seconds", "0.2"]).trigger_s == 0.2
    assert "--trigger-seconds is deprecated: use --trigger-s" in caplog.text


def test_the_former_variable_still_sets_it_unless_the_new_one_is_set(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert load_settings(SparkJoinerSettings, [],
                             environ={"SPARK_JOINER_TRIGGER_SECONDS": "1.5"}).trigger_s == 1.5
    assert "SPARK_JOINER_TRIGGER_SECONDS is deprecated: use SPARK_JOINER_TRIGGER_S" in caplog.text
    both = {"SPARK_JOINER_TRIGGER_SECONDS": "1.5", "SPARK_JOINER_TRIGGER_S": "0.7"}
    assert load_settings(SparkJoinerSettings, [], environ=both).trigger_s == 0.7


def test_the_former_flag_is_not_offered_in_the_help(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        load_settings(SparkJoinerSettings, ["--help"])
    shown = capsys.readouterr().out
    assert "--trigger-s " in shown and "--trigger-seconds" not in shown
