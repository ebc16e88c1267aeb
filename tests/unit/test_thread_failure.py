"""A thread that dies of an uncaught exception ends its stage's process, so supervision restarts it: a stage
whose main loop lives on while a thread it waits on is gone looks alive and does nothing (the Spark joiner's sink
runs on Py4J's callback thread)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

from pipeline_core.lifecycle import THREAD_FAILURE_EXIT_CODE

PROGRAM = textwrap.dedent("""
    import sys, threading
    from pipeline_core.lifecycle import exit_on_thread_failure, process_stop_signal
    from pipeline_core.logs import configure_logging

    configure_logging()
    exit_on_thread_failure()
    if sys.argv[1] == "stopping":
        process_stop_signal().set("a test's stop")

    def fail():
        raise {error}

    worker = threading.Thread(target=fail, name="worker")
    worker.start()
    worker.join()
    print("main thread went on")
""")


def run(error: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM.format(error=error), *(args or ("running",))],
                          capture_output=True, text=True, timeout=60)


def test_an_exception_that_ends_a_thread_ends_the_process_with_its_log() -> None:
    done = run("ValueError('a worker failed')")
    assert done.returncode == THREAD_FAILURE_EXIT_CODE, done
    assert "main thread went on" not in done.stdout
    assert "worker died of ValueError: a worker failed" in done.stderr, done.stderr


def test_a_system_exit_on_a_thread_ends_the_process_too() -> None:
    # What `KafkaStartupError` is: on a thread, Python would drop it silently.
    done = run("SystemExit('Kafka still answered _TRANSPORT')")
    assert done.returncode == THREAD_FAILURE_EXIT_CODE, done
    assert "worker died of SystemExit" in done.stderr, done.stderr


def test_while_stopping_a_failed_thread_is_only_logged() -> None:
    done = run("ValueError('a worker failed at shutdown')", "stopping")
    assert done.returncode == 0, done
    assert "main thread went on" in done.stdout
    assert "worker died of ValueError" in done.stderr
