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


def pipeline_module(service: dict) -> str | None:
    """The module a pipeline stage's container runs (`python -m MODULE`); None for other services."""
    command = service.get("command")
    if not isinstance(command, list) or "-m" not in command:
        return None
    return command[command.index("-m") + 1]


def test_the_spark_joiner_runs_by_default_and_the_standalone_joiner_only_with_its_profile() -> None:
    services = COMPOSE["services"]
    joiners = {name: service for name, service in services.items()
               if pipeline_module(service) in {"spark_joiner", "kafka_joiner"}}
    assert {pipeline_module(service) for name, service in joiners.items()
            if not service.get("profiles")} == {"spark_joiner"}, "one joiner by default, and it is Spark's"
    assert joiners["lsb-joiner"]["profiles"] == ["lsb"]
    assert pipeline_module(joiners["lsb-joiner"]) == "kafka_joiner"
    # As the native stack runs it: the connector writes each thing to one partition.
    assert "--input-partitioned-by-thing" in joiners["lsb-joiner"]["command"]
    # Only profiles that pick a joiner: nothing else is left out of a plain `docker compose up`.
    assert all(not service.get("profiles") for name, service in services.items() if name not in joiners)


def test_make_up_runs_exactly_one_joiner_with_either_choice() -> None:
    """`make up` (Spark) and `make up JOINER=lsb` each scale the other joiner to zero, so switching stops it."""
    for joiner, other in (("spark", "lsb-joiner"), ("lsb", "spark-joiner")):
        dry_run = subprocess.run(["make", "-n", "up", "STACK=docker", f"JOINER={joiner}"], cwd=ROOT,
                                 capture_output=True, text=True)
        assert dry_run.returncode == 0, dry_run.stderr
        compose_up = next(line for line in dry_run.stdout.splitlines() if line.startswith("docker compose"))
        assert "--profile lsb" in compose_up and f"--scale {other}=0" in compose_up, compose_up


def test_the_spark_joiner_has_java_its_jars_and_a_lasting_checkpoint() -> None:
    spark = COMPOSE["services"]["spark-joiner"]
    dockerfile = (ROOT / spark["build"]["context"] / spark["build"]["dockerfile"]).read_text()
    assert "jre-headless" in dockerfile
    environment = spark["environment"]
    assert environment["STACK_CACHE_DIR"] == "/app/.cache"  # where `make setup` puts the Kafka connector jars
    assert (ROOT / environment["SPARK_CONF_DIR"].removeprefix("/app/") / "log4j2.properties").is_file()
    checkpoint = environment["SPARK_JOINER_CHECKPOINT_DIR"]
    volume = next(v for v in spark["volumes"] if v.endswith(f":{checkpoint}"))
    assert volume.split(":", 1)[0] in COMPOSE["volumes"]  # a named volume: a new container resumes the job


def test_each_stage_is_health_probed_by_its_own_module() -> None:
    stages = {name: service for name, service in COMPOSE["services"].items() if pipeline_module(service)}
    assert {"stream-connector", "spark-joiner", "lsb-joiner", "db-connector"} <= stages.keys()
    for name, service in stages.items():
        probe = service["healthcheck"]["test"][-1]
        assert probe.endswith(f"stack.health_probe {pipeline_module(service)}"), (name, probe)
