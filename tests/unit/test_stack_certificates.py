"""The stack's server certificates hold the names other hosts reach the servers by (TLS_EXTRA_HOSTNAMES): one the
stack made is made again when a wanted name is missing; one given to the stack is used as it is, the missing
names logged. Real `openssl`, real certificates."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from stack import certificates

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is a stack requirement")


def test_a_made_certificate_holds_the_extra_names_and_is_made_again_for_a_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLS_EXTRA_HOSTNAMES", "mqtt.plant.example, 198.18.0.7")
    first = certificates.ensure_server_certificate("mosquitto", ["127.0.0.1", "localhost"], tmp_path)
    assert certificates.certificate_names(first.certificate) == [
        "127.0.0.1", "localhost", "mqtt.plant.example", "198.18.0.7"]
    issued = first.certificate.read_bytes()

    certificates.ensure_server_certificate("mosquitto", ["127.0.0.1", "localhost"], tmp_path)
    assert first.certificate.read_bytes() == issued  # every name there: kept

    monkeypatch.setenv("TLS_EXTRA_HOSTNAMES", "broker-2.plant.example")
    again = certificates.ensure_server_certificate("mosquitto", ["127.0.0.1", "localhost"], tmp_path)
    assert "broker-2.plant.example" in certificates.certificate_names(again.certificate)
    assert again.keystore.read_text().endswith(again.certificate.read_text())
    assert again.keystore.stat().st_mode & 0o077 == 0


def test_a_given_certificate_is_kept_and_its_missing_names_are_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    given = certificates.ensure_server_certificate("kafka", ["127.0.0.1"], tmp_path)
    (tmp_path / "kafka.hosts").unlink()  # as a certificate put there by hand has no record of the stack's
    issued = given.certificate.read_bytes()
    monkeypatch.setenv("TLS_EXTRA_HOSTNAMES", "kafka.plant.example")
    with caplog.at_level(logging.WARNING, logger=certificates.__name__):
        kept = certificates.ensure_server_certificate("kafka", ["127.0.0.1"], tmp_path)
    assert kept.certificate.read_bytes() == issued
    assert "not valid for kafka.plant.example" in caplog.text
