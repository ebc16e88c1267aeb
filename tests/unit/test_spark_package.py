"""The Spark joiner under spark-submit, without a JVM. The `--py-files` archive `make spark-package` builds holds
what the driver and executors import of the project: the packages the import graph lets the job import, and with
them alone (no source tree, no editable install) every module the driver and the Python workers load imports, and
the engine finds its join specs. The session's conf keeps what spark-submit set and adds the job's own options."""
from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile

from pyspark import SparkConf

from spark_joiner.package import PACKAGES, build, write_archive
from spark_joiner.session import submitted_conf
from unit.test_import_graph import ALLOWED

# What the driver runs (the entry script's main) and what the Python workers load (the router and the join, the
# worker daemon where it is used).
JOB_MODULES = ("spark_joiner.__main__", "spark_joiner.parse", "spark_joiner.processor", "spark_joiner.bucket_join",
               "spark_joiner.worker_daemon")

# Run with -S: no site-packages .pth file is read, so the project's editable install is not on the path, only
# the archive and the third-party packages.
IMPORT_FROM_ARCHIVE = """
import importlib, sys
sys.path[:0] = [sys.argv[1]]
sys.path.append(sys.argv[2])
for module in sys.argv[3:]:
    imported = importlib.import_module(module)
    assert imported.__file__.startswith(sys.argv[1]), (module, imported.__file__)
from local_stream_buffer.specs import load_join_specs
print(len(load_join_specs()))
"""


def test_the_archive_holds_the_packages_the_import_graph_allows_the_job(tmp_path) -> None:
    names = write_archive(tmp_path / "job.zip")
    assert {name.split("/")[0] for name in names} == {"spark_joiner"} | ALLOWED["spark_joiner"] == set(PACKAGES)
    assert "local_stream_buffer/join_specs.toml" in names
    assert not [name for name in names if "__pycache__" in name or not name.endswith((".py", ".toml", ".json"))]
    # Reproducible: the same sources give the same bytes.
    write_archive(tmp_path / "again.zip")
    assert (tmp_path / "job.zip").read_bytes() == (tmp_path / "again.zip").read_bytes()


def test_the_job_imports_from_the_archive_alone(tmp_path) -> None:
    package = build(tmp_path / "package")
    archive = package / "spark-joiner.zip"
    with zipfile.ZipFile(archive) as opened:
        assert opened.testzip() is None
    result = subprocess.run([sys.executable, "-S", "-c", IMPORT_FROM_ARCHIVE, str(archive),
                             sysconfig.get_paths()["purelib"], *JOB_MODULES],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) > 0  # the engine's join specs, read from inside the archive
    assert sorted(path.name for path in (package / "jars").iterdir()) == sorted(
        ["commons-pool2-2.12.1.jar", "kafka-clients-3.9.1.jar", "spark-sql-kafka-0-10_2.13-4.1.1.jar",
         "spark-token-provider-kafka-0-10_2.13-4.1.1.jar"])
    assert (package / "spark_joiner_job.py").is_file()


def test_under_spark_submit_its_settings_win_over_the_project_defaults_and_the_job_sets_its_own() -> None:
    given = {"spark.master": "spark://spark-master:7077", "spark.driver.memory": "3g", "spark.ui.enabled": "true",
             "spark.jars": "/opt/jars/spark-sql-kafka-0-10_2.13-4.1.1.jar", "spark.sql.shuffle.partitions": "99"}
    conf = submitted_conf(SparkConf(loadDefaults=False).setAll(list(given.items())), "spark-joiner",
                          shuffle_partitions=16, quick_jit=True)
    assert {key: conf.get(key) for key in ("spark.master", "spark.driver.memory", "spark.ui.enabled", "spark.jars")} \
        == {key: given[key] for key in ("spark.master", "spark.driver.memory", "spark.ui.enabled", "spark.jars")}
    assert conf.get("spark.app.name") == "spark-joiner"  # unset by spark-submit: the project's default
    # The checkpoint's state partitions are the job's --shuffle-partitions, whatever the submitter's conf says.
    assert conf.get("spark.sql.shuffle.partitions") == "16"
    assert conf.get("spark.sql.streaming.stateStore.providerClass").endswith("RocksDBStateStoreProvider")
    assert not conf.contains("spark.python.daemon.module") and not conf.contains("spark.driver.host")
