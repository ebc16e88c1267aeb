"""Session fixtures: the native stack of real servers, and fresh topics per test."""
from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import is_hypothesis_test, settings as hypothesis_settings
from hypothesis.database import DirectoryBasedExampleDatabase

from pipeline_core import paths
from pipeline_core.kafka_clients import admin_client
from pipeline_core.settings import ConnectionSettings, MqttSettings, load_settings
from pipeline_core.topics import MACHINE_DATA, MACHINE_DLQ, MACHINE_OUT, ensure_topics
from stack import manager
from stack.processes import free_loopback_ports
from stack.services import Kafka, Mosquitto
from stack.topology import private_ports
from connector_support import close_record_counters
from session_servers import shared_servers
from support import private_port_range, unique

# The replayed rows are from 2019: InfluxDB refuses points older than their retention policy's duration, so
# the tests' databases (and the stack a session starts) keep raw, joined and history data forever.
for _policy in ("RAW", "JOINED", "HISTORY"):
    os.environ.setdefault(f"INFLUXDB_{_policy}_RETENTION", "INF")

# Property tests draw the same examples on every run, so CI never fails on a new draw; a loaded machine's slow
# example is no failure either. A test's own @settings inherits both.
hypothesis_settings.register_profile("pipeline", derandomize=True, deadline=None)
# HYPOTHESIS_EXPLORE=1 (`make explore`): only the property tests, each drawing new examples on every run, and every
# failing example kept in an example database (.hypothesis/examples, which git ignores) and tried first on the
# next run, until it passes.
EXPLORE_ENV = "HYPOTHESIS_EXPLORE"
EXAMPLE_DATABASE = Path(__file__).resolve().parents[1] / ".hypothesis" / "examples"
EXPLORING = os.environ.get(EXPLORE_ENV, "").lower() in ("1", "yes", "true", "on")
hypothesis_settings.register_profile("explore", derandomize=False, deadline=None,
                                     database=DirectoryBasedExampleDatabase(EXAMPLE_DATABASE))
hypothesis_settings.load_profile("explore" if EXPLORING else "pipeline")

