"""The one place a Spark session is built: connector jars from the local cache, RocksDB state, quiet logs
(the JVM's console through `logging`, see `console`).

The Kafka connector jars come from the project's Maven cache (``make setup`` fills it), so a session
starts without network. The environment variables must be set before the JVM starts, which is why
`spark_session` sets them and not the caller. Under spark-submit (`spark_joiner_job.py`) the JVM is
spark-submit's: the session takes its settings and adds only the job's own (`submitted_conf`).
"""
from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from pipeline_core.paths import SPARK_JARS

from . import class_archive
from .console import forward_console
from .settings import DEFAULT_SHUFFLE_PARTITIONS
from .warm_up import start_python_workers

log = logging.getLogger(__name__)

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"  # log4j2.properties
ARROW_BATCH_ROWS = 50_000
ARROW_NO_BYTE_LIMIT = 2**31 - 1  # Int.MaxValue: Spark's value for "no limit"
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# The throughput collector: no concurrent marking threads and cheaper write barriers than G1 (the default);
# its young pauses are short for this job's heap, which holds little beyond the current micro-batch.
THROUGHPUT_GC = "-XX:+UseParallelGC"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Exactly the connector and what it needs beyond pyspark's own jars (Scala, Hadoop, slf4j).
CONNECTOR_JARS = (
    "spark-sql-kafka-0-10_2.13-4.1.1.jar",
    "spark-token-provider-kafka-0-10_2.13-4.1.1.jar",
    "kafka-clients-3.9.1.jar",
    "commons-pool2-2.12.1.jar",
)


def connector_jars() -> list[Path]:
    """Paths of the Kafka connector jars in the cache; a clear error when `make setup` has not run."""
    jars = [SPARK_JARS / name for name in CONNECTOR_JARS]
    missing = [jar.name for jar in jars if not jar.is_file()]
    if missing:
        raise SystemExit(f"Spark's Kafka connector jars are missing from {SPARK_JARS}: {', '.join(missing)}; "
                         "run `make setup` (it resolves them from Maven Central once)")
    return jars


def prepare_environment() -> None:
    """Environment the JVM and the Python workers inherit: the conf dir, loopback, this Python."""
    # Empty: the class archive needs a class path without non-empty directories (class_archive); the log4j2
    # configuration is named by a system property instead (`_driver_java_options`).
    os.environ.setdefault("SPARK_CONF_DIR", str(class_archive.empty_conf_dir()))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Without these, workers would run whatever `python3` is on PATH, without our packages.
    os.environ.setdefault("PYSPARK_PYTHON", spark_python())
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


# This interpreter without Spark's archives on its import path (see the script).
SPARK_PYTHON = Path(__file__).resolve().with_name("spark_python.sh")


def spark_python() -> str:
    """The Python that Spark's Python processes run: `SPARK_PYTHON` over this interpreter (named to it in the
    environment the JVM inherits) where this environment has pyspark and py4j of its own, else this interpreter
    with Spark's archives."""
    installed = [importlib.util.find_spec(package) for package in ("pyspark", "py4j")]
    if not all(spec is not None and spec.origin and Path(spec.origin).is_file() for spec in installed):
        return sys.executable
    os.environ["SPARK_JOINER_INTERPRETER"] = sys.executable
    return str(SPARK_PYTHON)


def executor_environment() -> dict[str, str]:
    """The interpreter `SPARK_PYTHON` runs, for executors that do not inherit this process's environment (a
    standalone or other cluster's workers start them): without it the script refuses to run there."""
    interpreter = os.environ.get("SPARK_JOINER_INTERPRETER")
    if os.environ.get("PYSPARK_PYTHON") != str(SPARK_PYTHON) or not interpreter:
        return {}
    return {"spark.executorEnv.SPARK_JOINER_INTERPRETER": interpreter}


