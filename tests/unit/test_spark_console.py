"""The JVM's console lines as log records (spark_joiner.console): log4j's keep their level, the lines that are
no news go to DEBUG, and nothing else is lost."""
from __future__ import annotations

import io
import logging

import pytest

from spark_joiner.console import ConsoleLines, forward_console

LOGGER = "test.jvm"


def records_of(lines: list[str], caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    console = ConsoleLines(logging.getLogger(LOGGER))
    for line in lines:
        console.line(line + "\n")
    return [(record.levelno, record.getMessage()) for record in caplog.records if record.name == LOGGER]


def test_the_jvm_notice_and_the_stateful_workers_chatter_are_debug(caplog) -> None:
    records = records_of([
        "WARNING: Using incubator modules: jdk.incubator.vector",
        "Starting Streaming TransformWithStateInPandas Python worker.",
        "",
        "Streaming TransformWithStateInPandas Python worker Completed execution of UDF: <bound method ...>.",
    ], caplog)
    assert [level for level, _ in records] == [logging.DEBUG] * 3


def test_log4j_lines_keep_their_level_and_their_stack_traces_go_with_them(caplog) -> None:
    records = records_of([
        "ERROR MicroBatchExecution: Query spark_joiner terminated with error",
        "org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired",
        "\tat org.apache.kafka.clients.consumer.KafkaConsumer.poll(KafkaConsumer.java:1)",
        "Caused by: java.io.IOException: closed",
        "WARN NetworkClient: Connection to node 1 could not be established.",
    ], caplog)
    assert records == [
        (logging.ERROR, "MicroBatchExecution: Query spark_joiner terminated with error"),
        (logging.ERROR, "org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired"),
        (logging.ERROR, "\tat org.apache.kafka.clients.consumer.KafkaConsumer.poll(KafkaConsumer.java:1)"),
        (logging.ERROR, "Caused by: java.io.IOException: closed"),
        (logging.WARNING, "NetworkClient: Connection to node 1 could not be established."),
    ]


def test_a_stack_trace_continues_at_the_level_of_its_record(caplog) -> None:
    records = records_of([
        "ERROR Executor: Exception in task 0.0",
        "\tat org.apache.spark.api.python.BasePythonRunner.read(PythonRunner.scala:1)",
    ], caplog)
    assert [level for level, _ in records] == [logging.ERROR, logging.ERROR]


def test_a_python_traceback_of_a_worker_is_a_warning(caplog) -> None:
    records = records_of(["Traceback (most recent call last):", '  File "worker.py", line 1, in <module>',
                          "ValueError: broken"], caplog)
    assert [level for level, _ in records] == [logging.WARNING] * 3


def test_forward_console_reads_the_stream_to_its_end(caplog) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    stream = io.BytesIO(b"ERROR SparkContext: one\nnot utf-8 \xff\nWARNING: Using incubator modules: x\n")
    forward_console(stream, logging.getLogger(LOGGER)).join(5)
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER] == [
        (logging.ERROR, "SparkContext: one"), (logging.WARNING, "not utf-8 \ufffd"),
        (logging.DEBUG, "WARNING: Using incubator modules: x")]
    assert stream.closed
