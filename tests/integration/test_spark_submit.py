"""The Spark joiner submitted as the README says: `spark-submit` (the one of the installed pyspark) in local mode
with the package `make spark-package` builds (entry script, `--py-files` archive, `--jars`), on the shipped
events. Its machine.out, read with read_committed, equals the standalone joiner's (the engine's join of the same
records, ids included), and a SIGTERM to spark-submit's process group ends every process of the job."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pyspark
import pytest

from conftest import EVENTS_FILE
from fault_support import group_gone
from kafka_joiner_support import as_multiset, key_of, offline_join, rows_as_records
from spark_joiner.package import ARCHIVE_NAME, ENTRY_SCRIPT, build
from spark_joiner.session import CONF_DIR
from spark_support import OUTPUT_DEADLINE_S, SparkJoinerProcess, spark_joiners  # noqa: F401
from support import produce_records, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.spark]

SPARK_SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"
STOP_DEADLINE_S = 120


class SubmittedSparkJoiner(SparkJoinerProcess):
    """The job started by spark-submit from a built package, as a user would (own process group)."""

    def __init__(self, package: Path, bootstrap: str, topics, checkpoint: Path, log_dir: Path) -> None:
        super().__init__(bootstrap, topics, checkpoint, log_dir)
        jars = ",".join(str(jar) for jar in sorted((package / "jars").iterdir()))
        self.command = [
            str(SPARK_SUBMIT), "--master", "local[2]", "--driver-memory", "768m", "--jars", jars,
            "--py-files", str(package / ARCHIVE_NAME),
            # The driver and the Python workers: this interpreter, which has the third-party packages.
            "--conf", f"spark.pyspark.python={sys.executable}",
            str(package / ENTRY_SCRIPT.name),
            "--kafka-bootstrap-servers", bootstrap, "--input-topic", topics.data, "--output-topic", topics.out,
            "--dlq-topic", topics.dlq, "--checkpoint-dir", str(checkpoint), "--shuffle-partitions", "2",
            "--buckets", "8", "--trigger-s", "0.2", "--progress-interval-s", "2"]

    def stop_group(self) -> int:
        """SIGTERM to spark-submit's process group (its JVM, the Python driver, the Python workers), as a
        terminal's Ctrl-C or a supervisor would; returns spark-submit's exit code once every process is gone."""
        assert self.process.poll() is None, f"spark-submit had already ended ({self.process.returncode}) before " \
                                            "its SIGTERM"
        os.killpg(self.process.pid, signal.SIGTERM)
        returncode = self.process.wait(STOP_DEADLINE_S)
        wait_for(lambda: group_gone(self.process.pid), STOP_DEADLINE_S, "the job's processes to exit")
        return returncode


def test_spark_submit_of_the_package_equals_the_standalone_joiner(bootstrap, new_topics, spark_joiners, tmp_path,
                                                                   monkeypatch) -> None:
    # The project's quiet log4j configuration and the driver on loopback, as the README's local command has them.
    monkeypatch.setenv("SPARK_CONF_DIR", str(CONF_DIR))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    topics = new_topics()
    records = rows_as_records(EVENTS_FILE, time_order=True)
    expected, rejected = offline_join(records)
    assert len(expected) == 2748  # the power join of the shipped events
    produce_records(bootstrap, topics.data, records, key=key_of)

    package = build(tmp_path / "package")
    joiner = SubmittedSparkJoiner(package, bootstrap, topics, tmp_path / "checkpoint", tmp_path)
    spark_joiners.append(joiner)
    joiner.start()
    assert "on local[2]" in joiner.log()  # spark-submit's master, not the job's default

    wait_for(lambda: joiner.check_alive() or len(read_topic(bootstrap, topics.out, idle_s=0.3)) >= len(expected),
             OUTPUT_DEADLINE_S, f"{len(expected)} committed records in {topics.out}", interval_s=2)
    # The Python driver stops the query; spark-submit's JVM, which got the signal too, exits as a JVM does on it.
    assert joiner.stop_group() in (0, 143)
    outputs = read_topic(bootstrap, topics.out, idle_s=1.5)
    assert as_multiset([m.value for m in outputs]) == as_multiset(expected)
    assert all(m.key.decode() == f"{json.loads(m.value)['thing']}.{json.loads(m.value)['quantity']}"
               for m in outputs)
    letters = read_topic(bootstrap, topics.dlq, idle_s=1.0)
    assert len(letters) == len(rejected)