# The 5,000 real event rows (three machines), shipped with the simulator as its default replay.
EVENTS_FILE = Path(__file__).resolve().parents[1] / "01_simulator" / "data" / "test_events.json"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked `alone` come last: while one runs, the other workers wait (`cores_shared_or_alone`), which
    costs nothing once they have no test left to run. Exploring, the property tests alone run: the others draw
    nothing new."""
    items.sort(key=lambda item: item.get_closest_marker("alone") is not None)  # stable: the rest keep their order
    if not EXPLORING:
        return
    others = [item for item in items if not is_hypothesis_test(getattr(item, "obj", None))]
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for item in items if is_hypothesis_test(getattr(item, "obj", None))]


@pytest.fixture(autouse=True)
def cores_shared_or_alone(request: pytest.FixtureRequest,
                          tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test marked `alone` runs with no other test of the run beside it: the storms across hosts, whose checks hold
    a dozen JVMs to fault times on two cores. Any other test shares the cores with the other processes' tests."""
    run_dir = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_dir = run_dir.parent  # each worker's folder is in the run's
    with open(run_dir / "cores.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if request.node.get_closest_marker("alone") else fcntl.LOCK_SH)
        yield


@pytest.fixture(autouse=True)
def record_counters_closed() -> Iterator[None]:
    """`topic_size`'s readers go with the test that made them, before any server they read from stops."""
    yield
    close_record_counters()


@pytest.fixture(scope="session")
def stack() -> Iterator[ConnectionSettings]:
    """Mosquitto, Kafka and InfluxDB running for real: reused when they answer (whoever runs them), else started
    under supervisord, and what a test process started stopped after the run's last process that used them."""
    with shared_servers(manager.servers()):
        yield load_settings(ConnectionSettings, [])


@pytest.fixture(scope="session")
def bootstrap(stack: ConnectionSettings) -> str:
    return stack.kafka_bootstrap_servers


@dataclasses.dataclass(frozen=True)
class PipelineTopics:
    data: str
    out: str
    dlq: str


@pytest.fixture(scope="session")
def _created_topics(bootstrap: str) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    if names:
        admin = admin_client(bootstrap)
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result(30)


@pytest.fixture
def new_topics(bootstrap: str, _created_topics: list[str]) -> Callable[[], PipelineTopics]:
    """Make fresh copies of machine.data/.out/.dlq (same partitions and config) for one test."""

    def make() -> PipelineTopics:
        suffix = unique("t").split(".", 1)[1]
        specs = [dataclasses.replace(spec, name=f"{spec.name}.{suffix}")
                 for spec in (MACHINE_DATA, MACHINE_OUT, MACHINE_DLQ)]
        ensure_topics(admin_client(bootstrap), tuple(specs))
        _created_topics.extend(spec.name for spec in specs)
        return PipelineTopics(*(spec.name for spec in specs))

    return make


@pytest.fixture
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new folder for a private stack's state. Short: supervisord's socket inside it must fit in 100 bytes, and a
    test's own `tmp_path` (under an xdist worker's folder, named after the test) can be too long for that."""
    return tmp_path_factory.mktemp("state")


def _kafka_environment(state_dir: Path) -> dict[str, str]:
    """The environment of a Kafka broker of the tests' own: a state folder of its own, ports from CLUSTER_TEST_PORTS
    when set (this process's part of it), else any free ones."""
    ports = private_ports(("KAFKA_PORT", "KAFKA_CONTROLLER_PORT"), private_port_range())
    return {"STACK_STATE_DIR": str(state_dir), **{name: str(port) for name, port in ports.items()},
            "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{ports['KAFKA_PORT']}"}


@contextmanager
def _kafka_environment_set(environment: dict[str, str]) -> Iterator[None]:
    """`stack.manager` acting on that broker (and the pipeline's clients pointed at it) inside the block."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paths, "STATE_DIR", Path(environment["STACK_STATE_DIR"]))
        for name, value in environment.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="session")
def _private_kafka_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The test process's private Kafka, chosen on first use; stopped after the process's last test."""
    environment = _kafka_environment(tmp_path_factory.mktemp("kafka-state"))
    yield environment
    with _kafka_environment_set(environment):
        manager.down([Kafka()])


@pytest.fixture
def private_kafka(_private_kafka_environment: dict[str, str]) -> Iterator[str]:
    """A Kafka broker of the test process's own, for a test that stops, starts or freezes it (never the shared one);
    yields its bootstrap address. The process's tests share it, one after the other: each finds it running (started
    again if the one before stopped it), holding the topics and groups of those before, so each names its own."""
    with _kafka_environment_set(_private_kafka_environment):
        manager.up([Kafka()])  # a no-op while it runs
        yield _private_kafka_environment["KAFKA_BOOTSTRAP_SERVERS"]


@pytest.fixture
def fresh_kafka(state_dir: Path) -> Iterator[str]:
    """A Kafka broker formatted for this test alone (its first start), on ports and a state folder of its own;
    yields its bootstrap address, and stops it after the test."""
    environment = _kafka_environment(state_dir)
    with _kafka_environment_set(environment):
        try:
            manager.up([Kafka()])
            yield environment["KAFKA_BOOTSTRAP_SERVERS"]
        finally:
            manager.down([Kafka()])


@pytest.fixture
def private_mosquitto(state_dir: Path) -> Iterator[MqttSettings]:
    """A Mosquitto of the test's own (a free loopback port, a state folder of its own, run through `stack.manager`
    under supervisord), for a test that restarts or stops it; yields the settings to reach it."""
    (port,) = free_loopback_ports(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paths, "STATE_DIR", state_dir)
        patch.setenv("STACK_STATE_DIR", str(state_dir))
        patch.setenv("MQTT_PORT", str(port))
        try:
            manager.up([Mosquitto()])
            yield MqttSettings(mqtt_port=port)
        finally:
            manager.down([Mosquitto()])
