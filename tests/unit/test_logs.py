"""The one logging setup: what it leaves out of every process's log."""
from __future__ import annotations

import logging

from pipeline_core.logs import PY4J_RETRY_NOTICE, configure_logging


def test_py4j_retried_command_notice_is_left_out(caplog) -> None:
    caplog.set_level(logging.INFO)
    configure_logging()
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError:
        logging.info(PY4J_RETRY_NOTICE, exc_info=True)  # as py4j logs it before it sends the command again
    logging.info("kept: another root record")
    logging.getLogger("py4j.java_gateway").info(PY4J_RETRY_NOTICE)  # the same words from a named logger
    assert [(record.name, record.getMessage()) for record in caplog.records] == [
        ("root", "kept: another root record"), ("py4j.java_gateway", PY4J_RETRY_NOTICE)]
