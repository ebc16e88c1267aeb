"""Entry point: ``python -m kafka_joiner [--flags]``; SIGTERM commits, then exits."""
from __future__ import annotations

import logging

from pipeline_core import credentials
from pipeline_core.lifecycle import exit_on_thread_failure, process_stop_signal
from pipeline_core.logs import announce_ready, configure_logging
from pipeline_core.runtime import tune_gc_for_streaming
from pipeline_core.settings import load_settings

from .service import KafkaJoiner
from .settings import KafkaJoinerSettings

log = logging.getLogger("kafka_joiner")


def main(argv: list[str] | None = None) -> None:
    settings = load_settings(KafkaJoinerSettings, argv, prog="python -m kafka_joiner",
                             environ=credentials.environ_for("lsb-joiner"))
    configure_logging()
    exit_on_thread_failure()
    joiner = KafkaJoiner(settings, process_stop_signal())
    joiner.start()
    tune_gc_for_streaming()
    announce_ready(log, f"kafka joiner {joiner.transactional_id}: {settings.input_topic} -> {settings.output_topic}")
    joiner.run()


if __name__ == "__main__":
    main()
