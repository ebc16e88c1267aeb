"""The interpreter Spark's Python processes run (`session.spark_python`): the job's own, without Spark's archives
on its import path, every other entry kept in its order."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from spark_joiner.session import SPARK_PYTHON, executor_environment, spark_python

SHOW = "import json, os, sys; print(json.dumps([sys.executable, os.environ['PYTHONPATH']]))"


def test_spark_python_drops_only_spark_archives_from_the_path() -> None:
    lib = "/opt/spark/python/lib"
    given = ":".join([f"{lib}/pyspark.zip", "/srv/job files/*", f"{lib}/py4j-0.10.9.9-src.zip", "",
                      "/opt/spark/jars/spark-core_2.13-4.1.1.jar", "/srv/my-pyspark.zip", "/srv/app"])
    shown = subprocess.run([str(SPARK_PYTHON), "-c", SHOW], capture_output=True, text=True, check=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": given, "SPARK_JOINER_INTERPRETER": sys.executable})
    executable, path = json.loads(shown.stdout)
    assert executable == sys.executable
    assert path == "/srv/job files/*::/srv/my-pyspark.zip:/srv/app"


def test_spark_python_refuses_to_guess_an_interpreter() -> None:
    env = {name: value for name, value in os.environ.items() if name != "SPARK_JOINER_INTERPRETER"}
    result = subprocess.run([str(SPARK_PYTHON), "-c", "pass"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode != 0 and "SPARK_JOINER_INTERPRETER" in result.stderr


def test_the_job_runs_its_spark_processes_through_it_where_pyspark_is_installed(monkeypatch) -> None:
    monkeypatch.delenv("SPARK_JOINER_INTERPRETER", raising=False)
    assert spark_python() == str(SPARK_PYTHON)
    assert os.environ["SPARK_JOINER_INTERPRETER"] == sys.executable


def test_executors_started_by_a_cluster_get_the_interpreter_in_the_job_s_conf(monkeypatch) -> None:
    """A standalone cluster's worker starts the executors with its own environment, not the driver's."""
    monkeypatch.delenv("SPARK_JOINER_INTERPRETER", raising=False)
    monkeypatch.setenv("PYSPARK_PYTHON", spark_python())
    assert executor_environment() == {"spark.executorEnv.SPARK_JOINER_INTERPRETER": sys.executable}
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)  # a Python the user chose: nothing to pass on
    assert executor_environment() == {}
