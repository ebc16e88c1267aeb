"""`python -m simulator`: replay machine states (or synthetic ones) to MQTT, or write them to a file."""
from __future__ import annotations

import logging
import os
import signal
import sys

from pipeline_core import credentials
from pipeline_core.logs import configure_logging
from pipeline_core.mqtt import DEVICE_CLIENT_ID
from pipeline_core.settings import load_settings

from .events import EventsFileError, write_events
from .placement import ReplayLog, ReplayNotes, newest_per_machine
from .publisher import Publisher, PublishError
from .replay import publish_rows, selected_rows
from .settings import SimulatorSettings
from .topics import fallback_topic

log = logging.getLogger("simulator")

# After SIGTERM or Ctrl-C: the longest the simulator waits for the acknowledgements of what it sent (and for the
# broker, were it away) before it prints its summary and ends.
STOP_DEADLINE_S = 3.0


def default_client_id(settings: SimulatorSettings) -> str:
    """`simulator-<pid>`, so several run side by side; a broker that authenticates binds the device
    user to one client id, which it must then use (02_mqtt_broker, "Security")."""
    return DEVICE_CLIENT_ID if settings.mqtt_username else f"simulator-{os.getpid()}"


def _stop_on_signals(publisher: Publisher) -> None:
    """SIGTERM and Ctrl-C (SIGINT) end the run within STOP_DEADLINE_S (`Publisher.request_stop`)."""

    def request_stop(signum: int, _frame) -> None:
        name = signal.Signals(signum).name
        log.info("received %s: publishing no more, waiting up to %.0f s for the acknowledgements of what was sent",
                 name, STOP_DEADLINE_S)
        publisher.request_stop(STOP_DEADLINE_S, name)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(SimulatorSettings, argv, prog="python -m simulator",
                             environ=credentials.environ_for("device"))
    configure_logging()
    try:
        replay_log = ReplayLog(settings.replay_log) if settings.ending_now and settings.replay_log else None
        rows, total = selected_rows(settings, replay_log.newest() if replay_log else None)
        if settings.output is not None:
            if total is None:
                raise ValueError("--output needs --limit when the rows have no end (--synthetic, --loop)")
            count = write_events(settings.output, rows)
            print(f"wrote {count} rows to {settings.output}")
            return 0
        publisher = Publisher(settings, settings.mqtt_client_id or default_client_id(settings),
                              window=settings.window, inflight=settings.inflight,
                              fallback_topic=fallback_topic(settings.mqtt_topic))
        _stop_on_signals(publisher)
        publisher.connect()
        notes = ReplayNotes(replay_log) if replay_log else None
        if notes is not None:
            if total is not None and not settings.synthetic:
                # The whole replay noted before its first row goes out: a replay killed midway leaves the next one
                # no machine behind rows it published.
                planned = list(rows)
                replay_log.note(newest_per_machine(planned))
                rows = iter(planned)
            rows = notes.track(rows)
    except (EventsFileError, PublishError, ValueError) as error:
        log.error("%s", error)
        return 2

    try:
        summary = publish_rows(publisher, settings, rows, total)
    except PublishError as error:  # the broker refused the reconnect (credentials changed meanwhile)
        log.error("%s", error)
        return 2
    finally:
        if notes is not None:
            notes.flush()
    publisher.close()
    print(summary)
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
