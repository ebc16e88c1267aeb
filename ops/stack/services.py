"""The servers and pipeline processes of the native stack: how each is configured, started and
health-checked. supervisord runs them (`supervision.py`); `manager.py` starts them in order."""
from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from string import Template

from pipeline_core import credentials, paths
from pipeline_core.health import influxdb_ready, mqtt_ready
from pipeline_core.mqtt import CONNECTOR_CLIENT_ID, CONNECTOR_TOPIC_FILTER, open_session
from pipeline_core.settings import DEFAULT_STARTUP_DEADLINE_S, MqttSettings, load_settings
from pipeline_core.logs import READY_MARKER, ready_marker
from pipeline_core.stage_health import Heartbeat, StageHealth, assess, read_heartbeat
from . import certificates, influxdb_users, mqtt_security, security
from .processes import StackError, free_loopback_ports, parent_pid, process_start_ticks, tail_bytes

log = logging.getLogger(__name__)

# Written into a service's log before `up` starts it, so readiness is read from the latest run only.
START_MARKER = "--- stack: starting"
# How much of the end of a pipeline process's log (and of its newest backup) is searched for its READY line.
READY_SCAN_BYTES = 1024 * 1024
# The start groups (Service.start_group): every server at once, then every stage of the pipeline at once.
SERVERS = "servers"
PIPELINE = "pipeline"


def env_port(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise StackError(f"{name}={value!r} is not a port number") from None


def render(template: Path, target: Path, **values: object) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(Template(template.read_text()).substitute({k: str(v) for k, v in values.items()}))
    return target


def require_binary(name: str, package: str) -> str:
    found = shutil.which(name) or next((p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}")
                                        if os.access(p, os.X_OK)), None)
    if not found:
        raise StackError(f"`{name}` is not installed: run `make setup` (it installs Debian's "
                         f"`{package}` package) or `sudo apt-get install {package}`")
    return found


class Service(ABC):
    """One process of the stack. Subclasses say how to configure, start and check it."""

    name: str
    start_deadline_s: float = 30.0
    stop_grace_s: float = 10.0
    # supervisord's startsecs: a process that exits sooner is retried with growing delays.
    startsecs: float = 5.0
    # Services of one group start together, each then waited for, and stop together: the servers need none of
    # each other to start (and a quorum's members need each other: stopped one by one, the last would wait for a
    # quorum that is gone until it is killed), the pipeline's stages only the servers. One by one, each JVM's
    # start would wait for the last one's.
    start_group: str | None = None

    @property
    def state_dir(self) -> Path:
        return paths.STATE_DIR / self.name

    @property
    def log_file(self) -> Path:
        return self.state_dir / f"{self.name}.log"

    @property
    def temp_dir(self) -> Path:
        """The process's temporary files (its TMPDIR, a JVM's java.io.tmpdir): under the state dir, so that what a
        killed process leaves (a JVM's unpacked native libraries, Spark's block manager dirs) goes with `make
        clean` instead of piling up in /tmp."""
        return self.state_dir / "tmp"

    @abstractmethod
    def ports(self) -> dict[str, int]:
        """Ports the service listens on, by role; checked free before start."""

    def bind_host(self, role: str) -> str:
        """The address the service listens on for `role`'s port (0.0.0.0: every address): where `up` checks the
        port is free. This host's loopback unless the service binds what a setting names."""
        return "127.0.0.1"

    @abstractmethod
    def command(self) -> list[str]:
        """The command line supervisord runs."""

    def environment(self) -> dict[str, str]:
        """Environment variables the process gets beyond supervisord's own."""
        return {}

    def prepare(self) -> None:
        """Render config files and initialise storage before the first start; what takes long may go on in the
        background until `await_prepared`."""

    def await_prepared(self) -> None:
        """Wait for what `prepare` left running (several services' at once: `manager.start_together`)."""

    @property
    def setup_id(self) -> str:
        """Services whose `after_ready` is one and the same (the nodes of one cluster) share this id: it runs
        once for them."""
        return self.name

    @abstractmethod
    def is_ready(self, pid: int | None = None) -> bool:
        """A real health check: the service answers its protocol. `pid`: the process supervisord
        runs for it, where the check needs it."""

    def after_ready(self) -> None:
        """Idempotent set-up that needs the running service (topics, databases)."""


