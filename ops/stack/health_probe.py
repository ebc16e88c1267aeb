"""`python -m stack.health_probe STAGE`: exit 0 while the stage is healthy by its heartbeat, 1 otherwise.

The Compose healthcheck of the pipeline's containers, by the same rule as `make status`
(`pipeline_core.stage_health.assess`): healthy when the stage made progress, or had nothing to do, within
its last reporting intervals; a process that is merely alive is not.

Contract:
* The stage writes its heartbeat where its setting PROGRESS_FILE (`--progress-file`) says; without it, it
  writes none.
* The probe reads `--file PATH` if given, else `$PROGRESS_FILE` (the container's own environment, the same
  the stage has), else `$STACK_STATE_DIR/STAGE/progress.json` (the native stack's place).
* STAGE names the stage in the verdict (`stream-connector`, `lsb-joiner`, `spark-joiner`, `db-connector`);
  the probe prints one line: `STAGE: <state>: <detail>`, state one of progressing, idle (exit 0), stuck,
  stale, missing (exit 1).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from pipeline_core import paths
from pipeline_core.stage_health import StageHealth, assess, read_heartbeat

PROGRESS_FILE_NAME = "progress.json"


def heartbeat_file(stage: str, environ: dict[str, str] | None = None) -> Path:
    """Where `stage`'s heartbeat is: $PROGRESS_FILE, else its place in the native stack's state dir."""
    environ = dict(os.environ) if environ is None else environ
    if environ.get("PROGRESS_FILE"):
        return Path(environ["PROGRESS_FILE"])
    return paths.STATE_DIR / stage / PROGRESS_FILE_NAME


def probe(path: Path, now: float | None = None) -> StageHealth:
    return assess(read_heartbeat(path), time.time() if now is None else now)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.health_probe", description=__doc__.split("\n")[0])
    parser.add_argument("stage", help="the stage's name, as its service is called")
    parser.add_argument("--file", type=Path, help="its heartbeat file (default: $PROGRESS_FILE, else "
                                                  "$STACK_STATE_DIR/STAGE/progress.json)")
    args = parser.parse_args(argv)
    verdict = probe(args.file or heartbeat_file(args.stage))
    print(f"{args.stage}: {verdict.state}: {verdict.detail}")
    return 0 if verdict.healthy else 1


if __name__ == "__main__":
    sys.exit(main())
