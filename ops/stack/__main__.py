"""`python -m stack up|down|status|logs|clean`: the native stack of real servers."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from pipeline_core import credentials
from pipeline_core.health import influxdb_ready
from pipeline_core.influx import InfluxDBClient, influx_client
from pipeline_core.influx_retention import RetentionSettings, provision
from pipeline_core.kafka_clients import admin_client, security_config, wait_for_kafka
from pipeline_core.logs import configure_logging
from pipeline_core.settings import ConnectionSettings, load_settings
from pipeline_core.stage_health import StageHealth, format_age
from pipeline_core.topics import configured_topics, ensure_topics
from . import (clocks, configuration, disk, growth, joiners, kafka_cluster, losses, manager, placement, rolling,
               security, spec_change, supervision, topology, watchdog)
from .kafka_acls import ensure_kafka_principals, kafka_users
from .processes import StackError, follow, tail
from .services import Kafka

TROUBLE_LOG_LINES = 10


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the servers and the pipeline (no-op for what runs)")
    up.add_argument("--servers-only", action="store_true", help="Mosquitto, Kafka, InfluxDB only")
    commands.add_parser("down", help="stop everything this stack started, and supervisord")
    status = commands.add_parser("status", help="each service: its state, health, PID, uptime, restarts, "
                                                "ports; what keeps failing, with its log; and data lost outside "
                                                "the pipeline's control (retention, deleted topics)")
    status.add_argument("--json", action="store_true", help="the same facts as one JSON document, for programs")
    logs = commands.add_parser("logs", help="the last lines of a service's log (or supervisord's)")
    logs.add_argument("service", nargs="?")
    logs.add_argument("-n", "--lines", type=int, default=40)
    logs.add_argument("-f", "--follow", action="store_true",
                      help="then every line written to it, across rotations, until Ctrl-C")
    restart = commands.add_parser("restart", help="stop one service and start it again, healthy (started if it "
                                                  "was not running)")
    restart.add_argument("service", nargs="?")
    rolling_restart = commands.add_parser("rolling-restart", help="every Kafka node of the cluster in turn, then every "
                                          "Spark worker, each back in sync before the next (TOPOLOGY=cluster, hosts)")
    rolling_restart.add_argument("--json", action="store_true", help="the steps as one JSON document, for programs")
    commands.add_parser("clean", help="stop everything and delete all state")
    grow_topic = commands.add_parser("grow", help="add partitions to a topic of the running stack (Kafka cannot take "
                                                  "any away), then follow the pipeline until it runs on them")
    grow_topic.add_argument("topic")
    grow_topic.add_argument("partitions", type=int)
    specs = commands.add_parser("specs", help="apply another join-spec file to the running stack: checked first (a file "
                                              "with an error is refused before anything stops), then the joiners "
                                              "restarted with it; specs added join from their position on")
    specs.add_argument("file", type=Path)
    commands.add_parser("topics", help="create the pipeline's topics on KAFKA_BOOTSTRAP_SERVERS and, when "
                                       "secure, its Kafka users and ACLs (idempotent; `up` does it for the "
                                       "native stack)")
    rotate = commands.add_parser("rotate-credential",
                                 help="a new random Kafka password for a principal (docs/security.md): set on "
                                      "Kafka, written to the credentials file, and the process using it restarted")
    rotate.add_argument("principal")
    run = commands.add_parser("run", help="run a command where the stack's clients run (`make data`, `make report`): "
                                          "here, or on TOPOLOGY=hosts on the operator host with the hosts' settings")
    run.add_argument("program", nargs=argparse.REMAINDER)
    commands.add_parser("influxdb", help="create the pipeline's InfluxDB database, retention policies and "
                                         "continuous queries, or bring them to INFLUXDB_*_RETENTION "
                                         "(idempotent; `up` does it for the native stack)")
    args = parser.parse_args(argv)
    configure_logging("WARNING")
    if args.command in ("status", "logs"):
        # Read through `head` or `less`: a reader that stops early ends the listing quietly, as with any Unix tool.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    try:
        if args.command == "run":
            args.program = args.program[1:] if args.program[:1] == ["--"] else args.program
            if not args.program:
                raise StackError("name the command to run: python -m stack run -- <command> [arguments]")
        if topology.is_hosts():
            os.environ.update(placement.server_environment())  # every server by its host's name
        if topology.is_hosts() and not placement.inside_operator():
            hopped = from_operator(args, sys.argv[1:] if argv is None else argv)
            if hopped is not None:
                return hopped
        if args.command in ("status", "logs", "restart", "down", "clean", "rotate-credential", "grow", "specs",
                            "rolling-restart"):
            ignored = configuration.take_noted()
            if ignored:
                print(f"{args.command}: the running stack's settings, not this shell's: " + "; ".join(ignored),
                      file=sys.stderr)
        if topology.is_cluster():  # every tool run from here bootstraps from all three nodes
            os.environ["KAFKA_BOOTSTRAP_SERVERS"] = kafka_cluster.bootstrap_servers()
        if args.command == "run":
            os.execvp(args.program[0], args.program)
        if args.command == "up":
            security.ensure_credentials()  # SECURITY=on: before any server starts
            services = manager.servers() if args.servers_only else manager.all_services()
            began = time.monotonic()
            started = manager.up(services, notify=print, same_settings=True)
            took = time.monotonic() - began
            print(f"stack up in {took:.1f} s" + (f" (started: {', '.join(started)})" if started
                                                 else " (everything was already running)"))
            print_status(services)
        elif args.command == "down":
            stopped = manager.down_everything()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        elif args.command == "status":
            if args.json:
                print(json.dumps(status_document(manager.shown_in_status()), indent=1))
            else:
                print_status(manager.shown_in_status())
        elif args.command == "logs":
            log_file = manager.log_file_of(required_service(args.service, "logs"))
            if args.follow:
                # Ctrl-C ends the following even when the shell that started it ignored SIGINT (a command run in
                # the background of a script inherits that): Python then never turns SIGINT into KeyboardInterrupt.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                try:
                    follow(log_file, args.lines, sys.stdout)
                except KeyboardInterrupt:
                    pass  # Ctrl-C ends the following, as with tail -f
            else:
                print(tail(log_file, args.lines))
        elif args.command == "restart":
            restarted = manager.restart(required_service(args.service, "restart"))
            print(f"restarted {restarted.name} in {restarted.seconds:.1f} s, healthy: pid {restarted.old_pid or '-'} "
                  f"-> {restarted.new_pid}")
        elif args.command == "rolling-restart":
            began = time.monotonic()
            steps = rolling.rolling_restart(manager.servers(), manager.start, (lambda _: None) if args.json else print)
            took = time.monotonic() - began
            print(json.dumps(rolling.document(steps, took)) if args.json else rolling.summary(steps, took))
        elif args.command == "topics":
            settings = load_settings(ConnectionSettings, [], environ=credentials.environ_for("admin"))
            client_security = security_config(settings)
            wait_for_kafka(settings.kafka_bootstrap_servers, security=client_security)
            admin = admin_client(settings.kafka_bootstrap_servers, **client_security)
            created = ensure_topics(admin, configured_topics())
            print("created: " + (", ".join(created) if created else "none, all topics exist"))
            if client_security:
                # The file, or (Compose's init job) the same keys in the environment.
                secrets = {**credentials.read_credentials(),
                           **{key: os.environ[key] for key in credentials.password_keys() if key in os.environ}}
                ensure_kafka_principals(admin, secrets)
                print("Kafka users and ACLs: " + ", ".join(kafka_users()))
        elif args.command == "rotate-credential":
            # The running stack's Kafka unless KAFKA_BOOTSTRAP_SERVERS says otherwise (the default of ConnectionSettings
            # was taken from the shell's KAFKA_PORT when it was imported, before the running stack's settings).
            settings = load_settings(ConnectionSettings, [], environ={
                "KAFKA_BOOTSTRAP_SERVERS": Kafka().bootstrap_servers, **os.environ})
            restart = security.rotate_kafka_credential(args.principal, settings.kafka_bootstrap_servers)
            print(f"{args.principal}: new Kafka password set and written to {credentials.credentials_file()}")
            restarted = manager.restart_running(restart)
            print("restarted: " + (", ".join(restarted) if restarted else "nothing (not running)"))
        elif args.command == "grow":
            if supervision.daemon_pid() is None:
                raise StackError("the stack is not running: `make up` starts it (on a stopped stack, add partitions "
                                 "with Kafka's own tools; the stages follow when they start)")
            settings = load_settings(ConnectionSettings, [], environ={
                "KAFKA_BOOTSTRAP_SERVERS": Kafka().bootstrap_servers, **credentials.environ_for("admin")})
            growth.grow(args.topic, args.partitions, settings.kafka_bootstrap_servers, security_config(settings),
                        topology.is_cluster())
        elif args.command == "specs":
            settings = load_settings(ConnectionSettings, [], environ={
                "KAFKA_BOOTSTRAP_SERVERS": Kafka().bootstrap_servers, **credentials.environ_for("admin")})
            spec_change.apply(args.file.resolve(), settings.kafka_bootstrap_servers, security_config(settings),
                             topology.is_cluster())
        elif args.command == "influxdb":
            settings = load_settings(RetentionSettings, [], environ=credentials.environ_for("admin"))
            changes = provision(settings)
            print(f"InfluxDB {settings.influxdb_database}: " + ("; ".join(changes) if changes else "up to date"))
        elif args.command == "clean":
            manager.clean()
            print("stopped everything and deleted the stack's state")
    except (StackError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def from_operator(args: argparse.Namespace, argv: list[str]) -> int | None:
    """On TOPOLOGY=hosts, the command run on the operator host, where every server is reached across the network
    by name (its exit code); `up` builds the hosts first, `down` and `clean` remove them after. None: run it here,
    as no host runs (nothing to act on but the state dir)."""
    if args.command == "up":
        if placement.ensure_network({service.name for service in topology.every_cluster_service()}):
            print(f"built {len(placement.inventory().hosts)} hosts on {placement.inventory().subnet} "
                  f"(namespaces {placement.prefix()}-*, inventory {placement.INVENTORY})")
    elif not placement.network_exists():
        return None
    if args.command == "run":
        return placement.run_on_operator(args.program, {
            "KAFKA_BOOTSTRAP_SERVERS": kafka_cluster.bootstrap_servers(), **placement.mqtt_client_environment()})
    code = placement.run_on_operator([sys.executable, "-m", "stack", *argv])
    if args.command in ("down", "clean") and code == 0:
        removed = placement.remove_network()
        print(f"removed the hosts' network ({len(removed)} namespaces)")
    return code


def print_status(services: list) -> None:
    entries = manager.status(services)
    print(f"{'service':<18}{'state':<10}{'health':<13}{'pid':>8}{'uptime':>12}{'restarts':>10}{'watchdog':>10}"
          f"{'lag':>10}{'last progress':>15}  ports")
    for entry in entries:
        ports = ", ".join(f"{role} {port}" for role, port in entry.ports.items()) or "-"
        uptime = format_duration(entry.uptime_s) if entry.uptime_s is not None else "-"
        lag, progress_age = stage_figures(entry.stage)
        print(f"{entry.name:<18}{entry.state:<10}{health(entry):<13}{entry.pid or '-':>8}{uptime:>12}"
              f"{entry.restarts.count:>10}{len(entry.restarts.watchdog):>10}{lag:>10}{progress_age:>15}  {ports}")
    for line in topology.status_lines([entry.name for entry in entries]):
        print(line)
    pid = supervision.daemon_pid()
    print()
    print(f"supervisord: pid {pid}, config {supervision.config_file()}, log {supervision.daemon_log()}"
          if pid else "supervisord: not running (`make up` starts it)")
    leftovers = manager.unsupervised_processes()
    if leftovers:
        print("running without supervisord: "
              + ", ".join(f"{name} (pid {pid})" for name, pid in leftovers.items())
              + "; `make down` stops them, then `make up` runs them supervised")
    print(loss_line())
    print(clock_line())
    print(disk.describe())
    for entry in entries:
        if entry.stage is not None and not entry.stage.healthy:
            print(f"{entry.stage.state}: {entry.name}: {entry.stage.detail}; log: {entry.log_file}")
    for line in watchdog.status_lines(entries):
        print(line)
    for entry in entries:
        if entry.stage is not None and entry.stage.note:
            print(f"note: {entry.name}: {entry.stage.note}")
    for entry in entries:
        if entry.trouble:
            print(f"\n{entry.name} keeps failing: {entry.trouble}")
            print(f"  log: {entry.log_file} (`make logs SERVICE={entry.name}` shows more); last lines:")
            for line in tail(entry.log_file, TROUBLE_LOG_LINES).splitlines():
                print(f"    {line}")


def required_service(name: str | None, command: str) -> str:
    """The SERVICE a command needs, or an error naming the services to choose from."""
    if name:
        return name
    known = [service.name for service in manager.every_service()] + (["supervisord"] if command == "logs" else [])
    raise StackError(f"name a service: `make {command} SERVICE=<name>`, one of {', '.join(known)}")


def from_health_metrics(ask: Callable[[InfluxDBClient], dict[str, dict[str, int]]]
                        ) -> tuple[dict[str, dict[str, int]] | None, str | None]:
    """What `ask` reads from the stages' health metrics in InfluxDB, or None and why it is unknown."""
    settings = load_settings(ConnectionSettings, [], environ=credentials.environ_for("monitor"))
    if not influxdb_ready(settings.influxdb_port, settings.influxdb_host, ca_file=settings.influxdb_tls_ca_file):
        return None, "unknown while InfluxDB does not answer"
    try:
        return ask(influx_client(settings, timeout_s=5.0)), None
    except Exception as error:  # noqa: BLE001 - the status of the services must show regardless
        return None, f"unknown ({type(error).__name__}: {str(error)[:200]})"


