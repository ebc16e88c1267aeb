"""The Spark standalone cluster of TOPOLOGY=cluster: a master and two workers, run from the pip `pyspark`'s own
`bin/spark-class` (no other download), and what the master's JSON tells of them and of the joiner's application.

Ports and sizes come from Spark's own environment variables where Spark has them (SPARK_MASTER_HOST,
SPARK_MASTER_PORT, SPARK_MASTER_WEBUI_PORT, SPARK_WORKER_CORES, SPARK_WORKER_MEMORY), with per-worker ones for
the two workers on one host (SPARK_WORKER<n>_PORT, SPARK_WORKER<n>_WEBUI_PORT).

The master, the workers, their executors and the joiner's driver authenticate each other (spark.authenticate)
with one secret from the credentials file, given to each in a spark-defaults.conf readable by its owner only."""
from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request
from pathlib import Path

from pipeline_core import credentials, paths
from . import security
from .processes import StackError
from .services import SERVERS, Service, env_port

WORKERS = (1, 2)
WORKERS_GROUP = "spark-workers"
DEFAULT_WORKER_WEBUI_PORTS = {1: 8081, 2: 8082}
# This host has two cores: one per worker, so their executors together use what the host has. On a real
# host, the host's cores and most of its memory.
DEFAULT_WORKER_CORES = "1"
DEFAULT_WORKER_MEMORY = "1g"
DEFAULT_EXECUTOR_MEMORY = "1g"
JSON_TIMEOUT_S = 2.0


def local_ip() -> str:
    """The address Spark's processes bind and advertise (SPARK_LOCAL_IP): this host's loopback by default; on
    several hosts each host's own address."""
    return os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")


def master_host() -> str:
    return os.environ.get("SPARK_MASTER_HOST", local_ip())


def master_port() -> int:
    return env_port("SPARK_MASTER_PORT", 7077)


def master_webui_port() -> int:
    return env_port("SPARK_MASTER_WEBUI_PORT", 8080)


def master_url() -> str:
    return f"spark://{master_host()}:{master_port()}"


def spark_class() -> str:
    """The pip pyspark's `bin/spark-class`."""
    return _spark_script("spark-class")


def spark_submit() -> str:
    """The pip pyspark's `bin/spark-submit`."""
    return _spark_script("spark-submit")


def spark_home() -> Path:
    """The pip pyspark's directory: a Spark distribution's layout (bin/, jars/)."""
    import pyspark
    return Path(pyspark.__file__).parent


def _spark_script(name: str) -> str:
    script = spark_home() / "bin" / name
    if not script.exists():
        raise StackError(f"{script} is missing: reinstall pyspark (`make setup`)")
    if not shutil.which("java"):
        raise StackError("Java is missing: Spark needs Java 17 or newer "
                         "(`sudo apt-get install openjdk-17-jre-headless`)")
    return str(script)


def master_state(timeout_s: float = JSON_TIMEOUT_S) -> dict | None:
    """The master's JSON (its web UI's /json): workers, applications, status; None while it does not answer."""
    return _json(f"http://{master_host()}:{master_webui_port()}/json", timeout_s)


def _json(url: str, timeout_s: float) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.load(response)
    except (OSError, urllib.error.URLError, ValueError):
        return None


