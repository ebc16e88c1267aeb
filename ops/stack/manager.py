"""Bring the native stack up and down under supervisord: servers first, each healthy before the next,
then the pipeline's own processes; and what `status` tells of them."""
from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline_core import paths
from pipeline_core.stage_health import StageHealth
from . import (configuration, join_specs, joiners, kafka_cluster, placement, security, supervision, topology,
               unsupervised, watchdog)
from .processes import StackError, port_holder, port_is_free, tail
from .restarts import Restarts, read_restarts
from .services import START_MARKER, InfluxDB, Kafka, Mosquitto, PipelineProcess, Service

log = logging.getLogger(__name__)

# `status` names a process that supervisord restarted this often within the window (one that ran
# past its startsecs each time, so supervisord restarts it at once rather than backing off).
RESTART_LOOP_COUNT = 3
RESTART_LOOP_WINDOW_S = 600.0


def servers() -> list[Service]:
    if topology.is_cluster():
        return topology.cluster_servers(_joiner())
    return [Mosquitto(), Kafka(), InfluxDB()]


def stream_connector() -> Service:
    # On SIGTERM it waits up to 30 s for Kafka to confirm what it already took from MQTT.
    return PipelineProcess("stream-connector", "stream_connector", stop_grace_s=35.0,
                           env=joiners.connector_environment(cluster=False))


def db_connector() -> Service:
    return PipelineProcess("db-connector", "db_connector", "--group-instance-id", "db-connector")


# The Spark joiner by default: it scales out with Spark's executors; JOINER=lsb, the standalone joiner,
# starts in about a second and has the lowest latency (README, "Which joiner"). One runs at a time (`joiners`).
# Stable instance ids give static group membership: a restarted process takes its partitions back
# at once, and the joiner's stable transactional id fences the crashed run's open transaction.
DEFAULT_JOINER = joiners.DEFAULT_JOINER
JOINERS = {
    # The stream connector writes each thing to one partition: the joiner joins where records lie.
    "lsb": lambda: PipelineProcess("lsb-joiner", "kafka_joiner",
                                   "--instance-id", "lsb-joiner", "--input-partitioned-by-thing",
                                   env=join_specs.environment()),
    # JVM start, Spark session and the first stateful batch take a while on two cores.
    "spark": lambda: PipelineProcess("spark-joiner", "spark_joiner", start_deadline_s=240.0,
                                     startsecs=30.0, env=join_specs.environment()),
}


def _joiner(joiner: str | None = None) -> str:
    """`joiner`, else JOINER, else the joiner the state dir runs, else the default."""
    joiner = joiner or joiners.chosen()
    if joiner not in JOINERS:
        raise StackError(f"JOINER={joiner!r}: choose one of {', '.join(JOINERS)}")
    return joiner


def joiner_services(joiner: str) -> list[Service]:
    """The processes of `joiner` on this topology."""
    return topology.cluster_joiners()[joiner] if topology.is_cluster() else [JOINERS[joiner]()]


def pipeline(joiner: str | None = None) -> list[Service]:
    """The pipeline's processes that `make up` runs on top of the servers (JOINER=lsb|spark)."""
    joiner = _joiner(joiner)
    if topology.is_cluster():
        return topology.cluster_pipeline(joiner)
    return [stream_connector(), JOINERS[joiner](), db_connector()]


def all_services() -> list[Service]:
    """What `up` runs: the servers, then the pipeline with the configured joiner."""
    return servers() + pipeline()


def every_service() -> list[Service]:
    """Every program supervisord knows, whichever joiner is chosen: `down` stops what runs of them."""
    if topology.is_cluster():
        return topology.every_cluster_service()
    return servers() + [stream_connector(), *(make() for make in JOINERS.values()), db_connector()]