def stage_losses() -> tuple[dict[str, dict[str, int]] | None, str | None]:
    """What the stages lost outside the pipeline's control: the losses per stage, or None and why unknown."""
    return from_health_metrics(losses.stage_losses)


def loss_line() -> str:
    """`status`'s line on what the stages lost outside the pipeline's control."""
    found, unknown = stage_losses()
    return losses.describe(found) if found is not None else f"loss outside the pipeline's control: {unknown}"


def clock_line() -> str:
    """`status`'s line on the machines whose clocks the joiner's clock rule caught."""
    found, unknown = from_health_metrics(clocks.machine_clock_faults)
    return clocks.describe(found) if found is not None else f"clock faults: {unknown}"


def status_document(services: list) -> dict:
    """What `status` prints, as one JSON-ready document: each process's columns (times in seconds, counts as
    numbers), then what the table's notes say (supervisord, processes without it, loss, disk, trouble)."""
    entries = manager.status(services)
    found, unknown = stage_losses()
    faults, faults_unknown = from_health_metrics(clocks.machine_clock_faults)
    pid = supervision.daemon_pid()
    latest = watchdog.latest_restarts(watchdog.history_file())
    return {
        "topology": topology.current(),
        "joiner": joiners.chosen(),
        "services": [{
            "name": entry.name, "state": entry.state, "health": health(entry), "pid": entry.pid,
            "uptime_s": entry.uptime_s, "restarts": entry.restarts.count,
            "watchdog_restarts": len(entry.restarts.watchdog),
            "watchdog_latest": asdict(latest[entry.name]) if entry.restarts.watchdog and entry.name in latest else None,
            "lag": entry.stage.lag if entry.stage is not None else None,
            "last_progress_age_s": entry.stage.progress_age_s if entry.stage is not None else None,
            "ports": entry.ports, "log_file": str(entry.log_file),
            "stage_state": entry.stage.state if entry.stage is not None else None,
            "stage_detail": entry.stage.detail if entry.stage is not None else None,
            "stage_note": entry.stage.note if entry.stage is not None else None,
            "trouble": entry.trouble,
            "log_tail": tail(entry.log_file, TROUBLE_LOG_LINES).splitlines() if entry.trouble else None,
        } for entry in entries],
        "cluster": topology.status_lines([entry.name for entry in entries]),
        "supervisord": {"pid": pid, "config": str(supervision.config_file()), "log": str(supervision.daemon_log())}
        if pid else None,
        "unsupervised": manager.unsupervised_processes(),
        "loss": {"window": losses.WINDOW, "by_stage": found, "unknown": unknown},
        "clock_faults": {"window": clocks.WINDOW, "by_machine": faults, "unknown": faults_unknown},
        "disk": disk.measure().as_dict(),
    }


def health(entry: manager.ServiceStatus) -> str:
    """A server's health check, or a ready stage's verdict by its heartbeat (docs/operations.md)."""
    if entry.stage is not None:
        return "healthy" if entry.stage.healthy else entry.stage.state
    if entry.healthy:
        return "healthy"
    return {"STARTING": "starting", "RUNNING": "not ready"}.get(entry.state, "-")


def stage_figures(stage: StageHealth | None) -> tuple[str, str]:
    """A stage's lag (records waiting for it, as it knows them) and the age of its last progress."""
    if stage is None:
        return "-", "-"
    lag = "?" if stage.lag is None else f"{stage.lag:,}"
    return lag, f"{format_age(stage.progress_age_s)} ago" if stage.progress_age_s is not None else "none yet"


def format_duration(seconds: float) -> str:
    """`1:02:03`, or `2d 1:02:03` past a day."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    clock = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock


if __name__ == "__main__":
    sys.exit(main())
