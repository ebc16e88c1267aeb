"""`python -m db_connector`: load machine.data and machine.out into InfluxDB until SIGTERM/SIGINT."""
from __future__ import annotations

import sys
from collections.abc import Sequence

from pipeline_core import credentials
from pipeline_core.lifecycle import exit_on_thread_failure, process_stop_signal
from pipeline_core.logs import configure_logging
from pipeline_core.runtime import tune_gc_for_streaming
from pipeline_core.settings import load_settings

from .connector import DbConnector
from .influx_sink import InfluxSink
from .points import PowerLevels
from .settings import DbConnectorSettings


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    settings = load_settings(DbConnectorSettings, argv, prog="python -m db_connector",
                             environ=credentials.environ_for("db-connector"))
    try:
        PowerLevels.parse(settings.level_thresholds)
    except ValueError as error:
        raise SystemExit(f"--level-thresholds: {error}") from None
    stop = process_stop_signal()
    exit_on_thread_failure()
    tune_gc_for_streaming()
    DbConnector(settings, InfluxSink.from_settings(settings), stop).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
