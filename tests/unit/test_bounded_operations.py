"""Bounded logs and data, the pure parts: a log's tail is read from its end whatever the file's size,
supervisord rotates every log it writes, retention durations and size bounds are checked, and the disk
warning fires past either threshold."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline_core.influx_retention import RetentionSettings, duration_s, policies
from pipeline_core.topics import PIPELINE_TOPICS
from stack import disk, supervision
from stack.processes import StackError, TAIL_MAX_BYTES, tail
from stack.services import PipelineProcess

GIB = 1024**3


def _bytes_read() -> int:
    """What this process has read through system calls so far (/proc/self/io rchar)."""
    return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])


def test_tail_reads_a_bounded_end_of_a_huge_log(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    with open(log, "wb") as file:
        file.truncate(256 * 1024**2)  # sparse: 256 MiB of NULs to read if tail read the whole file
        file.seek(0, 2)
        file.write(b"".join(b"line %d\n" % number for number in range(100_000)))
    before = _bytes_read()
    assert tail(log, 3) == "line 99997\nline 99998\nline 99999"
    assert _bytes_read() - before < 256 * 1024  # a few blocks from the end, not the file
    before = _bytes_read()
    assert len(tail(log, 10**9).splitlines()) > 1000  # asked for everything: gets at most TAIL_MAX_BYTES
    assert _bytes_read() - before <= TAIL_MAX_BYTES + 4096


def test_supervisord_rotates_every_log_it_writes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("pipeline_core.paths.STATE_DIR", tmp_path)
    monkeypatch.setenv("STACK_LOG_MAX_BYTES", "12345")
    monkeypatch.setenv("STACK_LOG_BACKUPS", "3")
    config = supervision.render_config([PipelineProcess("a-stage", "a_module")]).read_text()
    assert "logfile_maxbytes=12345\nlogfile_backups=3" in config  # supervisord's own
    assert "stderr_logfile_maxbytes=12345\nstderr_logfile_backups=3" in config  # its event listener
    assert "stdout_logfile_maxbytes=12345\nstdout_logfile_backups=3" in config  # the program
    assert "maxbytes=0" not in config
    monkeypatch.setenv("STACK_LOG_MAX_BYTES", "0")  # supervisord's "never rotate"
    with pytest.raises(StackError, match="STACK_LOG_MAX_BYTES"):
        supervision.render_config([])


def test_retention_durations_are_checked_and_compared_as_influxdb_shows_them() -> None:
    assert duration_s("30d") == duration_s("720h0m0s") == 30 * 86400
    assert duration_s("104w") == duration_s("17472h0m0s") and duration_s("INF") == duration_s("0s") == 0
    for wrong in ("30 days", "1.5d", "30m"):
        with pytest.raises(ValueError, match="INFLUXDB_RAW_RETENTION"):
            policies(RetentionSettings(influxdb_raw_retention=wrong))
    assert policies(RetentionSettings()) == {"raw": "30d", "joined": "90d", "health": "7d", "history": "104w"}


def test_every_pipeline_topic_is_bounded_by_size_as_well_as_time() -> None:
    for topic in PIPELINE_TOPICS:
        assert int(topic.config["retention.bytes"]) > 0 and int(topic.config["retention.ms"]) > 0, topic.name


def test_the_disk_warning_fires_past_either_threshold() -> None:
    def usage(used_gib: float, free_gib: float) -> disk.DiskUsage:
        return disk.DiskUsage(Path("/state"), int((used_gib + free_gib) * GIB), int(used_gib * GIB),
                              int(free_gib * GIB))

    assert disk.warning(usage(50, 50), 80, 2) is None
    assert "81% used" in disk.warning(usage(81, 19), 80, 2)
    assert "1.0 GiB free" in disk.warning(usage(1, 1), 80, 2)  # half used, but under 2 GiB free


def test_status_sizes_the_servers_data(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "kafka" / "data").mkdir(parents=True)
    (tmp_path / "kafka" / "data" / "segment.log").write_bytes(b"x" * 100_000)
    monkeypatch.setenv("STACK_DISK_WARN_USED_PERCENT", "0")  # any disk is "full"
    text = disk.describe(tmp_path)
    assert f"on the filesystem of {tmp_path}; data: Kafka " in text and "InfluxDB 0 B, Mosquitto 0 B" in text
    assert disk.directory_bytes(tmp_path / "kafka") >= 100_000
    assert text.splitlines()[1].startswith("WARNING: the disk holding")


def test_status_sizes_the_data_of_every_kafka_node_of_the_cluster(tmp_path: Path) -> None:
    for node in (1, 2, 3):
        (tmp_path / f"kafka-{node}" / "data").mkdir(parents=True)
        (tmp_path / f"kafka-{node}" / "data" / "segment.log").write_bytes(b"x" * 1024 * 1024)
    (tmp_path / "kafka-cluster-id").write_text("id")
    sizes = disk.describe(tmp_path).splitlines()[0].split("data: ")[1]
    assert sizes.startswith("Kafka 3.0 MiB, ")


def test_every_compose_container_s_log_rotates() -> None:
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        options = service.get("logging", {}).get("options", {})
        assert options.get("max-size") and options.get("max-file"), name
