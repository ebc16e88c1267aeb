"""The join specs the stack runs: the one file every joiner process reads, and a spec file checked as they load it.

The joiners read their specs from one file in the state dir (`live_file`; on hosts, storage every joiner's host
reaches): written at the first `up` from KAFKA_JOINER_JOIN_SPECS or SPARK_JOINER_JOIN_SPECS when one is given (the
shipped `join_specs.toml` otherwise), and by `python -m stack specs` from then on (`spec_change`); an `up` with one
of those variables set writes it again. A file is checked by `python -m local_stream_buffer.spec_changes`, a
process of its own: the stack imports no stage.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipeline_core import paths
from .processes import StackError

SHIPPED_FILE = paths.REPO_ROOT / "05_local_stream_buffer" / "local_stream_buffer" / "join_specs.toml"
# The variable of each joiner naming its spec file (kafka_joiner.settings, spark_joiner.settings).
VARIABLES = {"lsb": "KAFKA_JOINER_JOIN_SPECS", "spark": "SPARK_JOINER_JOIN_SPECS"}
CHECK_TIMEOUT_S = 60.0


def live_file() -> Path:
    return paths.STATE_DIR / "join-specs" / "join_specs.toml"


def environment() -> dict[str, str]:
    """What every joiner process is given: the stack's spec file."""
    return {variable: str(live_file()) for variable in VARIABLES.values()}


def ensure_live_file(joiner: str) -> None:
    """Before `up` starts a joiner: the stack's spec file from the joiner's variable when it is set, else as it is,
    else the shipped one."""
    given = os.environ.get(VARIABLES[joiner])
    target = live_file()
    if given:
        source = Path(given)
        if not source.is_file():
            raise StackError(f"{VARIABLES[joiner]}={given}: no such file")
        write(target, source.read_bytes())
    elif not target.exists():
        write(target, SHIPPED_FILE.read_bytes())


def write(target: Path, content: bytes) -> None:
    """Replace `target` whole: a joiner starting meanwhile reads the old file or the new one, never half."""
    if target.exists() and target.read_bytes() == content:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(content)
    os.replace(partial, target)


def check(path: Path) -> dict:
    """The spec file at `path` as the joiners would load it, and what it changes of the stack's: the checker's JSON;
    StackError naming what is wrong."""
    if not path.is_file():
        raise StackError(f"{path}: no such file; nothing was changed")
    running = live_file() if live_file().exists() else SHIPPED_FILE
    done = subprocess.run([sys.executable, "-m", "local_stream_buffer.spec_changes", str(path), str(running)],
                          capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    try:
        document = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StackError(f"checking {path} failed: {done.stdout}{done.stderr}") from None
    if "error" in document:
        raise StackError(f"{path} refused, nothing was stopped: {document['error']}")
    return document
