"""`python -m stack up|down|status|logs|clean`: the native stack of real servers."""
from __future__ import annotations

import argparse
import sys
import time

from . import manager
from pipeline_core.kafka_clients import admin_client, wait_for_kafka
from pipeline_core.logs import configure_logging
from .processes import StackError, tail
from pipeline_core.settings import ConnectionSettings, load_settings
from pipeline_core.topics import ensure_topics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the servers and the pipeline (no-op for what runs)")
    up.add_argument("--servers-only", action="store_true", help="Mosquitto, Kafka, InfluxDB only")
    commands.add_parser("down", help="stop everything this stack started")
    commands.add_parser("status", help="each service, its ports and PID")
    logs = commands.add_parser("logs", help="the last lines of a service's log")
    logs.add_argument("service")
    logs.add_argument("-n", "--lines", type=int, default=40)
    commands.add_parser("clean", help="stop everything and delete all state")
    commands.add_parser("topics", help="create the pipeline's topics on KAFKA_BOOTSTRAP_SERVERS "
                                       "(idempotent; `up` does it for the native stack)")
    args = parser.parse_args(argv)
    configure_logging("WARNING")

    try:
        if args.command == "up":
            services = manager.servers() if args.servers_only else manager.all_services()
            began = time.monotonic()
            started = manager.up(services)
            took = time.monotonic() - began
            print(f"stack up in {took:.1f} s" + (f" (started: {', '.join(started)})" if started
                                                 else " (everything was already running)"))
            print_status(services)
        elif args.command == "down":
            stopped = manager.down(manager.every_service())
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        elif args.command == "status":
            print_status(manager.shown_in_status())
        elif args.command == "logs":
            print(tail(manager.log_file_of(args.service), args.lines))
        elif args.command == "topics":
            settings = load_settings(ConnectionSettings, [])
            wait_for_kafka(settings.kafka_bootstrap_servers)
            created = ensure_topics(admin_client(settings.kafka_bootstrap_servers))
            print("created: " + (", ".join(created) if created else "none, all topics exist"))
        elif args.command == "clean":
            manager.clean()
            print("stopped everything and deleted the stack's state")
    except (StackError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def print_status(services: list) -> None:
    print(f"{'service':<18}{'state':<10}{'pid':>8}  ports")
    for entry in manager.status(services):
        state = "healthy" if entry.healthy else ("starting" if entry.pid else "stopped")
        ports = ", ".join(f"{role} {port}" for role, port in entry.ports.items()) or "-"
        print(f"{entry.name:<18}{state:<10}{entry.pid or '-':>8}  {ports}")


if __name__ == "__main__":
    sys.exit(main())