def shown_in_status() -> list[Service]:
    """The configured services, plus any other that supervisord runs (a former joiner)."""
    configured = {service.name for service in all_services()}
    active = set(supervision.active_programs())
    return [service for service in every_service()
            if service.name in configured or service.name in active]


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    state: str  # supervisord's: STOPPED, STARTING, RUNNING, BACKOFF, STOPPING, EXITED, FATAL
    pid: int | None
    uptime_s: float | None
    restarts: Restarts  # by supervisord, since `up` last started it
    ports: dict[str, int]
    healthy: bool  # a server answers its protocol; a stage is ready and healthy by its heartbeat
    log_file: Path
    stage: StageHealth | None = None  # a pipeline stage's heartbeat verdict, once it is ready

    @property
    def trouble(self) -> str | None:
        """Why this process needs a look, or None while it runs (or was stopped) as it should."""
        recent = self.restarts.within(RESTART_LOOP_WINDOW_S)
        restarted = (f"restarted {recent} time{'s' if recent > 1 else ''} in the last "
                     f"{RESTART_LOOP_WINDOW_S / 60:.0f} minutes" if recent else "")
        if self.state == "FATAL":
            return (f"FATAL: it kept exiting during start and supervisord gave up after "
                    f"{supervision.START_RETRIES} retries; `make up` starts it again")
        # One exit during start is a crash supervisord handles (say, a kill before startsecs
        # passed); a second in a row is a stage that cannot start.
        exits_during_start = self.restarts.failed_starts + (self.state == "BACKOFF")
        if self.state in ("BACKOFF", "STARTING") and exits_during_start >= 2:
            return (f"{self.state}: it exited during start; supervisord retries it with growing "
                    f"delays" + (f" ({restarted})" if restarted else ""))
        if recent >= RESTART_LOOP_COUNT and self.state in supervision.ACTIVE_STATES:
            return f"keeps exiting: {restarted}"
        wedged = sum(at >= time.time() - RESTART_LOOP_WINDOW_S for at in self.restarts.watchdog)
        if wedged >= RESTART_LOOP_COUNT and self.state in supervision.ACTIVE_STATES:
            return (f"keeps wedging: restarted by the watchdog {wedged} times in the last "
                    f"{RESTART_LOOP_WINDOW_S / 60:.0f} minutes, its loop stopped each time")
        return None


def _await_ready(service: Service) -> None:
    """Wait until the process supervisord runs for `service` passes its health check."""
    end = time.monotonic() + service.start_deadline_s
    first_pid = None
    while True:
        info = supervision.process_info(service.name)
        if info.state in ("STARTING", "RUNNING") and info.pid:
            first_pid = first_pid or info.pid
            if info.pid == first_pid and _is_ready(service, info.pid):
                return
        exited = info.state not in ("STARTING", "RUNNING") or (first_pid and info.pid != first_pid)
        if exited or time.monotonic() > end:
            reason = (f"exited during start ({info.state}); supervisord keeps restarting it, with growing "
                      f"delays while it exits early (`make status` shows it, `make down` stops it)"
                      if exited else f"did not become healthy within {service.start_deadline_s:.0f} s")
            raise StackError(f"{service.name} {reason}; last lines of {service.log_file}:\n"
                             f"{tail(service.log_file)}")
        time.sleep(0.1)


def start(service: Service) -> bool:
    """Have supervisord start `service` unless it runs already, and wait until it is healthy;
    returns True when it was started now."""
    return bool(start_together([service]))


