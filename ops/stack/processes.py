"""What the stack needs to know of processes apart from supervisord: errors a user must act on,
command lines, who holds a port, the end of a log (read from its end: logs are large)."""
from __future__ import annotations

import codecs
import errno
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TextIO


class StackError(RuntimeError):
    """A failure a user must act on; the message says what happened and what to do."""


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses): the state
    first; None when no such process runs."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc/<pid>/stat): with the PID, it tells one
    process from a later one that reuses the PID. None when no such process runs."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def parent_pid(pid: int) -> int | None:
    """The parent of process `pid` (/proc/<pid>/stat); None when no such process runs."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def process_state(pid: int) -> str | None:
    """The state letter of process `pid` (/proc/<pid>/stat: R, S, T when stopped by SIGSTOP, Z, ...); None when no
    such process runs."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies are dead) of process group `pgid` (/proc/<pid>/stat)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))) is not None and len(fields) > 2 \
                and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def command_line(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on `host`:`port` now (0.0.0.0: on every address, so a listener on any one
    holds it). A `host` that is no address of this host, or no name that resolves, raises StackError: no server
    here can listen on it."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except socket.gaierror as error:
            raise StackError(f"{host!r} does not resolve to an address of this host ({error.strerror})") from None
        except OSError as error:
            if error.errno == errno.EADDRNOTAVAIL:
                raise StackError(f"{host} is no address of this host: no server here can listen on it") from None
            return False
    return True


def free_loopback_ports(count: int) -> list[int]:
    """`count` distinct loopback ports nothing listens on now, as the system offers them, for a server of its own
    beside others (a private stack, a provisioning broker)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:  # all bound at once: the system hands out distinct ports
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def port_holder(port: int) -> str:
    """Who listens on `port`, e.g. 'java (pid 1234)', as far as `ss` can tell."""
    try:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "another process"
    match = re.search(r'users:\(\("([^"]+)",pid=(\d+)', out)
    return f"{match.group(1)} (pid {match.group(2)})" if match else "another process"


# The most `tail` reads of a file, whatever its size: a few thousand typical log lines.
TAIL_MAX_BYTES = 1024 * 1024
_TAIL_BLOCK_BYTES = 64 * 1024


def tail_bytes(path: Path, max_bytes: int = TAIL_MAX_BYTES, lines: int | None = None) -> bytes:
    """The end of a file, read backwards from its end in blocks: at most `max_bytes`, and no more than
    holds the last `lines` lines (when given). Raises OSError when it cannot be read."""
    with open(path, "rb") as file:
        end = file.seek(0, 2)
        start, data = end, b""
        while start > max(0, end - max_bytes) and (lines is None or data.count(b"\n") <= lines):
            step = min(_TAIL_BLOCK_BYTES, start - max(0, end - max_bytes))
            start -= step
            file.seek(start)
            data = file.read(step) + data
        return data


def tail(path: Path, lines: int = 20, max_bytes: int = TAIL_MAX_BYTES) -> str:
    """The last `lines` lines of a log, reading at most `max_bytes` from its end."""
    if lines <= 0:
        return ""
    try:
        data = tail_bytes(path, max_bytes, lines)
    except OSError:
        return "(no log written)"
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def follow(path: Path, lines: int, out: TextIO, interval_s: float = 0.25,
           should_stop: Callable[[], bool] = lambda: False) -> None:
    """`tail -F`: the last `lines` lines of a log, then every line written to it, across rotations (supervisord
    renames a full log to `<log>.1` and starts a new one: what is left of the old one is read, then the new one
    from its start) and truncation, until `should_stop()`; polled every `interval_s`."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    handle: BinaryIO | None = None
    inode = None
    first = True
    try:
        while not should_stop():
            if handle is None:
                try:
                    handle = open(path, "rb")
                except FileNotFoundError:
                    time.sleep(interval_s)
                    continue
                inode = os.fstat(handle.fileno()).st_ino
                if first:  # the last lines, up to where the file ended when opened: nothing missed, nothing twice
                    end = handle.seek(0, 2)
                    start = handle.seek(max(0, end - TAIL_MAX_BYTES))
                    text = handle.read(end - start).decode(errors="replace")
                    out.write("".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else "")
                    out.flush()
                    first = False
            chunk = handle.read(_TAIL_BLOCK_BYTES)
            if chunk:
                out.write(decoder.decode(chunk))
                out.flush()
                continue
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is None or current.st_ino != inode or current.st_size < handle.tell():
                handle.close()  # rotated or truncated: all of the old file was read
                handle = None
                continue
            time.sleep(interval_s)
    finally:
        if handle is not None:
            handle.close()
