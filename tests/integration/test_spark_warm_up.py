"""A Spark session starts its executors' Python worker daemon by itself, in the background (`spark_joiner.warm_up`),
before any query runs: the first micro-batch of the job then finds it ready instead of starting it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from spark_support import worker_daemons

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# A session in a process of its own (its JVM ends with it): once the warm-up's thread is done, the JVM's pid; the
# session stays up until stdin closes.
PROBE = """
import sys, threading
from spark_joiner.session import spark_session
spark = spark_session("local[1]", app_name="warm-up-probe")
for thread in threading.enumerate():
    if thread.name == "python-workers":
        thread.join(120)
        assert not thread.is_alive(), "the warm-up did not finish"
print(spark.sparkContext._gateway.proc.pid, flush=True)
sys.stdin.read()
spark.stop()
"""


def test_a_new_session_starts_the_python_worker_daemon_before_any_query() -> None:
    probe = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        jvm_pid = int(probe.stdout.readline() or 0)
        assert jvm_pid, probe.stderr.read()[-3000:] if probe.poll() is not None else "no JVM pid"
        assert worker_daemons(jvm_pid) == 1
    finally:
        probe.stdin.close()
        assert probe.wait(120) == 0, probe.stderr.read()[-3000:]