def start_together(services: list[Service]) -> list[str]:
    """Have supervisord start each of `services` that does not run yet, all at once, then wait until each is
    healthy (the nodes of a quorum each wait for the others) and set up (topics, databases); names of those
    started now."""
    launched = [service for service in services
                if supervision.process_info(service.name).state not in supervision.ACTIVE_STATES]
    try:
        for service in launched:
            with placement.on_host(service.name):  # its ports are free there, and its configuration that host's
                for role, port in service.ports().items():
                    if not port_is_free(port, service.bind_host(role)):
                        raise StackError(f"port {port} ({service.name} {role}) is already in use by "
                                         f"{port_holder(port)}: stop that process or choose another port "
                                         f"(see docs/operations.md, 'Ports and settings')")
                service.state_dir.mkdir(parents=True, exist_ok=True)
                service.prepare()
    finally:
        # Each one's preparation (a Kafka node's storage formatted in a JVM of its own) went on beside the others';
        # each is waited for, another's failure or not (a format's argument file holds the admin's password).
        for service in launched:
            service.await_prepared()
    for service in launched:
        with open(service.log_file, "a") as log_file:
            log_file.write(f"{START_MARKER} {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        supervision.start_process(service.name)
    for service in services:
        _await_ready(service)
    # Every one, not only those started now: an `up` that gave up waiting for a slow Kafka left it running without
    # its topics, and the next `up` found it running (the set-up is idempotent). Once per set-up: a cluster's nodes
    # share theirs.
    set_up: set[str] = set()
    for service in services:
        if service.setup_id not in set_up:
            set_up.add(service.setup_id)
            with placement.on_host(service.name):
                service.after_ready()
    return [service.name for service in launched]


def _is_ready(service: Service, pid: int | None) -> bool:
    """`service`'s health check, run as if on its host (on the hosts, a probe of its loopback is that host's)."""
    with placement.on_host(service.name):
        return service.is_ready(pid)


def _start_groups(services: list[Service]) -> list[list[Service]]:
    """`services` in order, those of one start group (consecutive) together, every other one alone: the order
    in which they start, and reversed, stop."""
    groups: list[list[Service]] = []
    for service in services:
        if groups and service.start_group and groups[-1][-1].start_group == service.start_group:
            groups[-1].append(service)
        else:
            groups.append([service])
    return groups


def up(services: Iterable[Service], notify: Callable[[str], None] = log.info,
       same_settings: bool = False) -> list[str]:
    """Start every service in order under supervisord; names of those started now (the rest ran).

    One configuration at a time: `same_settings` (`make up`) refuses, while supervisord runs, other settings than
    it was started with (`configuration`); a program bringing back a server it stopped leaves it off.
    One joiner at a time: when `services` hold a joiner other than the one the state dir ran, that one is stopped
    first and hands its input position over before the new one starts (`joiners`); `notify` is told of both, a
    line each."""
    services = list(services)
    with supervision.exclusive():
        leftovers = unsupervised.running()
        if leftovers:
            raise StackError("processes of this state dir run without supervisord ("
                             + ", ".join(f"{name} pid {pid}" for name, pid in leftovers.items())
                             + "): `python -m stack down` stops them, then `up` runs them supervised")
        chosen = topology.current()
        if (running_topology := topology.recorded()) not in (None, chosen) and supervision.active_programs():
            raise StackError(f"the {running_topology} stack of this state dir runs: `make down` stops it, "
                             f"then `make up TOPOLOGY={chosen}` starts the {chosen} one")
        settings = configuration.current()
        daemon_runs = supervision.daemon_pid() is not None
        if daemon_runs and same_settings:
            configuration.check(settings)
        topology.record(chosen)
        if any(service.name in {s.name for s in joiner_services(_joiner())} for service in services):
            join_specs.ensure_live_file(_joiner())  # the spec file the joiners read (`join_specs`)
        switch = _joiner_switch(services, notify)
        known = {service.name for service in every_service()}
        supervised = every_service() + [s for s in services if s.name not in known]
        _write_watch_lists(supervised)
        supervision.ensure_daemon(supervised)
        if not daemon_runs:
            configuration.note(settings)
        try:
            started = []
            for group in _start_groups(services):
                if switch is not None and any(service.name in switch.names for service in group):
                    switch.hand_over(notify)
                    switch = None
                started += start_together(group)
            return started
        except StackError:
            if not supervision.active_programs():  # nothing for it to supervise: no idle daemon left
                supervision.shut_down_daemon()
            raise


def _write_watch_lists(services: list[Service]) -> None:
    """For each supervisord, the stages it runs, which its watchdog watches (`stack.watchdog`)."""
    for daemon in supervision.daemons():
        watchdog.write_watch_list(daemon.directory, [
            watchdog.WatchedStage.of(service) for service in services
            if isinstance(service, PipelineProcess) and supervision.daemon_of(service.name) == daemon])


@dataclass
class JoinerSwitch:
    """The joiner `up` starts, and the one it takes over from (None: none ran on this state dir)."""

    previous: str | None
    joiner: str
    names: set[str]  # its processes

    def hand_over(self, notify: Callable[[str], None]) -> None:
        """Before the joiner's first start: take over the previous joiner's input position, then record it."""
        cluster = topology.is_cluster()
        bootstrap = kafka_cluster.bootstrap_servers() if cluster else Kafka().bootstrap_servers
        client_security = security.client_security()
        previous = self.previous
        if previous is None:
            previous = joiners.only_one_with_a_position(bootstrap, client_security, cluster)
        if previous is not None and previous != self.joiner:
            notify(joiners.hand_over(previous, self.joiner, bootstrap, client_security, cluster))
        joiners.record(self.joiner)


def _joiner_switch(services: list[Service], notify: Callable[[str], None]) -> JoinerSwitch | None:
    """When `services` hold a joiner: which, and which one ran before it; any other joiner running is stopped here,
    before anything starts (the old joiner stopped before the new one writes)."""
    joiner = _joiner()
    names = {service.name for service in joiner_services(joiner)}
    if not names & {service.name for service in services}:
        return None
    active = set(supervision.active_programs())
    running = [name for name in JOINERS if any(service.name in active for service in joiner_services(name))]
    # One that runs is the one that wrote last; both running (a stack from before one joiner at a time): the chosen
    # one goes on with its own position.
    previous = joiner if joiner in running else running[0] if running else joiners.recorded()
    for other in JOINERS:
        if other != joiner:
            stopped = supervision.stop_together([service.name for service in joiner_services(other)])
            if stopped:
                notify(f"stopped the {other} joiner ({', '.join(stopped)}): the {joiner} joiner takes over")
    return JoinerSwitch(previous, joiner, names)


def restart_running(names: Iterable[str]) -> list[str]:
    """Stop and start again, each healthy before the next, those of `names` that run now (say, to read new
    credentials); the names restarted."""
    wanted = set(names)
    with supervision.exclusive():
        active = set(supervision.active_programs())
        restarted = [service for service in every_service() if service.name in wanted and service.name in active]
        for service in restarted:
            supervision.stop_process(service.name)
            start(service)
    return [service.name for service in restarted]


@dataclass(frozen=True)
class Restarted:
    name: str
    old_pid: int | None
    new_pid: int | None
    seconds: float


def restart(name: str) -> Restarted:
    """Stop service `name` (with its grace period) and start it again, waiting until it is healthy; one that is
    not running (stopped, or given up on: FATAL) is started. Only a service of the stack that runs."""
    known = [service.name for service in every_service()]
    if name not in known:
        raise StackError(f"no service named {name!r}; known: {', '.join(known)}" if name != "supervisord" else
                         "supervisord runs every service: `make down`, then `make up`, restarts it with them")
    with supervision.exclusive():
        if supervision.daemon_pid() is None:
            raise StackError("the stack is not running: `make up` starts it")
        service = next((service for service in all_services() if service.name == name), None)
        if service is None:
            joiner = _joiner()
            raise StackError(f"{name} is not part of the stack that runs (its joiner is the {joiner} joiner): "
                             + ("`make up JOINER=" + ("lsb" if "lsb" in name else "spark") + "` switches the joiner"
                                if "joiner" in name else "`make up` with its settings starts it"))
        began = time.monotonic()
        old_pid = supervision.process_info(name).pid
        supervision.stop_process(name)
        start(service)
        return Restarted(name, old_pid, supervision.process_info(name).pid, time.monotonic() - began)


def down(services: Iterable[Service]) -> list[str]:
    """Stop in reverse order: the pipeline first, so it can still flush to the servers. supervisord
    exits too once nothing runs under it. Names of the processes stopped."""
    with supervision.exclusive():
        stopped = [name for group in _start_groups(list(reversed(list(services))))
                   for name in supervision.stop_together([service.name for service in group])]
        if not supervision.active_programs() and supervision.shut_down_daemon():
            stopped.append("supervisord")
    return stopped


def down_everything() -> list[str]:
    """`down`: whatever of this state dir's stack runs, whichever joiner was chosen, and supervisord."""
    services = every_service()
    known = {service.name for service in services}
    others = [name for name in supervision.active_programs() if name not in known]
    for name in others:
        supervision.stop_process(name)
    return others + down(services) + unsupervised.stop([s.name for s in reversed(services)])


def running(services: Iterable[Service]) -> list[str]:
    """Names of those that supervisord runs (or restarts) now."""
    active = set(supervision.active_programs())
    return [service.name for service in services if service.name in active]


def status(services: Iterable[Service]) -> list[ServiceStatus]:
    restarts = read_restarts(supervision.start_history())
    result = []
    now = time.time()
    for service in services:
        info = supervision.process_info(service.name)
        ready = info.state in ("STARTING", "RUNNING") and _is_ready(service, info.pid)
        # A stage is more than ready: healthy while it makes progress or has nothing to do.
        stage = service.stage_health(info.pid, now) if ready and isinstance(service, PipelineProcess) else None
        result.append(ServiceStatus(service.name, info.state, info.pid, info.uptime_s,
                                    restarts.get(service.name, Restarts()), service.ports(),
                                    ready and (stage is None or stage.healthy), service.log_file, stage))
    return result


def unsupervised_processes() -> dict[str, int]:
    """Name -> PID of this state dir's processes that run without supervisord."""
    return unsupervised.running()


def clean() -> None:
    """Stop everything and delete all runtime state (Kafka logs, checkpoints, InfluxDB data)."""
    down_everything()
    if paths.STATE_DIR.exists():
        shutil.rmtree(paths.STATE_DIR)


def log_file_of(name: str) -> Path:
    if name == "supervisord":
        return supervision.daemon_log()
    for service in every_service():
        if service.name == name:
            return service.log_file
    raise StackError(f"no service named {name!r}; known: "
                     f"{', '.join([s.name for s in every_service()] + ['supervisord'])}")
