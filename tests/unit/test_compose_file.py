"""The Compose file for users with Docker: it parses, every service is runnable, health-checked and
restarted when it exits, and no secret is written into it."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY", re.IGNORECASE)
FROM_ENV = re.compile(r"^\$\{[A-Z0-9_]+(:?[-?][^}]*)?\}$")


def test_every_service_has_an_image_or_build_and_a_healthcheck() -> None:
    services = COMPOSE["services"]
    assert {"mosquitto", "kafka", "influxdb", "grafana"} <= services.keys()
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_every_service_is_restarted_when_it_exits() -> None:
    """All services run for good (pipeline-setup stays up as the stages' readiness gate): a crash
    restarts it, as supervisord restarts the native processes; `docker compose stop` still stops it."""
    for name, service in COMPOSE["services"].items():
        assert service.get("restart") in ("unless-stopped", "always"), f"{name} has no restart policy"


def test_dependencies_wait_for_health() -> None:
    for name, service in COMPOSE["services"].items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert condition == {"condition": "service_healthy"}, (name, dependency)


def test_no_secret_is_hard_coded() -> None:
    for name, service in COMPOSE["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):
                assert FROM_ENV.match(str(value)), f"{name}: {key} must come from .env, not {value!r}"


def test_env_example_names_every_variable_and_env_is_ignored() -> None:
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)", (ROOT / "docker-compose.yml").read_text()))
    example = {line.split("=", 1)[0] for line in (ROOT / ".env.example").read_text().splitlines()
               if line and not line.startswith("#")}
    assert referenced <= example
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


def test_provisioned_grafana_folders_exist() -> None:
    for volume in COMPOSE["services"]["grafana"]["volumes"]:
        source = volume.split(":", 1)[0]
        if source.startswith("./"):
            assert (ROOT / source).is_dir(), source


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="Debian's docker-compose is not installed")
def test_docker_compose_config_validates() -> None:
    result = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "--env-file", ".env.example",
                             "config", "-q"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