@contextmanager
def jvm_ignoring_sigterm() -> Iterator[None]:
    """Start the JVM with SIGTERM ignored (a signal ignored at exec stays ignored in the JVM): a stop signal to the
    whole process group, as `make down` sends, is this process's to handle. It stops the query, then Spark; had
    the JVM ended at once, the query's stop and Spark's would fail with py4j errors. SIGKILL still ends the JVM,
    and it exits by itself once this process is gone (its stdin closes)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may change a signal's handling
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def under_spark_submit() -> bool:
    """Whether spark-submit started this process. It then runs the driver's JVM itself and gives this process
    its gateway's address in the environment; PySpark connects to that JVM instead of starting one."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def job_options(shuffle_partitions: int) -> dict[str, str]:
    """What the job's results and its checkpoint depend on: set whoever started the JVM."""
    return {
        # Recorded beside the checkpoint's state (`checkpoint.prepare_checkpoint`), so the job's own setting.
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        # Each micro-batch commits a small changelog rather than a RocksDB snapshot; snapshots are taken by
        # the background maintenance. This cuts the fixed cost of every batch.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # A stopped query must not leave a state-store maintenance thread behind in tests.
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.sql.session.timeZone": "UTC",
        # Fewer, larger Arrow batches into the router and out of the join.
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_BATCH_ROWS),
        # Batches are bounded by their row count above. Any byte limit below Int.MaxValue makes the JVM measure
        # the Arrow batch after every row it writes for the Python workers (a few % of the JVM's CPU).
        "spark.sql.execution.arrow.maxBytesPerBatch": str(ARROW_NO_BYTE_LIMIT),
    }


# An executor's temporary files (RocksDB's and LZ4's unpacked native libraries) in its working dir, which every
# cluster manager gives it and removes with the application's (a killed executor leaves them in /tmp otherwise).
EXECUTOR_TEMP_DIR = "-Djava.io.tmpdir=."


# One Python worker daemon per executor for both of the job's Python steps. An executor keeps a daemon per distinct
# worker environment, and Spark's SQL runners (the router's mapInArrow) add SPARK_SIMPLIFIED_TRACEBACK=1 to it where
# the stateful operator's runner does not: the stateful step started a second daemon in the first micro-batch, which
# imported pandas, pyarrow and the engine all over again (1.4 s of a cold first batch here). Given to every worker,
# the variable makes the two environments one, and both steps' workers show the same tracebacks.
ONE_WORKER_DAEMON = {"spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1"}


def deployment_defaults(app_name: str, java_options: str) -> dict[str, str]:
    """Where and how the job runs, as this project runs it: under spark-submit only where spark-submit (its flags,
    `--conf`, spark-defaults.conf) left them unset."""
    return {
        "spark.app.name": app_name,
        "spark.executor.extraJavaOptions": f"{java_options} {EXECUTOR_TEMP_DIR}",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        **ONE_WORKER_DAEMON,
    }


def java_options(quick_jit: bool) -> str:
    # The JVM mostly moves bytes between Kafka, Python workers and the state store; on a small machine
    # its optimising compiler costs more CPU than it saves within a job's first minutes.
    return f"{QUICK_JIT} {THROUGHPUT_GC}" if quick_jit else THROUGHPUT_GC


