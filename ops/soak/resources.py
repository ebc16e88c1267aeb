"""What each of the stack's programs holds and spends, read from /proc: the resident memory and CPU time of its
whole process tree (the Spark joiner is a Python driver, a JVM and Python workers), and what the servers' data,
the Spark checkpoint and each Kafka topic take on disk."""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from stack.disk import directory_bytes

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class TreeUsage:
    rss_bytes: int
    cpu_s: float  # user + system time of the tree's live processes, and of the children they reaped
    processes: int


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def children_map() -> dict[int, list[int]]:
    """Every live process's children, by parent PID."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def tree(pid: int, children: Mapping[int, list[int]]) -> list[int]:
    """`pid` and every process under it."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending += children.get(current, [])
    return found


def tree_usage(pid: int, children: Mapping[int, list[int]]) -> TreeUsage | None:
    """The memory and CPU time of `pid`'s tree; None when `pid` is gone."""
    rss, cpu_ticks, count = 0, 0, 0
    for member in tree(pid, children):
        fields = _stat(member)
        if fields is None:
            if member == pid:
                return None
            continue
        # After ")": state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14) ... rss(21)
        cpu_ticks += sum(int(value) for value in fields[11:15])
        rss += int(fields[21]) * PAGE_BYTES
        count += 1
    return TreeUsage(rss, cpu_ticks / CLOCK_TICKS, count)


def programs_usage(pids: Mapping[str, int | None]) -> dict[str, TreeUsage]:
    """The usage of each named program's tree (programs without a running process left out)."""
    children = children_map()
    usage = {}
    for name, pid in pids.items():
        if pid:
            found = tree_usage(pid, children)
            if found is not None:
                usage[name] = found
    return usage


def topic_bytes(log_dirs: Iterable[Path]) -> dict[str, int]:
    """Bytes each topic takes in Kafka's log directories (a partition's folder is `<topic>-<partition>`)."""
    sizes: dict[str, int] = {}
    for log_dir in log_dirs:
        if not log_dir.is_dir():
            continue
        for entry in os.scandir(log_dir):
            topic, _, partition = entry.name.rpartition("-")
            if entry.is_dir() and topic and partition.isdigit():
                sizes[topic] = sizes.get(topic, 0) + directory_bytes(Path(entry.path))
    return sizes
