"""One logging setup for every process of the pipeline."""
from __future__ import annotations

import logging
import os

READY_MARKER = "READY"
# py4j logs this on the root logger, at INFO and with a traceback, when a pooled connection to the JVM turns out
# closed; it then sends the command again on a new connection, and raises only if that fails too.
PY4J_RETRY_NOTICE = "Exception while sending command."


def _not_py4j_retry_notice(record: logging.LogRecord) -> bool:
    return not (record.levelno == logging.INFO and record.msg == PY4J_RETRY_NOTICE)


def configure_logging(level: str | None = None) -> None:
    """Log to stderr as `time level logger: message`; LOG_LEVEL overrides the default INFO."""
    logging.basicConfig(
        level=(level or os.environ.get("LOG_LEVEL", "INFO")).upper(),
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
    )
    # On the root logger itself: its filters see only what is logged on it, as py4j logs this, whatever handlers
    # come and go.
    root = logging.getLogger()
    if _not_py4j_retry_notice not in root.filters:
        root.addFilter(_not_py4j_retry_notice)


def ready_marker(pid: int) -> str:
    """How the READY line of process `pid` begins: supervisord restarts a stage under the same log,
    so the stack tells the running process's READY from its predecessors' by the PID."""
    return f"{READY_MARKER} pid={pid}:"


def announce_ready(logger: logging.Logger, what: str) -> None:
    """Log the line the stack manager waits for before it calls a pipeline process healthy."""
    logger.info("%s %s", ready_marker(os.getpid()), what)
