"""The Compose file for users with Docker: `docker-compose config` accepts both topologies, every service
is runnable, health-checked and restarted, and it is secure as docs/security.md says: no secret written
into it or on a command line, non-root containers, no writable checkout mount, TLS wherever a listener
crosses hosts, `make up` refusing placeholder secrets. The cluster profile replicates as production Kafka does."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from pipeline_core import credentials
from stack import provision

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict] = COMPOSE["services"]
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|API_KEY", re.IGNORECASE)
FROM_ENV = re.compile(r"^\$\{[A-Z0-9_]+(:?[-?][^}]*)?\}$")
# The profiles `make up` enables for each topology (Makefile, COMPOSE_UP).
TOPOLOGIES = {"single": {"single", "lsb"}, "cluster": {"cluster"}}
# Run once by make (`docker compose --profile tools run --rm`), never by `up`: no healthcheck, no restart.
TOOLS = {name for name, service in SERVICES.items() if service.get("profiles") == ["tools"]}
RUNNING = {name: service for name, service in SERVICES.items() if name not in TOOLS}
# Services that run as root, and why.
ROOT_JUSTIFIED = {"influxdb": "the influxdb:1.8 image keeps its data in a root-owned directory"}


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "ops" / "compose" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


env_file = load_script("env_file")
certificates = load_script("certificates")


def active(topology: str) -> dict[str, dict]:
    """The services Compose starts for a topology: those of no profile and those of its profiles."""
    return {name: service for name, service in SERVICES.items()
            if not service.get("profiles") or set(service["profiles"]) & TOPOLOGIES[topology]}


# Compose v2 as the Makefile runs it where Docker's plugin is installed (this host may have none: the commands are
# only printed).
COMPOSE_V2 = "COMPOSE=docker compose"


def outside_make() -> dict[str, str]:
    """This environment without what a calling make (`make test`) passes down: a sub-make would otherwise take
    its flags and variables."""
    return {name: value for name, value in os.environ.items() if name not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}


def command_words(service: dict) -> str:
    """Everything a service runs as a command line: entrypoint, command and healthcheck."""
    parts = [service.get("entrypoint"), service.get("command"), service.get("healthcheck", {}).get("test")]
    return " ".join(" ".join(part) if isinstance(part, list) else str(part) for part in parts if part)


def test_every_service_has_an_image_or_build_and_a_healthcheck() -> None:
    assert {"mosquitto", "influxdb", "grafana"} <= SERVICES.keys()
    assert TOOLS == {"simulator", "report", "history"}
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name
    for name, service in RUNNING.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


def test_every_service_is_restarted_when_it_exits() -> None:
    """All services run for good (the setup jobs stay up as the stages' readiness gate): a crash
    restarts it, as supervisord restarts the native processes; `docker compose stop` still stops it."""
    for name, service in RUNNING.items():
        assert service.get("restart") in ("unless-stopped", "always"), f"{name} has no restart policy"
    for name in TOOLS:
        assert SERVICES[name]["restart"] == "no", name


def test_every_service_has_the_time_its_clean_stop_takes() -> None:
    """`docker compose stop` waits a service's stop_grace_period before SIGKILL: a stage needs its 30 s of
    --shutdown-timeout-s (what is in flight confirmed by Kafka), a Kafka node its controlled shutdown."""
    def seconds(period: str) -> int:
        return int(period.removesuffix("s"))

    for name, service in RUNNING.items():
        if service.get("build") or service.get("image") == "machine-data-pipeline":
            assert seconds(service["stop_grace_period"]) > 30, name
        if "kafka" in str(service.get("image")):
            assert seconds(service["stop_grace_period"]) >= 60, name
    assert seconds(SERVICES["influxdb"]["stop_grace_period"]) >= 30


def test_dependencies_wait_for_health() -> None:
    for name, service in SERVICES.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert condition == {"condition": "service_healthy"}, (name, dependency)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_each_topology_is_a_whole_pipeline_that_depends_only_on_its_own_services(topology: str) -> None:
    services = active(topology)
    modules = {pipeline_module(service) for service in services.values()}
    assert {"stream_connector", "spark_joiner", "db_connector"} <= modules, modules
    assert {"mosquitto", "influxdb", "grafana"} <= services.keys()
    for name, service in services.items():
        assert set(service.get("depends_on") or {}) <= services.keys(), f"{name} waits for a service not started"


def test_no_secret_is_hard_coded() -> None:
    for name, service in SERVICES.items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):
                assert FROM_ENV.match(str(value)), f"{name}: {key} must come from .env, not {value!r}"


def test_no_secret_reaches_a_command_line() -> None:
    """Secrets reach containers as environment variables only; commands and healthchecks (visible in
    `ps` and `docker inspect`) name none, nor pass a password flag."""
    for name, service in SERVICES.items():
        words = command_words(service)
        assert not SECRET_NAME.search(words), f"{name} runs a secret on a command line: {words}"
        assert not re.search(r"(^|\s)(-P|-?-password)\s", words), f"{name}: {words}"


def test_env_example_names_every_variable_and_env_and_certificates_are_ignored() -> None:
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)", (ROOT / "docker-compose.yml").read_text()))
    example = credentials.parse((ROOT / ".env.example").read_text())
    assert referenced <= example.keys()
    assert set(credentials.password_keys()) <= example.keys()
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert ".env" in ignored and ".certs/" in ignored


def test_every_service_runs_as_an_unprivileged_user_or_says_why() -> None:
    for name, service in SERVICES.items():
        if name in ROOT_JUSTIFIED:
            assert "user" not in service
            continue
        user = str(service.get("user", "0")).split(":")[0]
        assert user not in ("0", "root"), f"{name} runs as root"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^USER 10001", dockerfile, re.MULTILINE)
    # The image built from the checkout holds no secret, certificate or local state.
    assert {".env", ".certs", ".stack", ".venv"} <= set((ROOT / ".dockerignore").read_text().splitlines())


def test_nothing_mounts_the_checkout_or_env_writable() -> None:
    """Bind mounts are single files or directories of configuration and certificates, read-only; the
    pipeline's code comes from the image built from the checkout."""
    for name, service in SERVICES.items():
        for volume in service.get("volumes") or []:
            source, *_ = volume.split(":")
            if source.startswith("."):
                assert source not in (".", "./", "./.env"), f"{name} mounts {source}"
                if (name, source) == ("report", "./reports"):
                    continue  # the one writable mount: where `make report` puts its PNG files, as the host's user
                assert volume.endswith(":ro"), f"{name} mounts {source} writable"
                assert (ROOT / source).exists() or source.startswith("./.certs"), source


def kafka_listeners() -> dict[str, str]:
    script = (ROOT / "ops" / "compose" / "kafka-start.sh").read_text()
    protocol_map = re.search(r"^listener\.security\.protocol\.map=(.+)$", script, re.MULTILINE).group(1)
    return dict(entry.split(":") for entry in protocol_map.split(","))


def test_every_listener_that_crosses_hosts_is_tls() -> None:
    # Kafka: every listener, between nodes too (client certificates), and SCRAM for clients.
    listeners = kafka_listeners()
    assert set(listeners.values()) <= {"SSL", "SASL_SSL"}, listeners
    assert listeners["CLIENT"] == listeners["HOST"] == "SASL_SSL"
    script = (ROOT / "ops" / "compose" / "kafka-start.sh").read_text()
    assert "listener.name.broker.ssl.client.auth=required" in script
    assert "listener.name.controller.ssl.client.auth=required" in script
    assert "allow.everyone.if.no.acl.found=false" in script
    # Mosquitto: every listener not on the container's own loopback has a certificate.
    conf = (ROOT / "02_mqtt_broker" / "mosquitto.docker.conf").read_text()
    assert "allow_anonymous false" in conf and "acl_file" in conf
    for block in re.split(r"^(?=listener )", conf, flags=re.MULTILINE)[1:]:
        if not block.startswith("listener 1883 127.0.0.1"):
            assert "certfile" in block and "keyfile" in block, block
    assert SERVICES["mosquitto"]["ports"] == ["127.0.0.1:8883:8883"]
    # The stages speak TLS to both.
    for name, service in SERVICES.items():
        environment = service.get("environment") or {}
        if "KAFKA_BOOTSTRAP_SERVERS" in environment:
            assert environment["KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", name
        if "MQTT_HOST" in environment:
            assert environment["MQTT_PORT"] == "8883" and environment["MQTT_TLS_CA_FILE"], name


def test_devices_may_only_publish_states_and_only_the_connector_subscribes() -> None:
    acl = (ROOT / "ops" / "compose" / "mosquitto.acl").read_text()
    rules: dict[str, list[str]] = {}
    for line in acl.splitlines():
        if line.startswith("user "):
            user = line.split()[1]
        elif line.startswith("topic "):
            rules.setdefault(user, []).append(line)
    assert rules["device"] == ["topic write machine/states/#", "topic read $SYS/broker/uptime"]
    assert rules["stream-connector"] == ["topic read machine/states/#"]


def test_the_cluster_replicates_as_production_kafka_does() -> None:
    nodes = {name: service for name, service in active("cluster").items() if service.get("image", "").startswith("apache/kafka")}
    assert sorted(nodes) == ["kafka-1", "kafka-2", "kafka-3"]
    voters = {f"{node['environment']['NODE_ID']}@{node['hostname']}:9093" for node in nodes.values()}
    for name, node in nodes.items():
        environment = node["environment"]
        assert environment["REPLICATION_FACTOR"] == "3" and environment["MIN_INSYNC_REPLICAS"] == "2", name
        assert set(environment["QUORUM_VOTERS"].split(",")) == voters
        # Advertised as the host name other hosts reach it by, which is its service name here.
        assert environment["ADVERTISED_HOST"] == node["hostname"] == name
    assert len({node["environment"]["CLUSTER_ID"] for node in nodes.values()}) == 1
    script = (ROOT / "ops" / "compose" / "kafka-start.sh").read_text()
    for setting in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                    "default.replication.factor", "share.coordinator.state.topic.replication.factor"):
        assert f"{setting}=${{REPLICATION_FACTOR}}" in script, setting
    for setting in ("min.insync.replicas", "transaction.state.log.min.isr"):
        assert f"{setting}=${{MIN_INSYNC_REPLICAS}}" in script, setting


def test_the_cluster_submits_the_spark_joiner_to_a_master_and_two_workers() -> None:
    cluster = active("cluster")
    workers = [service for name, service in cluster.items() if "org.apache.spark.deploy.worker.Worker" in command_words(service)]
    assert len(workers) == 2 and all("spark://spark-master:7077" in worker["command"] for worker in workers)
    assert "org.apache.spark.deploy.master.Master" in cluster["spark-master"]["command"]
    joiner = cluster["cluster-spark-joiner"]["command"]
    assert joiner[joiner.index("--master") + 1] == "spark://spark-master:7077"
    assert joiner[joiner.index("--deploy-mode") + 1] == "client"
    # Under spark-submit the driver's JVM runs before the job: the Kafka connector comes with --jars.
    assert joiner[joiner.index("--jars") + 1] == "/opt/pipeline/.cache/spark/jars/*.jar"
    assert "STACK_CACHE_DIR=/opt/pipeline/.cache" in (ROOT / "Dockerfile").read_text()
    # Executors write the checkpoint: driver and workers mount the same volume there.
    checkpoint = cluster["cluster-spark-joiner"]["environment"]["SPARK_JOINER_CHECKPOINT_DIR"]
    for service in [cluster["cluster-spark-joiner"], *workers]:
        assert f"cluster-spark-checkpoint:{checkpoint}" in service["volumes"]
    db_connectors = [service for service in cluster.values() if pipeline_module(service) == "db_connector"]
    assert len(db_connectors) == 2 and db_connectors[0]["command"] == db_connectors[1]["command"]


def pipeline_module(service: dict) -> str | None:
    """The module a pipeline stage's container runs (`python -m MODULE`, or the Spark joiner under
    spark-submit); None for other services."""
    command = service.get("command")
    if not isinstance(command, list):
        return None
    if "spark-submit" in command:
        return "spark_joiner"
    return command[command.index("-m") + 1] if "-m" in command else None


def test_the_spark_joiner_runs_by_default_and_the_standalone_joiner_only_with_its_profile() -> None:
    joiners = {name: service for name, service in active("single").items()
               if pipeline_module(service) in {"spark_joiner", "kafka_joiner"}}
    assert {pipeline_module(service) for service in joiners.values() if "lsb" not in service["profiles"]} \
        == {"spark_joiner"}, "one joiner by default, and it is Spark's"
    assert joiners["lsb-joiner"]["profiles"] == ["lsb"]
    assert pipeline_module(joiners["lsb-joiner"]) == "kafka_joiner"
    # As the native stack runs it: the connector writes each thing to one partition.
    assert "--input-partitioned-by-thing" in joiners["lsb-joiner"]["command"]


@pytest.mark.parametrize("arguments, compose_up", [
    (["JOINER=spark"], "docker compose --profile single --profile lsb up -d --build --wait --scale lsb-joiner=0"),
    (["JOINER=lsb"], "docker compose --profile single --profile lsb up -d --build --wait --scale spark-joiner=0"),
    (["TOPOLOGY=cluster"], "docker compose --profile cluster up -d --build --wait"),
])
def test_make_up_checks_the_secrets_and_makes_the_certificates_before_compose(arguments: list[str], compose_up: str) -> None:
    """`make up` and `make up JOINER=lsb` each scale the other joiner to zero, so switching stops it."""
    dry_run = subprocess.run(["make", "--no-print-directory", "-n", "up", "STACK=docker", COMPOSE_V2, *arguments], cwd=ROOT,
                             capture_output=True, text=True, env=outside_make())
    assert dry_run.returncode == 0, dry_run.stderr
    lines = dry_run.stdout.splitlines()
    steps = [next(i for i, line in enumerate(lines) if marker in line)
             for marker in ("ops/compose/env_file.py .env", "ops/compose/certificates.py .certs", "docker compose")]
    assert steps == sorted(steps)
    assert lines[steps[-1]] == compose_up


def test_make_up_generates_missing_secrets_and_refuses_placeholders(tmp_path: Path) -> None:
    dotenv = tmp_path / ".env"
    assert env_file.main([str(dotenv)]) == 0
    generated = credentials.read_credentials(dotenv)
    assert stat.S_IMODE(dotenv.stat().st_mode) == 0o600
    assert {*credentials.password_keys(), *env_file.COMPOSE_SECRETS} <= generated.keys()
    assert not env_file.placeholder_keys(generated) and len(set(generated.values())) == len(generated)

    # A key a newer version added is generated; the secrets servers already hold are kept.
    del generated["SPARK_AUTHENTICATE_SECRET"]
    credentials.write_credentials(generated, dotenv)
    again = env_file.ensure_env_file(dotenv)
    assert {key: again[key] for key in generated} == generated and again["SPARK_AUTHENTICATE_SECRET"]

    # A copy of .env.example, or an emptied value, starts nothing and names what to set.
    shutil.copy(ROOT / ".env.example", dotenv)
    with pytest.raises(env_file.PlaceholderError, match="(?s)KAFKA_ADMIN_PASSWORD.*python3 -c"):
        env_file.ensure_env_file(dotenv)
    assert env_file.main([str(dotenv)]) == 1
    credentials.write_credentials({**again, "MQTT_DEVICE_PASSWORD": ""}, dotenv)
    with pytest.raises(env_file.PlaceholderError, match="MQTT_DEVICE_PASSWORD"):
        env_file.ensure_env_file(dotenv)


def test_certificates_are_signed_by_the_generated_ca_for_every_server_name(tmp_path: Path) -> None:
    directory = tmp_path / ".certs"
    certificates.ensure_certificates(directory, ["plant-kafka.example"])
    ca_certificate = (directory / "ca.crt").read_bytes()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "ca.key").stat().st_mode) == 0o600
    for server, (_, hostnames) in certificates.SERVERS.items():
        certificate = directory / server / "server.crt"
        verify = subprocess.run(["openssl", "verify", "-CAfile", str(directory / "ca.crt"), str(certificate)],
                                capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr
        names = subprocess.run(["openssl", "x509", "-in", str(certificate), "-noout", "-ext", "subjectAltName"],
                               capture_output=True, text=True, check=True).stdout
        assert all(f"DNS:{host}" in names for host in [*hostnames, "plant-kafka.example"]), names
        assert (directory / server / "ca.crt").read_bytes() == ca_certificate
    # Kafka's PEM keystore holds its key and certificate.
    keystore = (directory / "kafka" / "server.pem").read_text()
    assert "BEGIN PRIVATE KEY" in keystore and "BEGIN CERTIFICATE" in keystore
    # A second run keeps the CA, so clients go on trusting it.
    certificates.ensure_certificates(directory)
    assert (directory / "ca.crt").read_bytes() == ca_certificate


# The stage names `stack.health_probe` takes, by the module each stage runs.
STAGE_NAMES = {"stream_connector": "stream-connector", "spark_joiner": "spark-joiner", "kafka_joiner": "lsb-joiner",
               "db_connector": "db-connector"}


def test_each_stage_is_health_probed_by_its_progress() -> None:
    """A stage's healthcheck asks `stack.health_probe STAGE` whether the stage made progress (its heartbeat
    in $PROGRESS_FILE, in the container's writable /tmp) within its reporting interval."""
    stages = {name: service for name, service in RUNNING.items() if pipeline_module(service)}
    assert {"stream-connector", "spark-joiner", "lsb-joiner", "db-connector", "cluster-stream-connector",
            "cluster-spark-joiner", "db-connector-1", "db-connector-2"} <= stages.keys()
    for name, service in stages.items():
        probe = service["healthcheck"]["test"][-1]
        assert probe == f"python -m stack.health_probe {STAGE_NAMES[pipeline_module(service)]}", (name, probe)
        assert service["environment"]["PROGRESS_FILE"].startswith("/tmp/"), name


def test_every_container_log_is_bounded() -> None:
    for name, service in SERVICES.items():
        options = service.get("logging", {}).get("options", {})
        assert options.get("max-size") and options.get("max-file"), f"{name} keeps its whole log"


@pytest.mark.parametrize("target, commands", [
    ("up", ["docker build --quiet --tag machine-data-pipeline .",
            'docker run --rm --user "$(id -u):$(id -g)" -v "{root}:/repo" -w /repo machine-data-pipeline '
            "python ops/compose/env_file.py .env",
            'docker run --rm --user "$(id -u):$(id -g)" -v "{root}:/repo" -w /repo machine-data-pipeline '
            "python ops/compose/certificates.py .certs",
            "docker compose --profile single --profile lsb up -d --build --wait --scale lsb-joiner=0",
            'echo "Grafana: http://127.0.0.1:3000 (user admin; its password is GRAFANA_ADMIN_PASSWORD in .env)"']),
    ("data", ["docker compose --profile tools run --rm simulator python -m simulator --ending-now --rate 100 "
              "--limit 50", "docker compose --profile tools run --rm history"]),
    ("status", ["docker compose --profile single --profile lsb --profile cluster --profile tools ps"]),
    ("logs", ["docker compose --profile single --profile lsb --profile cluster --profile tools logs --tail 40 "
              "--follow kafka"]),
    ("restart", ["docker compose --profile single --profile lsb --profile cluster --profile tools restart kafka"]),
    ("report", ["mkdir -p reports", 'docker compose --profile tools run --rm --user "$(id -u):$(id -g)" report']),
    ("down", ["docker compose --profile single --profile lsb --profile cluster --profile tools down"]),
    ("clean", ["docker compose --profile single --profile lsb --profile cluster --profile tools down -v"]),
])
def test_with_docker_every_target_needs_docker_and_make_only(target: str, commands: list[str]) -> None:
    """What each target runs with STACK=docker (`make -n`): Docker's commands, never the host's Python (no
    virtualenv, no `make setup`); `make up` says where Grafana is and where its password is."""
    dry_run = subprocess.run(["make", "--no-print-directory", "-n", target, "STACK=docker", COMPOSE_V2, "SERVICE=kafka",
                              "FOLLOW=1", "RATE=100", "N=50"], cwd=ROOT, capture_output=True, text=True,
                             env=outside_make())
    assert dry_run.returncode == 0, dry_run.stderr
    # Output redirections aside (the image's id, which `docker build --quiet` prints, is no news to a user).
    assert [" ".join(line.split()).replace(" >/dev/null", "") for line in dry_run.stdout.splitlines()] == \
        [command.format(root=ROOT) for command in commands]
    assert ".venv" not in dry_run.stdout and "python3" not in dry_run.stdout


def test_without_compose_v2_a_docker_target_stops_and_says_what_to_install() -> None:
    """Compose v1 cannot run the file (profiles with `up --wait`): STACK=docker then stops before running anything,
    and the automatic choice takes the native stack."""
    dry_run = subprocess.run(["make", "--no-print-directory", "-n", "status", "STACK=docker", "COMPOSE_V2_FOUND="],
                             cwd=ROOT, capture_output=True, text=True, env=outside_make())
    assert dry_run.returncode != 0 and not dry_run.stdout
    assert "needs Docker Compose v2" in dry_run.stderr and "STACK=native" in dry_run.stderr
    chosen = subprocess.run(["make", "--no-print-directory", "-n", "status", "COMPOSE_V2_FOUND="], cwd=ROOT,
                            capture_output=True, text=True,
                            env={name: value for name, value in outside_make().items() if name != "STACK"})
    assert "stack status" in chosen.stdout and "docker" not in chosen.stdout


def test_the_tools_reach_the_servers_as_their_least_privileged_users() -> None:
    simulator, report = SERVICES["simulator"], SERVICES["report"]
    assert simulator["environment"]["MQTT_USERNAME"] == "device"  # may publish states, nothing else
    assert simulator["environment"]["MQTT_PORT"] == "8883" and simulator["environment"]["MQTT_TLS_CA_FILE"]
    assert "simulator-state:/var/lib/simulator" in simulator["volumes"]  # a second replay follows the first
    assert report["environment"]["INFLUXDB_USERNAME"] == "reader"
    # The history of replayed rows: reads raw points and writes the history, which only InfluxDB's admin may do both.
    assert SERVICES["history"]["environment"]["INFLUXDB_USERNAME"] == "admin"
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "/var/lib/simulator" in dockerfile and "fetch_spark_kafka_connector" in dockerfile
    assert ".cache" in (ROOT / ".dockerignore").read_text().splitlines()  # nothing of the host's downloads
    assert "!.cache/spark" not in (ROOT / ".dockerignore").read_text()


@pytest.mark.parametrize("topology", [*TOPOLOGIES, "tools"])
def test_docker_compose_config_accepts_the_topology(topology: str, tmp_path: Path) -> None:
    """The real `docker compose config` (Docker's plugin, or Debian's docker-compose, which `make setup`
    installs where Docker has none) with a generated .env: the file is valid Compose and resolves each
    secret from .env into the environment, never elsewhere."""
    compose = provision.compose_command()
    assert compose, "no Compose is installed: `make setup` installs docker-compose (ops/stack/provision.py)"
    dotenv = tmp_path / ".env"
    secrets = env_file.ensure_env_file(dotenv)
    enabled = TOPOLOGIES.get(topology, {topology})
    profiles = [word for profile in sorted(enabled) for word in ("--profile", profile)]
    result = subprocess.run([*compose, "-f", "docker-compose.yml", "--env-file", str(dotenv), *profiles, "config"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    services = {name: resolved[name] for name in (active(topology) if topology in TOPOLOGIES else TOOLS)}
    reader = services["report" if topology == "tools" else "grafana"]["environment"]
    assert reader[("INFLUXDB_PASSWORD" if topology == "tools" else "INFLUXDB_READER_PASSWORD")] == \
        secrets["INFLUXDB_READER_PASSWORD"]
    for name, service in services.items():
        words = command_words(service)
        assert not any(value in words for value in secrets.values()), f"{name} has a secret on a command line"
        for key, value in (service.get("environment") or {}).items():
            if SECRET_NAME.search(key):
                assert value in secrets.values(), (name, key)
