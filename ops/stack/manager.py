"""Bring the native stack up and down: servers first, then the pipeline's own processes."""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass

from pipeline_core import paths
from .processes import (StackError, live_record, port_holder, port_is_free, spawn, tail,
                        terminate, wait_until)
from .services import START_MARKER, InfluxDB, Kafka, Mosquitto, PipelineProcess, Service

log = logging.getLogger(__name__)


def servers() -> list[Service]:
    return [Mosquitto(), Kafka(), InfluxDB()]


def stream_connector() -> Service:
    # On SIGTERM it waits up to 30 s for Kafka to confirm what it already took from MQTT.
    return PipelineProcess("stream-connector", "stream_connector", stop_grace_s=35.0)


def db_connector() -> Service:
    return PipelineProcess("db-connector", "db_connector", "--group-instance-id", "db-connector")


# The standalone joiner by default: it starts in about a second, commits every 50 ms and needs
# one core; the Spark joiner is the choice for a cluster (README, "Which joiner").
# Stable instance ids give static group membership: a restarted process takes its partitions back
# at once, and the joiner's stable transactional id fences the crashed run's open transaction.
DEFAULT_JOINER = "lsb"
JOINERS = {
    # The stream connector writes each thing to one partition: the joiner joins where records lie.
    "lsb": lambda: PipelineProcess("lsb-joiner", "kafka_joiner",
                                   "--instance-id", "lsb-joiner", "--input-partitioned-by-thing"),
    # JVM start, Spark session and the first stateful batch take a while on two cores.
    "spark": lambda: PipelineProcess("spark-joiner", "spark_joiner", start_deadline_s=240.0),
}


def pipeline(joiner: str | None = None) -> list[Service]:
    """The pipeline's processes that `make up` runs on top of the servers (JOINER=lsb|spark)."""
    joiner = joiner or os.environ.get("JOINER", DEFAULT_JOINER)
    if joiner not in JOINERS:
        raise StackError(f"JOINER={joiner!r}: choose one of {', '.join(JOINERS)}")
    return [stream_connector(), JOINERS[joiner](), db_connector()]


def all_services() -> list[Service]:
    """What `up` runs: the servers, then the pipeline with the configured joiner."""
    return servers() + pipeline()


def every_service() -> list[Service]:
    """What `down` stops: whatever of the stack runs, whichever joiner was chosen when it started."""
    return servers() + [stream_connector(), *(make() for make in JOINERS.values()), db_connector()]


def shown_in_status() -> list[Service]:
    """The configured services, plus any other pipeline process still running (a former joiner)."""
    configured = {service.name for service in all_services()}
    return [service for service in every_service()
            if service.name in configured or live_record(service.pid_file)]


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    ports: dict[str, int]
    healthy: bool


def start(service: Service) -> bool:
    """Start `service` unless it runs already; returns True when it was started now."""
    if live_record(service.pid_file):
        if not service.is_ready():
            raise StackError(f"{service.name} is running (see `python -m stack status`) but does not "
                             f"answer its health check; last log lines:\n{tail(service.log_file)}")
        return False
    for role, port in service.ports().items():
        if not port_is_free(port):
            raise StackError(f"port {port} ({service.name} {role}) is already in use by "
                             f"{port_holder(port)}: stop that process or choose another port "
                             f"(see the README, 'Ports')")
    service.state_dir.mkdir(parents=True, exist_ok=True)
    service.prepare()
    with open(service.log_file, "a") as log_file:
        log_file.write(f"{START_MARKER} {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    process = spawn(service.command(), log_file=service.log_file, pid_file=service.pid_file,
                    marker=service.marker(), env=service.environment(), cwd=paths.REPO_ROOT)
    alive = lambda: process.poll() is None  # noqa: E731
    if not wait_until(service.is_ready, service.start_deadline_s, alive=alive):
        reason = (f"exited during start (exit code {process.returncode})" if not alive()
                  else f"did not become healthy within {service.start_deadline_s:.0f} s")
        record = live_record(service.pid_file)
        if record:
            terminate(record, grace_s=5)
        service.pid_file.unlink(missing_ok=True)
        raise StackError(f"{service.name} {reason}; last lines of {service.log_file}:\n"
                         f"{tail(service.log_file)}")
    service.after_ready()
    return True


def stop(service: Service) -> bool:
    """Stop `service` if it runs; returns True when something was stopped."""
    record = live_record(service.pid_file)
    if record is None:
        return False
    terminate(record, grace_s=service.stop_grace_s)
    service.pid_file.unlink(missing_ok=True)
    return True


def up(services: Iterable[Service]) -> list[str]:
    """Start every service in order; names of those started now (the rest were running)."""
    return [service.name for service in services if start(service)]


def down(services: Iterable[Service]) -> list[str]:
    """Stop in reverse order: the pipeline first, so it can still flush to the servers."""
    return [service.name for service in reversed(list(services)) if stop(service)]


def status(services: Iterable[Service]) -> list[ServiceStatus]:
    result = []
    for service in services:
        record = live_record(service.pid_file)
        result.append(ServiceStatus(service.name, record.pid if record else None, service.ports(),
                                    bool(record) and service.is_ready()))
    return result


def clean() -> None:
    """Stop everything and delete all runtime state (Kafka logs, checkpoints, InfluxDB data)."""
    down(every_service())
    if paths.STATE_DIR.exists():
        shutil.rmtree(paths.STATE_DIR)


def log_file_of(name: str) -> os.PathLike[str]:
    for service in every_service():
        if service.name == name:
            return service.log_file
    raise StackError(f"no service named {name!r}; known: {', '.join(s.name for s in every_service())}")
