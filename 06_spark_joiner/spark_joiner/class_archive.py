"""Spark's class archive (the JVM's AppCDS): where this environment's lies, and the driver JVM's option that maps it.
`python -m spark_joiner.build_class_archive` (run by `make setup`) builds it.

A cold JVM of this job loads and verifies some twenty thousand classes of Spark's jars before its first batch is
done; with them mapped from an archive, the session starts in 3-4 s instead of 8-11 s and the first (empty)
micro-batch takes 6-7 s instead of 10-11 s (measured side by side on this project's 2-core machine). The JVM
checks the archive against the class path and its jars at every start and ignores one that does not match, so a
stale archive costs nothing but the time it would have saved.

The class path may hold no non-empty directory for the JVM to use an archive: Spark puts SPARK_CONF_DIR on it,
so the sessions this package starts take an empty one and name their log4j2 configuration with a system
property instead (`session.prepare_environment`). Classes of the Kafka connector (`spark.jars`) come from
Spark's own class loader, which the JDK 17 archive does not cover: they load as before; so do a
spark-submitted driver's, whose SPARK_CONF_DIR holds its spark-defaults.conf.
"""
from __future__ import annotations

import hashlib
import sys
from importlib.metadata import version
from pathlib import Path

from pipeline_core.paths import CACHE_DIR

ARCHIVE_DIR = CACHE_DIR / "spark" / "class-archive"


def archive_file() -> Path:
    """This environment's archive: one per pyspark version and Python environment (its jars' paths)."""
    environment = hashlib.sha256(f"{version('pyspark')} {sys.prefix}".encode()).hexdigest()[:16]
    return ARCHIVE_DIR / f"driver-{environment}.jsa"


def empty_conf_dir() -> Path:
    """An empty SPARK_CONF_DIR: on the class path, an archive needs it empty."""
    directory = ARCHIVE_DIR / "empty-conf"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def java_options() -> str:
    """The driver JVM's option that maps the archive, when this environment has one."""
    archive = archive_file()
    return f"-XX:SharedArchiveFile={archive}" if archive.is_file() else ""
