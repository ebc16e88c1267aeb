"""The class archive `make setup` builds (spark_joiner.class_archive) is the one a Spark session's JVM maps, and
the log4j2 configuration, now named by a system property rather than found in SPARK_CONF_DIR, still rules the
JVM's logs. An archive the JVM ignored would cost nothing visible but the seconds it saves: this is where it shows.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from spark_joiner.class_archive import archive_file

pytestmark = pytest.mark.integration

# A session in a process of its own (its JVM ends with it): the files the JVM maps, and its root logger's level.
PROBE = """
import json, pathlib
from spark_joiner.session import spark_session
spark = spark_session("local[1]", app_name="class-archive-probe")
pid = spark.sparkContext._gateway.proc.pid
maps = pathlib.Path(f"/proc/{pid}/maps").read_text()
level = spark._jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel().toString()
print(json.dumps({"maps": sorted({line.split()[-1] for line in maps.splitlines() if line.endswith(".jsa")}),
                  "root_level": level}))
spark.stop()
"""


def test_a_session_maps_the_archive_make_setup_built_and_keeps_the_log_configuration() -> None:
    archive = archive_file()
    assert archive.is_file(), f"make setup builds {archive}"
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=180)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert str(archive) in seen["maps"], seen["maps"]
    assert seen["root_level"] == "ERROR"  # 06_spark_joiner/conf/log4j2.properties: rootLogger.level = error