# Mosquitto's persistence file in its data folder; a new store has none.
MOSQUITTO_STORE = "mosquitto.db"
PROVISION_DEADLINE_S = 15.0


class Mosquitto(Service):
    name = "mosquitto"
    start_group = SERVERS

    def ports(self) -> dict[str, int]:
        ports = {"mqtt": env_port("MQTT_PORT", 1883)}
        if tls_enabled():
            ports["mqtt-tls"] = env_port("MQTT_TLS_PORT", 8883)
        return ports

    def bind_host(self, role: str) -> str:
        return mqtt_tls_host() if role == "mqtt-tls" else "127.0.0.1"

    @property
    def config_file(self) -> Path:
        return self.state_dir / "mosquitto.conf"

    def prepare(self) -> None:
        (self.state_dir / "data").mkdir(parents=True, exist_ok=True)
        values = credentials.read_credentials()
        tls = tls_files() if tls_enabled() else None
        if tls and not values:
            raise StackError("STACK_TLS=on opens Mosquitto to other hosts: it needs a secure stack "
                             "(`make up SECURITY=on`)")
        ports = self.ports()
        security_lines = mqtt_security.security_config(values, self.state_dir)
        render(paths.MQTT_BROKER_DIR / "mosquitto.conf", self.config_file,
               port=ports["mqtt"], data_dir=self.state_dir / "data", user=_current_user(), security=security_lines,
               tls_listener=mqtt_security.tls_listener_config(ports.get("mqtt-tls", 0), mqtt_tls_host(), tls))
        if not (self.state_dir / "data" / MOSQUITTO_STORE).exists():
            self._provision_connector_session(values, security_lines)

    def _provision_connector_session(self, values: dict[str, str], security_lines: str) -> None:
        """Give a new store (a first start, a host replaced with an empty disk) the stream connector's persistent
        session before any device can connect. Without it a device that reconnects first publishes to a broker
        that has no subscriber yet, which acknowledges its rows and drops them (seen: a row lost when Mosquitto's
        host was replaced). A broker of this store alone, on a loopback port no device knows, takes the
        connector's subscription and saves it as it stops; the real start loads it."""
        (port,) = free_loopback_ports(1)
        config = self.state_dir / "mosquitto-provision.conf"
        render(paths.MQTT_BROKER_DIR / "mosquitto.conf", config, port=port, data_dir=self.state_dir / "data",
               user=_current_user(), security=security_lines, tls_listener="")
        broker = subprocess.Popen([require_binary("mosquitto", "mosquitto"), "-c", str(config)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + PROVISION_DEADLINE_S
            while not mqtt_ready("127.0.0.1", port, refusal_counts=bool(values)):
                if broker.poll() is not None or time.monotonic() > deadline:
                    raise StackError(f"Mosquitto did not start to provision the connector's session: see {config}")
                time.sleep(0.05)
            environ = {**(credentials.environment("stream-connector", values) if values else {}),
                       "MQTT_HOST": "127.0.0.1", "MQTT_PORT": str(port)}
            environ.pop("MQTT_TLS_CA_FILE", None)
            settings = load_settings(MqttSettings, [], environ=environ)
            client_id = os.environ.get("STREAM_CONNECTOR_CLIENT_ID") or CONNECTOR_CLIENT_ID
            topic_filters = os.environ.get("STREAM_CONNECTOR_TOPIC_FILTERS") or CONNECTOR_TOPIC_FILTER
            for topic_filter in filter(None, (part.strip() for part in topic_filters.split(","))):
                open_session(settings, client_id, topic_filter)
        finally:
            broker.terminate()  # Mosquitto saves its store as it stops
            broker.wait(timeout=30)
            config.unlink(missing_ok=True)
        if not (self.state_dir / "data" / MOSQUITTO_STORE).exists():
            raise StackError("Mosquitto saved no store with the connector's session")
        log.info("mosquitto: a new store, given the stream connector's session (%s)", client_id)

    def command(self) -> list[str]:
        return [require_binary("mosquitto", "mosquitto"), "-c", str(self.config_file)]

    def is_ready(self, pid: int | None = None) -> bool:
        return mqtt_ready("127.0.0.1", self.ports()["mqtt"], refusal_counts=credentials.is_secure())


# How long formatting a Kafka node's storage (a JVM run of StorageTool) may take.
FORMAT_DEADLINE_S = 120.0


@dataclass(frozen=True)
class _Formatting:
    """A Kafka node's storage being formatted: the StorageTool's process, the file it reads its arguments from
    (deleted once it is done), and the marker to write once it formatted with SCRAM users (None: not secure)."""
    process: subprocess.Popen
    argument_file: Path
    scram_marker: Path | None


class Kafka(Service):
    name = "kafka"
    start_group = SERVERS
    # The JVM's start and the KRaft controller's activation: a restart under a loaded 2-core host took over 60 s.
    start_deadline_s = 120.0
    stop_grace_s = 30.0
    startsecs = 10.0  # a bad config or a taken port ends the JVM a few seconds in
    default_heap = "-Xms256m -Xmx1g"  # KAFKA_HEAP_OPTS overrides it
    _formatting: _Formatting | None = None

    def ports(self) -> dict[str, int]:
        return {"kafka": env_port("KAFKA_PORT", 9092),
                "controller": env_port("KAFKA_CONTROLLER_PORT", 9093)}

    @property
    def config_file(self) -> Path:
        return self.state_dir / "server.properties"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.ports()['kafka']}"

    def _java(self) -> list[str]:
        return java_with_kafka_jars()

    def server_properties(self, values: dict[str, str]) -> str:
        """The node's server.properties for the stack's credentials `values` (empty: not secure)."""
        ports = self.ports()
        tls = security.node_tls(values, self.name, ["127.0.0.1", "localhost"]) if values else None
        return Template((paths.KAFKA_DIR / "server.properties").read_text()).substitute(
            port=ports["kafka"], controller_port=ports["controller"], data_dir=self.state_dir / "data",
            client_protocol=security.listener_protocol(values) if values else "PLAINTEXT",
            controller_protocol=security.controller_protocol(values),
            security=security.kafka_node_security_properties(values, tls) if values else "")

    def storage_cluster_id(self) -> str:
        """The id the storage is formatted with: a new one for the single node."""
        return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")

    def prepare(self) -> None:
        data_dir = self.state_dir / "data"
        self.temp_dir.mkdir(parents=True, exist_ok=True)  # the format command's JVM uses it too
        values = credentials.read_credentials()
        # Owner-only: with security on it holds the admin's passwords.
        security.write_private(self.config_file, self.server_properties(values))
        scram_marker = self.state_dir / "scram-bootstrapped"
        if (data_dir / "meta.properties").exists():
            if values and not scram_marker.exists():
                raise StackError(f"{self.name}'s storage was formatted without authentication, so it has no admin "
                                 "user: `make clean` (deletes every topic), then `make up` with security on")
            return
        # `=`: a URL-safe id may start with '-', which would otherwise read as a flag (1 start in 64).
        arguments = ["kafka.tools.StorageTool", "format", f"--cluster-id={self.storage_cluster_id()}", "--config",
                     str(self.config_file), *(security.kafka_storage_scram_arguments(values) if values else [])]
        # The java launcher reads the main class and its arguments from the file: the admin's password stays off
        # the command line.
        argument_file = security.write_private(self.state_dir / "format.args", "\n".join(arguments) + "\n")
        # In the background: a cluster's nodes format at once, a JVM's start each (`await_prepared`).
        self._formatting = _Formatting(
            subprocess.Popen([*self._java(), *self._jvm_flags(), f"@{argument_file}"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True),
            argument_file, scram_marker if values else None)

    def await_prepared(self) -> None:
        formatting, self._formatting = self._formatting, None
        if formatting is None:
            return
        try:
            output, _ = formatting.process.communicate(timeout=FORMAT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            formatting.process.kill()
            formatting.process.communicate()
            raise StackError(f"formatting the KRaft storage of {self.name} took more than {FORMAT_DEADLINE_S:.0f} s")
        finally:
            formatting.argument_file.unlink(missing_ok=True)
        if formatting.process.returncode != 0:
            raise StackError(f"formatting the KRaft storage of {self.name} failed:\n{output}")
        if formatting.scram_marker is not None:
            formatting.scram_marker.touch()

    def _jvm_flags(self) -> list[str]:
        heap = os.environ.get("KAFKA_HEAP_OPTS", self.default_heap).split()
        return [*heap, "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={paths.KAFKA_DIR / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.state_dir}", f"-Djava.io.tmpdir={self.temp_dir}"]

    def command(self) -> list[str]:
        return [*self._java(), *self._jvm_flags(), "kafka.Kafka", str(self.config_file)]

    def is_ready(self, pid: int | None = None) -> bool:
        from pipeline_core.kafka_clients import kafka_ready
        client_security = security.client_security()
        # A SASL (and TLS) handshake with a just started JVM takes longer than a plain metadata request.
        return kafka_ready(self.bootstrap_servers, timeout=3.0 if client_security else 1.0, security=client_security)

    def after_ready(self) -> None:
        ensure_topics_and_principals(self.bootstrap_servers)


def java_with_kafka_jars() -> list[str]:
    """`java -cp <Kafka's jars>`: how Kafka and the stack's Java tools run."""
    java = shutil.which("java")
    if not java:
        raise StackError("Java is missing: Kafka needs Java 17 or newer "
                         "(`sudo apt-get install openjdk-17-jre-headless`)")
    if not any(paths.KAFKA_LIBS.glob("kafka_2.13-*.jar")):
        raise StackError(f"Kafka's jars are not in {paths.KAFKA_LIBS}: run `make setup`")
    return [java, "-cp", f"{paths.KAFKA_LIBS}/*"]


def ensure_topics_and_principals(bootstrap_servers: str) -> None:
    """As admin: the topics the stages are set to use, and when the stack is secure its Kafka users and ACLs."""
    from pipeline_core.kafka_clients import admin_client
    from pipeline_core.topics import configured_topics, ensure_topics
    from .kafka_acls import ensure_kafka_principals
    admin = admin_client(bootstrap_servers, **security.client_security())
    ensure_topics(admin, configured_topics())
    if credentials.is_secure():
        ensure_kafka_principals(admin, credentials.read_credentials())


class InfluxDB(Service):
    name = "influxdb"
    start_group = SERVERS

    def ports(self) -> dict[str, int]:
        return {"http": env_port("INFLUXDB_PORT", 8086), "rpc": env_port("INFLUXDB_RPC_PORT", 8088)}

    def bind_host(self, role: str) -> str:
        """HTTP: INFLUXDB_BIND_HOST (this host's loopback by default). The RPC port, which asks no credentials,
        stays on loopback whatever it says (influxdb.conf)."""
        if role != "http":
            return "127.0.0.1"
        return os.environ.get("INFLUXDB_BIND_HOST", "").strip() or "127.0.0.1"

    @property
    def config_file(self) -> Path:
        return self.state_dir / "influxdb.conf"

    def prepare(self) -> None:
        ports = self.ports()
        https = {"https_enabled": "false", "https_certificate": "", "https_private_key": ""}
        if influxdb_tls_ca() is not None:
            files = certificates.ensure_server_certificate("influxdb", [
                "127.0.0.1", "localhost", socket.gethostname(), os.environ.get("INFLUXDB_HOST", ""),
                self.bind_host("http")])
            https = {"https_enabled": "true", "https_certificate": files.certificate, "https_private_key": files.key}
        render(paths.INFLUXDB_GRAFANA_DIR / "influxdb.conf", self.config_file,
               port=ports["http"], rpc_port=ports["rpc"], data_dir=self.state_dir / "data",
               bind_host=self.bind_host("http"), auth_enabled=str(credentials.is_secure()).lower(), **https)

    def command(self) -> list[str]:
        return [require_binary("influxd", "influxdb"), "-config", str(self.config_file)]

    def is_ready(self, pid: int | None = None) -> bool:
        return influxdb_ready(self.ports()["http"], self.bind_host("http"), ca_file=influxdb_tls_ca())

    def after_ready(self) -> None:
        from pipeline_core.influx_retention import RetentionSettings, provision
        from pipeline_core.settings import InfluxSettings, load_settings
        settings = load_settings(InfluxSettings, [])
        influxdb_users.ensure_database_and_users(settings, credentials.read_credentials())
        # As the admin that ensure_database_and_users made: only an admin creates policies and queries.
        provision(load_settings(RetentionSettings, [], environ=credentials.environ_for("admin")))


class PipelineProcess(Service):
    """A Python stage of the pipeline, run as `python -m <module>`; ready when the running process
    has logged READY (with its PID: a restarted process is not ready on its predecessor's word). Once seen,
    that is recorded with the process's start time, so a log rotated since still finds it ready. Once
    ready, its health is its heartbeat's (`progress_file`, judged by `pipeline_core.stage_health`)."""

    start_group = PIPELINE
    # Whether its heartbeat and its READY line are written by a child of the process supervisord runs (spark-submit's
    # Python driver).
    heartbeat_of_child = False

    # As long as the stage itself waits for Kafka at start (KAFKA_STARTUP_DEADLINE_S): a new cluster on a busy
    # machine took over 30 s to answer its first admin and transactional requests (coordinators loading), and `up`
    # gave up on a stage that was about to be ready. A stage that fails exits, which `up` notices at once.
    def __init__(self, name: str, module: str, *args: str, start_deadline_s: float = DEFAULT_STARTUP_DEADLINE_S,
                 stop_grace_s: float = 10.0, startsecs: float = 5.0, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.module = module
        self.args = args
        self.env = env or {}
        self.start_deadline_s = start_deadline_s
        self.stop_grace_s = stop_grace_s
        self.startsecs = startsecs

    def ports(self) -> dict[str, int]:
        return {}

    @property
    def progress_file(self) -> Path:
        return self.state_dir / "progress.json"

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, "--progress-file", str(self.progress_file), *self.args]

    def stage_health(self, pid: int | None, now: float) -> StageHealth:
        """Its health by the heartbeat of the process `pid` (a predecessor's heartbeat says nothing of it)."""
        return assess(heartbeat_of(self.progress_file, pid, self.heartbeat_of_child), now)

    @property
    def ready_record(self) -> Path:
        """Which process was seen ready (PID and start time): its READY line may rotate out of the log."""
        return self.state_dir / "ready"

    def environment(self) -> dict[str, str]:
        return dict(self.env)

    def is_ready(self, pid: int | None = None) -> bool:
        if pid is None:
            return False
        started = process_start_ticks(pid)
        identity = f"{pid} {started}"
        try:
            if self.ready_record.read_text() == identity:
                return True
        except OSError:
            pass
        if started is None or not self._logged_ready(pid):
            return False
        self.ready_record.write_text(identity)
        return True

    def _logged_ready(self, pid: int) -> bool:
        """The READY line of `pid` (with `heartbeat_of_child`: of a child of `pid`) after the latest START_MARKER, in
        the end of the log and of its newest backup (supervisord rotates the log; only a bounded tail of each is
        read)."""
        text = ""
        for log in (self.log_file, self.log_file.with_name(self.log_file.name + ".1")):
            try:
                text = tail_bytes(log, READY_SCAN_BYTES).decode(errors="replace") + text
            except OSError:
                continue
            if START_MARKER in text:
                break
        latest_run = text.rsplit(START_MARKER, 1)[-1]
        if not self.heartbeat_of_child:
            return ready_marker(pid) in latest_run
        return any(parent_pid(int(child)) == pid for child in re.findall(rf"{READY_MARKER} pid=(\d+):", latest_run))


def heartbeat_of(progress_file: Path, pid: int | None, of_child: bool = False) -> Heartbeat | None:
    """The heartbeat in `progress_file` when the process `pid` wrote it (`of_child`: a child of it did), else None:
    a predecessor's heartbeat says nothing of the process that runs now."""
    heartbeat = read_heartbeat(progress_file)
    if heartbeat is None or pid is None:
        return None
    writer = parent_pid(heartbeat.pid) if of_child else heartbeat.pid
    return heartbeat if writer == pid else None


def influxdb_tls_ca() -> Path | None:
    """The CA InfluxDB's HTTPS certificate comes from, when the stack's credentials name one (TOPOLOGY=hosts):
    InfluxDB then takes HTTPS only."""
    ca_file = credentials.read_credentials().get(credentials.INFLUXDB_TLS_CA_KEY)
    return Path(ca_file) if ca_file else None


def tls_enabled() -> bool:
    """STACK_TLS=on or the cluster topology: listeners for other hosts, with TLS (a secure stack only)."""
    return security.tls_requested()


# Addresses a listener binds to mean every address of the host: no name of its own.
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]", "*")


def mqtt_tls_host() -> str:
    """The address Mosquitto's TLS listener binds: MQTT_TLS_HOST, every address by default."""
    return os.environ.get("MQTT_TLS_HOST", "").strip() or "0.0.0.0"


def _mosquitto_declared_hosts() -> list[str]:
    """What the settings name Mosquitto by: the address its TLS listener binds (MQTT_TLS_HOST) and the host clients
    are told to reach it by (MQTT_HOST)."""
    return [mqtt_tls_host(), os.environ.get("MQTT_HOST", "")]


def mosquitto_certificate_hosts() -> list[str]:
    """The names and addresses Mosquitto's certificate is made for: this host's loopback and name and what the
    settings name it by, wildcards left out; `certificates` adds TLS_EXTRA_HOSTNAMES."""
    hosts = ["127.0.0.1", "localhost", socket.gethostname(), *_mosquitto_declared_hosts()]
    return [host for host in dict.fromkeys(host.strip() for host in hosts) if host not in WILDCARD_HOSTS]


def tls_files() -> mqtt_security.TlsFiles:
    """Mosquitto's certificate, key and CA (PEM) for its TLS listener: STACK_TLS_CERT_FILE,
    STACK_TLS_KEY_FILE, STACK_TLS_CA_FILE, by default the stack's own in its state dir's `tls/` (made on first use
    for `mosquitto_certificate_hosts()`, and made again when one of them is missing)."""
    if "STACK_TLS_CERT_FILE" not in os.environ:
        certificates.ensure_server_certificate("mosquitto", mosquitto_certificate_hosts())
    else:
        _say_missing_names(Path(os.environ["STACK_TLS_CERT_FILE"]))
    default = certificates.tls_dir()
    return mqtt_security.TlsFiles(
        Path(os.environ.get("STACK_TLS_CERT_FILE", default / "mosquitto.pem")),
        Path(os.environ.get("STACK_TLS_KEY_FILE", default / "mosquitto-key.pem")),
        Path(os.environ.get("STACK_TLS_CA_FILE", default / "ca.pem")))


def _say_missing_names(given: Path) -> None:
    """A certificate given to Mosquitto (STACK_TLS_CERT_FILE) is used as it is: the names the settings declare for it
    (MQTT_HOST, MQTT_TLS_HOST, TLS_EXTRA_HOSTNAMES) that it lacks are logged, as clients reaching it by them refuse
    it."""
    if not given.is_file():
        return  # the TLS listener's configuration says so
    declared = [host.strip() for host in (*_mosquitto_declared_hosts(), *certificates.extra_hostnames())]
    names = certificates.certificate_names(given)
    missing = [host for host in dict.fromkeys(declared) if host not in WILDCARD_HOSTS and host not in names]
    if missing:
        log.warning("%s (STACK_TLS_CERT_FILE) is not valid for %s: clients reaching Mosquitto by these names will "
                    "refuse it", given, ", ".join(missing))


def _current_user() -> str:
    import pwd
    return pwd.getpwuid(os.getuid()).pw_name
