"""A peer that runs in its own virtualenv, as a subprocess the bench talks to through files and Kafka topics.

The bench writes the run's settings (``peer_io``) to a JSON file, starts ``<venv>/bin/python -m <module>
<settings.json>`` in a session of its own, reads the peer's status file for how far it got, reads its output
topic as every other peer's, and takes the CPU time of the subprocess's whole tree (its Python, and a JVM or
worker processes it starts) from /proc before stopping it.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pipeline_core.paths import REPO_ROOT

from local_stream_buffer.specs import AXIS_PLACEHOLDER, JoinSpec

from benchmarks.peers import peer_io, venvs
from benchmarks.peers.workload import Message
from benchmarks.spark_joiner import Topics, cpu_seconds_by_kind

log = logging.getLogger(__name__)


class RunInput(NamedTuple):
    """What a run feeds a peer: records, those a join spec reads (per spec they feed), reference pairs, the
    bound on its disorder (seconds of event time a record may arrive behind its series' newest), and the
    number of messages appended to each partition (the end offsets of the run's fresh input topic)."""

    records: int
    joinable: int
    pairs: int
    max_out_of_orderness_s: float = 0.0
    end_offsets: tuple[int, ...] = ()


def end_offsets_of(messages: Iterable[Message], partitions: int) -> tuple[int, ...]:
    """Messages per partition: the end offsets of a fresh topic they are appended to (no transactions)."""
    counts = [0] * partitions
    for message in messages:
        counts[message.partition] += 1
    return tuple(counts)


def peer_specs(specs: Sequence[JoinSpec]) -> list[dict[str, Any]]:
    """The join specs as a peer's script reads them (``peer_io.PeerSpec``)."""
    entries = []
    for spec in specs:
        prefix, _, suffix = spec.output.partition(AXIS_PLACEHOLDER)
        entries.append({"name": spec.name, "left_regex": side_regex(spec.left, spec.axis_pattern),
                        "right_regex": side_regex(spec.right, spec.axis_pattern),
                        "output_prefix": prefix if AXIS_PLACEHOLDER in spec.output else spec.output,
                        "output_suffix": suffix, "formula": spec.formula,
                        "delta_ms": None if spec.delta_time_s is None else spec.delta_time_s * 1000})
    return entries


def side_regex(pattern: str, axis_pattern: str) -> str:
    """A quantity pattern as an anchored regular expression whose group 1 is the axis (empty without one),
    escaped so that Python's ``re`` and Java's ``Pattern`` read it alike."""
    if AXIS_PLACEHOLDER not in pattern:
        return f"^{re.escape(pattern)}()$"
    prefix, suffix = pattern.split(AXIS_PLACEHOLDER, 1)
    return f"^{re.escape(prefix)}({axis_pattern}){re.escape(suffix)}$"


class SubprocessPeer:
    """One peer script in its venv. ``done`` is the script's status: all input records read (and, with
    ``count_joinable``, all records of the join's own intermediate topics), or a bounded job finished."""

    def __init__(self, name: str, venv: str, module: str, bootstrap: str, workdir: Path, specs: Sequence[JoinSpec],
                 commit_interval_s: float, options: dict[str, Any] | None = None, count_joinable: bool = False,
                 runs_to_end: bool = False) -> None:
        self.name, self.venv, self.module = name, venv, module
        self.bootstrap, self.workdir, self.specs = bootstrap, workdir, specs
        self.commit_interval_s, self.options = commit_interval_s, options or {}
        self.count_joinable, self.runs_to_end = count_joinable, runs_to_end
        self.python = venvs.peer_python(venv)  # made now, not within a measured run
        self.process: subprocess.Popen | None = None

    def start(self, topics: Topics, run: RunInput, live: bool) -> None:
        run_dir = self.workdir / f"{self.venv}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True)
        self.status_file, self.log_file = run_dir / "status.json", run_dir / "peer.log"
        settings = {"bootstrap": self.bootstrap, "input_topic": topics.data, "output_topic": topics.out,
                    "group": f"join-peers-{self.venv}.{topics.data}", "state_dir": str(run_dir / "state"),
                    "status_file": str(self.status_file), "commit_interval_s": self.commit_interval_s,
                    "max_out_of_orderness_s": run.max_out_of_orderness_s, "end_offsets": list(run.end_offsets),
                    "specs": peer_specs(self.specs), **self.options}
        settings_file = run_dir / "settings.json"
        settings_file.write_text(json.dumps(settings))
        # Its temporary files (a JVM's too: Flink's upload folder) in the run's folder, which the bench removes.
        temp_dir = run_dir / "tmp"
        temp_dir.mkdir()
        environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(temp_dir),
                       "JAVA_TOOL_OPTIONS": f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} -Djava.io.tmpdir={temp_dir}".strip()}
        with self.log_file.open("w") as output:
            self.process = subprocess.Popen([str(self.python), "-m", self.module, str(settings_file)],
                                            cwd=REPO_ROOT, env=environment,
                                            stdout=output, stderr=subprocess.STDOUT, start_new_session=True)

    def status(self) -> dict[str, Any]:
        return peer_io.read_status(self.status_file)

    def done(self, run: RunInput) -> bool:
        status = self.status()
        if status.get("error"):
            raise RuntimeError(f"{self.name}: {status['error']}")
        if self.process.poll() is not None and not status.get("finished"):
            raise RuntimeError(f"{self.name}: the peer exited with {self.process.returncode}:\n{self.log_tail()}")
        if self.runs_to_end:
            return bool(status.get("finished"))
        return (status.get("inputs", 0) >= run.records
                and (not self.count_joinable or status.get("joinable", 0) >= run.joinable))

    def first_input_at(self) -> float | None:
        return self.status().get("first_input_at")

    def stop(self) -> float:
        """Stop the subprocess's session; its tree's CPU seconds, read while it still runs."""
        cpu = sum(cpu_seconds_by_kind(self.process.pid).values())
        for each_signal, wait_s in ((signal.SIGTERM, 60), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, each_signal)
            except ProcessLookupError:
                break
            try:
                self.process.wait(wait_s)
                # Its children (a JVM) may outlive it for a moment: the session goes as a whole.
                deadline = time.monotonic() + wait_s
                while _session_alive(self.process.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not _session_alive(self.process.pid):
                    break
            except subprocess.TimeoutExpired:
                continue
        return cpu

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


def _session_alive(session_id: int) -> bool:
    try:
        os.killpg(session_id, 0)
        return True
    except ProcessLookupError:
        return False
