"""The JVM's console, as this process's log records: Spark's log4j lines, the JVM's own warnings and what the
Python processes Spark starts print, each line through `logging` (logger ``spark_joiner.jvm``).

Lines that are no news to an operator go to DEBUG: the JVM's notice about the incubator module Spark adds to
every JVM it starts (``--add-modules=jdk.incubator.vector``, which no flag silences), and the lines
``transformWithStateInPandas``'s driver-side Python worker prints at the start of every query. Everything
else keeps its level: log4j's (see ``conf/log4j2.properties``, whose pattern this module reads), and WARNING
for a line of unknown origin, such as a Python traceback, with the lines that continue a log4j record at its
level.
"""
from __future__ import annotations

import logging
import re
import threading
from typing import IO

log = logging.getLogger("spark_joiner.jvm")

# conf/log4j2.properties writes `LEVEL Logger: message` (the time comes from this process's logging).
_LOG4J_LINE = re.compile(r"^(TRACE|DEBUG|INFO|WARN|ERROR|FATAL) (\S+): (.*)$")
_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
# What log4j's `%ex` writes after a record: the exception's class (fully qualified) and message, its stack
# frames (indented), and its causes.
_CONTINUES = re.compile(r"^(\s|Caused by: |Suppressed: |[a-z][\w$]*(\.[\w$]+)+(: |$))")
NO_NEWS = (
    re.compile(r"^WARNING: Using incubator modules: "),
    re.compile(r"^(Starting )?Streaming TransformWithStateInPandas Python worker"),
)


class ConsoleLines:
    """Turns the JVM's console lines into log records; a line that continues a log4j record keeps its level."""

    def __init__(self, logger: logging.Logger = log) -> None:
        self._log = logger
        self._level = logging.WARNING  # of the record a continuation line belongs to

    def line(self, text: str) -> None:
        text = text.rstrip()
        if not text.strip():
            return
        if any(pattern.match(text) for pattern in NO_NEWS):
            self._log.debug("%s", text)
            return
        record = _LOG4J_LINE.match(text)
        if record:
            self._level = _LEVELS[record.group(1)]
            self._log.log(self._level, "%s: %s", record.group(2), record.group(3))
        elif _CONTINUES.match(text):
            self._log.log(self._level, "%s", text)  # an exception and its stack trace, with their record
        else:
            self._level = logging.WARNING
            self._log.warning("%s", text)


def forward_console(stream: IO[bytes], logger: logging.Logger = log) -> threading.Thread:
    """Read `stream` (the JVM's stdout and stderr) line by line into `logger` until it closes, in a daemon thread."""
    lines = ConsoleLines(logger)

    def pump() -> None:
        with stream:
            for raw in iter(stream.readline, b""):
                lines.line(raw.decode("utf-8", errors="replace"))

    thread = threading.Thread(target=pump, name="jvm-console", daemon=True)
    thread.start()
    return thread