def driver_temp_dir() -> Path:
    """The driver JVM's temporary files: Spark's local dirs (shuffle blocks, the session's artifacts) and the native
    libraries RocksDB and LZ4 unpack (about 15 MB a JVM), in a folder of their own under this process's temporary dir
    (the stack gives each program one under its state dir), removed when this process exits. The JVM, stopped with
    its Python process, leaves most of them behind, and a test session starts dozens of JVMs."""
    folder = Path(tempfile.mkdtemp(prefix="spark-driver-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _driver_java_options(quick_jit: bool, archive_at_exit: Path | None, temp_dir: Path) -> str:
    """The driver JVM's options: JIT and GC, its temporary files in `temp_dir`, the log4j2 configuration, and the
    class archive: mapped, or written at exit when `archive_at_exit` is given (`class_archive`)."""
    # Writing an archive, the JVM names every class it leaves out (signed jars, generated ones): no news.
    archive = (f"-XX:ArchiveClassesAtExit={archive_at_exit} -Xlog:cds=off,cds+dynamic=off" if archive_at_exit
               else class_archive.java_options())
    options = [java_options(quick_jit), f"-Djava.io.tmpdir={temp_dir}",
               f"-Dlog4j2.configurationFile={CONF_DIR / 'log4j2.properties'}", archive]
    return " ".join(shlex.quote(option) if option.startswith("-D") else option for option in options if option)


def spark_session(master: str = "local[*]", app_name: str = "spark-joiner",
                  shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
                  driver_memory: str = "1g", extra: dict[str, str] | None = None,
                  quick_jit: bool = True, archive_at_exit: Path | None = None) -> SparkSession:
    """A Spark session ready for the joiner: Kafka source, RocksDB state store, Arrow, quiet, its executors' Python
    workers starting in the background (`warm_up`). Once per process.

    Started as `python -m spark_joiner`, it starts the JVM with `master` and `driver_memory`, and reads the JVM's
    console into this process's logging (`console`). Under spark-submit, the JVM is spark-submit's and so are the
    master, the driver's memory, the jars and the logs: see `submitted_conf`."""
    if under_spark_submit():
        gateway = launch_gateway()  # spark-submit's JVM: no process of ours, no console to read
        conf = submitted_conf(SparkConf(_jvm=gateway.jvm), app_name, shuffle_partitions, quick_jit, extra)
    else:
        prepare_environment()
        temp_dir = driver_temp_dir()
        options = {
            "spark.master": master,
            "spark.jars": ",".join(str(jar) for jar in connector_jars()),
            "spark.driver.memory": driver_memory,
            "spark.driver.host": os.environ["SPARK_LOCAL_IP"],
            "spark.driver.bindAddress": os.environ["SPARK_LOCAL_IP"],
            "spark.driver.extraJavaOptions": _driver_java_options(quick_jit, archive_at_exit, temp_dir),
            # In local mode the executor is this JVM; a cluster's executors keep what their workers give them.
            **({"spark.local.dir": str(temp_dir)} if master.startswith("local") else {}),
            # Python workers without Spark's zip archives on their path (see worker_daemon).
            "spark.python.daemon.module": "spark_joiner.worker_daemon",
            **executor_environment(),
            **deployment_defaults(app_name, java_options(quick_jit)),
            **job_options(shuffle_partitions),
            **(extra or {}),
        }
        conf = SparkConf().setAll(list(options.items()))
        # The JVM's stdout and stderr, and with them the output of the Python processes it starts, into a pipe
        # this process reads: each line a log record, the lines that are no news at DEBUG.
        with jvm_ignoring_sigterm():
            gateway = launch_gateway(conf, popen_kwargs={"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT})
        forward_console(gateway.proc.stdout)
    context = SparkContext(conf=conf, gateway=gateway)
    if not under_spark_submit():
        context.setLogLevel("ERROR")  # under spark-submit, its log4j configuration decides
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    start_python_workers(spark)  # in the background, while the caller starts its query
    return spark


def submitted_conf(submitted: SparkConf, app_name: str, shuffle_partitions: int, quick_jit: bool,
                   extra: dict[str, str] | None = None) -> SparkConf:
    """The conf of a job spark-submit started: what spark-submit set (a property set here would override it), the
    project's deployment defaults where it set nothing, and the job's own options.

    Not set here: the master, the driver's memory and Java options, the jars (the driver's JVM runs already:
    spark-submit's `--master`, `--driver-memory`, `--jars`/`--packages` decide), the driver's address (on a
    cluster the executors must reach it) and the Python worker daemon (`worker_daemon` is importable on an
    executor only where the project is installed; set `spark.python.daemon.module` to use it)."""
    for key, value in deployment_defaults(app_name, java_options(quick_jit)).items():
        submitted.setIfMissing(key, value)
    submitted.setAll(list({**job_options(shuffle_partitions), **(extra or {})}.items()))
    given = f"{submitted.get('spark.jars', '')},{submitted.get('spark.jars.packages', '')}"
    if "spark-sql-kafka" not in given:
        log.warning("spark-submit was given no spark-sql-kafka jar (--jars or --packages); the Kafka source will "
                    "be found only if the cluster's Spark has it on its classpath")
    return submitted