def spark_environment() -> dict[str, str]:
    """What Spark's scripts need: where Spark is (else they ask whichever `python3` is first on PATH), and the
    address to bind."""
    return {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": local_ip()}


def authentication_defaults() -> dict[str, str]:
    """spark.authenticate with the cluster's secret (the master and workers read it from their
    spark-defaults.conf, executors get it from their worker), and RPC and block transfers encrypted with keys it
    agrees (spark.network.crypto): across hosts they carry records."""
    secret = credentials.read_credentials().get(security.SPARK_SECRET_KEY)
    if not secret:
        raise StackError(f"{security.SPARK_SECRET_KEY} is missing from {credentials.credentials_file()}: "
                         "`python -m stack up` adds it")
    return {"spark.authenticate": "true", "spark.authenticate.secret": secret, "spark.network.crypto.enabled": "true"}


def write_defaults(conf_dir: Path, defaults: dict[str, str], comment: str) -> Path:
    """`conf_dir`/spark-defaults.conf, readable by its owner only: it holds the secret."""
    return security.write_private(conf_dir / "spark-defaults.conf", f"# {comment}\n"
                                  + "".join(f"{key} {value}\n" for key, value in defaults.items()))


class SparkDaemon(Service):
    """The master or a worker: Spark's environment, and a SPARK_CONF_DIR of its own with the secret."""

    @property
    def conf_dir(self) -> Path:
        return self.state_dir / "conf"

    def defaults(self) -> dict[str, str]:
        return authentication_defaults()

    def prepare(self) -> None:
        write_defaults(self.conf_dir, self.defaults(), f"Rendered by `python -m stack up` for the {self.name}.")

    def environment(self) -> dict[str, str]:
        # The daemon's own temporary files, and a worker's scratch space for its executors, under the state dir.
        return {**spark_environment(), "SPARK_CONF_DIR": str(self.conf_dir),
                "SPARK_DAEMON_JAVA_OPTS": f"-Djava.io.tmpdir={self.temp_dir}", "SPARK_LOCAL_DIRS": str(self.temp_dir)}


class SparkMaster(SparkDaemon):
    name = "spark-master"
    start_group = SERVERS
    start_deadline_s = 120.0
    startsecs = 10.0

    def ports(self) -> dict[str, int]:
        return {"master": master_port(), "ui": master_webui_port()}

    def bind_host(self, role: str) -> str:
        # `--host` for its RPC; a web UI binds SPARK_LOCAL_IP.
        return master_host() if role == "master" else local_ip()

    def defaults(self) -> dict[str, str]:
        # The REST submission server authenticates nobody (and Spark refuses it with spark.authenticate); the joiner
        # is submitted over the authenticated RPC.
        return {**authentication_defaults(), "spark.master.rest.enabled": "false"}

    def command(self) -> list[str]:
        return [spark_class(), "org.apache.spark.deploy.master.Master", "--host", master_host(),
                "--port", str(master_port()), "--webui-port", str(master_webui_port())]

    def is_ready(self, pid: int | None = None) -> bool:
        state = master_state()
        return bool(state) and state.get("status") == "ALIVE"


class SparkWorker(SparkDaemon):
    """Worker `index`: it registers with the master and runs the executors the master gives it, in a work
    dir of its own under the state dir (the default lies inside site-packages)."""

    # After the master: a worker that finds no master tries again only 5-15 s later.
    start_group = WORKERS_GROUP
    start_deadline_s = 120.0
    startsecs = 10.0

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"spark-worker-{index}"

    def ports(self) -> dict[str, int]:
        ports = {"ui": env_port(f"SPARK_WORKER{self.index}_WEBUI_PORT", DEFAULT_WORKER_WEBUI_PORTS[self.index])}
        worker_port = env_port(f"SPARK_WORKER{self.index}_PORT", 0)  # 0: any free port, as Spark's default
        return {"worker": worker_port, **ports} if worker_port else ports

    def bind_host(self, role: str) -> str:
        return local_ip()  # `--host` and SPARK_LOCAL_IP

    @property
    def work_dir(self) -> Path:
        return self.state_dir / "work"

    def prepare(self) -> None:
        super().prepare()
        self.work_dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        ports = self.ports()
        return [spark_class(), "org.apache.spark.deploy.worker.Worker", master_url(), "--host", local_ip(),
                "--port", str(ports.get("worker", 0)), "--webui-port", str(ports["ui"]),
                "--cores", os.environ.get("SPARK_WORKER_CORES", DEFAULT_WORKER_CORES),
                "--memory", os.environ.get("SPARK_WORKER_MEMORY", DEFAULT_WORKER_MEMORY),
                "--work-dir", str(self.work_dir)]

    def is_ready(self, pid: int | None = None) -> bool:
        """The master lists this worker (by its web UI's port) ALIVE."""
        return self.registration() is not None

    def registration(self) -> dict | None:
        """The master's entry of this worker while it lists it ALIVE (by its web UI's port)."""
        state = master_state() or {}
        suffix = f":{self.ports()['ui']}"
        return next((worker for worker in state.get("workers", [])
                     if worker.get("state") == "ALIVE" and str(worker.get("webuiaddress", "")).endswith(suffix)),
                    None)


def running_application() -> str | None:
    """The id of the application the master runs (the Spark joiner's), if one runs."""
    state = master_state() or {}
    return next((app.get("id") for app in state.get("activeapps", []) if app.get("state") == "RUNNING"), None)


def executors_on(worker: SparkWorker, application: str) -> int:
    """How many executors of `application` the worker runs now, as its own JSON says (0 while it is not ALIVE)."""
    registration = worker.registration()
    if registration is None:
        return 0
    state = _json(f"{registration.get('webuiaddress')}/json", JSON_TIMEOUT_S) or {}
    return sum(executor.get("appid") == application for executor in state.get("executors", []))


def joiner_conf_dir() -> Path:
    """SPARK_CONF_DIR of the joiner's driver on the cluster: the joiner's log4j2.properties and a
    spark-defaults.conf with the cluster's ports and executor sizes."""
    return paths.STATE_DIR / "spark-joiner" / "conf"


def render_joiner_conf() -> Path:
    conf_dir = joiner_conf_dir()
    conf_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths.REPO_ROOT / "06_spark_joiner" / "conf" / "log4j2.properties",
                    conf_dir / "log4j2.properties")
    defaults = {
        "spark.master": master_url(),
        "spark.submit.deployMode": "client",
        "spark.executor.memory": os.environ.get("SPARK_EXECUTOR_MEMORY", DEFAULT_EXECUTOR_MEMORY),
        # The driver's ports, which the executors connect back to; 0: any free port.
        "spark.driver.port": str(env_port("SPARK_DRIVER_PORT", 0)),
        "spark.blockManager.port": str(env_port("SPARK_BLOCKMANAGER_PORT", 0)),
        **authentication_defaults(),
    }
    write_defaults(conf_dir, defaults, "Rendered by `python -m stack up` for the joiner's driver on the standalone "
                   "cluster.")
    return conf_dir


def application_lines() -> list[str]:
    """`status`: the applications the master runs, each with its state and executors (counted on the workers),
    or why that is unknown."""
    state = master_state()
    if state is None:
        return ["spark applications: unknown while the master does not answer"]
    executors: dict[str, int] = {}
    for worker in state.get("workers", []):
        if worker.get("state") != "ALIVE":
            continue
        worker_state = _json(f"{worker.get('webuiaddress')}/json", JSON_TIMEOUT_S) or {}
        for executor in worker_state.get("executors", []):
            executors[executor.get("appid")] = executors.get(executor.get("appid"), 0) + 1
    alive = sum(worker.get("state") == "ALIVE" for worker in state.get("workers", []))
    lines = [f"spark master {master_url()}: {state.get('status')}, {alive} worker{'s' if alive != 1 else ''} "
             f"alive, {state.get('coresused', 0)}/{state.get('cores', 0)} cores used"]
    apps = state.get("activeapps", [])
    if not apps:
        return [*lines, "spark application: none running"]
    return lines + [f"spark application {app.get('name')} ({app.get('id')}): {app.get('state')}, "
              f"{executors.get(app.get('id'), 0)} executors, {app.get('cores', 0)} cores" for app in apps]
