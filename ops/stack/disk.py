"""What `make status` says of the disk: the filesystem holding the stack's state dir, what the servers'
data take of it, and a WARNING before it is full.

Kafka and InfluxDB are bounded by their retention (docs/operations.md), but a disk shared with other
things, or retention set larger than the disk, still fills: past STACK_DISK_WARN_USED_PERCENT (default 80)
or under STACK_DISK_WARN_FREE_GIB free (default 2), `status` says so and what to do.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline_core import paths
from .processes import StackError

WARN_USED_PERCENT = 80.0
WARN_FREE_GIB = 2.0
GIB = 1024**3
# The servers whose data `status` sizes, by their data dirs under the state dir (patterns: the cluster's Kafka
# nodes have one each, kafka-1/data ...).
SERVER_DATA = {"Kafka": "kafka*/data", "InfluxDB": "influxdb/data", "Mosquitto": "mosquitto/data"}


@dataclass(frozen=True)
class DiskUsage:
    path: Path
    total_bytes: int
    used_bytes: int
    free_bytes: int  # available to this user (what a server can still write)

    @property
    def used_ratio(self) -> float:
        """As `df` shows it: used of what is used or available (blocks reserved for root left out)."""
        usable = self.used_bytes + self.free_bytes
        return self.used_bytes / usable if usable else 0.0


def disk_usage(path: Path) -> DiskUsage:
    """The filesystem holding `path` (its nearest existing parent)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    usage = shutil.disk_usage(path)
    return DiskUsage(path, usage.total, usage.used, usage.free)


def directory_bytes(path: Path) -> int:
    """Bytes a directory tree takes on disk (allocated blocks, so sparse or preallocated files count as
    they are: Kafka preallocates its index files); 0 when it does not exist."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue  # deleted meanwhile (a segment removed by retention)
    return total


def thresholds() -> tuple[float, float]:
    """(used percent, free GiB) past which `status` warns, from the environment."""
    values = []
    for name, default in (("STACK_DISK_WARN_USED_PERCENT", WARN_USED_PERCENT),
                          ("STACK_DISK_WARN_FREE_GIB", WARN_FREE_GIB)):
        text = os.environ.get(name, str(default))
        try:
            values.append(float(text))
        except ValueError:
            raise StackError(f"{name}={text!r} is not a number") from None
    return values[0], values[1]


def warning(usage: DiskUsage, used_percent: float, free_gib: float) -> str | None:
    """The WARNING line when the filesystem is past either threshold, else None."""
    if usage.used_ratio * 100 < used_percent and usage.free_bytes >= free_gib * GIB:
        return None
    return (f"WARNING: the disk holding {usage.path} is {usage.used_ratio:.0%} used, {size(usage.free_bytes)} free "
            f"(warning past {used_percent:g} % or under {free_gib:g} GiB): free space, or lower the retention of "
            "Kafka and InfluxDB (docs/operations.md), before the servers stop writing")


def size(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return ""


@dataclass(frozen=True)
class DiskReport:
    """What `status` says of the disk: the filesystem, the servers' data on it, and the WARNING if any."""

    state_dir: Path
    usage: DiskUsage
    data_bytes: dict[str, int]  # server -> bytes its data takes
    warning: str | None

    def as_dict(self) -> dict[str, object]:
        return {"path": str(self.state_dir), "total_bytes": self.usage.total_bytes,
                "used_bytes": self.usage.used_bytes, "free_bytes": self.usage.free_bytes,
                "used_percent": round(self.usage.used_ratio * 100, 1), "data_bytes": dict(self.data_bytes),
                "warning": self.warning}


def measure(state_dir: Path | None = None, data: Iterable[tuple[str, str]] | None = None) -> DiskReport:
    """The filesystem's free space and use, the servers' data, and any WARNING."""
    state_dir = state_dir or paths.STATE_DIR
    usage = disk_usage(state_dir)
    sizes = {name: sum(directory_bytes(found) for found in state_dir.glob(pattern))
             for name, pattern in (data if data is not None else SERVER_DATA.items())}
    return DiskReport(state_dir, usage, sizes, warning(usage, *thresholds()))


def describe(state_dir: Path | None = None, data: Iterable[tuple[str, str]] | None = None,
             report: DiskReport | None = None) -> str:
    """`status`'s disk lines: the filesystem's free space and use, the servers' data, and any WARNING."""
    report = report or measure(state_dir, data)
    usage = report.usage
    sizes = ", ".join(f"{name} {size(count)}" for name, count in report.data_bytes.items())
    lines = [f"disk: {size(usage.free_bytes)} free of {size(usage.total_bytes)} ({usage.used_ratio:.0%} used) "
             f"on the filesystem of {report.state_dir}; data: {sizes}"]
    if report.warning:
        lines.append(report.warning)
    return "\n".join(lines)
