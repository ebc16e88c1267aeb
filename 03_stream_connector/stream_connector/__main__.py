"""`python -m stream_connector`: bridge MQTT machine-state rows into Kafka until SIGTERM."""
from __future__ import annotations

import logging
import sys

from pipeline_core import credentials
from pipeline_core.lifecycle import exit_on_thread_failure, process_stop_signal
from pipeline_core.logs import configure_logging
from pipeline_core.runtime import tune_gc_for_streaming
from pipeline_core.settings import load_settings

from .connector import Connector
from .filters import FilterError
from .settings import ConnectorSettings

log = logging.getLogger("stream_connector")


def main(argv: list[str] | None = None) -> int:
    settings = load_settings(ConnectorSettings, argv, prog="python -m stream_connector",
                             environ=credentials.environ_for("stream-connector"))
    configure_logging()
    exit_on_thread_failure()
    try:
        connector = Connector(settings, process_stop_signal())
    except FilterError as error:
        log.error("%s", error)
        return 2
    tune_gc_for_streaming()
    return connector.run()


if __name__ == "__main__":
    sys.exit(main())
