"""``python -m benchmarks.baseline COMMIT MODULE [ARGS...]``: a benchmark of an earlier commit beside the
current code, in the same run.

On these shared machines a figure moves by up to 2× from one minute to the next, so "faster than
before" is only measured side by side: the earlier commit's tree is exported from git into a temporary
folder and its own benchmark module runs there, as a subprocess, alternately with the current one
(``--rounds``), and both print their figures. ``--baseline-module`` names the module in the earlier
commit where it had another name (e.g. ``local_stream_buffer.bench`` before ``benchmarks.join_engine``).
Neither run's figures are recorded over `make bench`'s results: both write theirs into the temporary folder.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.results import RESULTS_DIR_ENV

REPOSITORY = Path(__file__).resolve().parent.parent


class BaselineUnavailable(RuntimeError):
    """The earlier commit cannot be exported (no git, or a clone without it)."""


@contextmanager
def exported_tree(revision: str) -> Iterator[Path]:
    """The files of ``revision`` in a temporary folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    try:
        archive = folder / "tree.tar"
        try:
            subprocess.run(["git", "-C", str(REPOSITORY), "archive", "--output", str(archive), revision],
                           check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", "") or error
            raise BaselineUnavailable(f"cannot export commit {revision}: {str(detail).strip()}") from None
        with tarfile.open(archive) as tar:
            # The "data" filter (no links or paths out of the folder) where this Python has it (3.11.4 on).
            tar.extractall(folder / "tree", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        # Downloads (Kafka, Spark's connector jars) are shared, not fetched again for the earlier code.
        if (REPOSITORY / ".cache").is_dir():
            (folder / "tree" / ".cache").symlink_to(REPOSITORY / ".cache")
        yield folder / "tree"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def import_path(tree: Path) -> str:
    """PYTHONPATH that makes ``tree``'s packages win over the installed (current) ones."""
    with open(tree / "pyproject.toml", "rb") as project:
        roots = tomllib.load(project)["tool"]["setuptools"]["packages"]["find"]["where"]
    return os.pathsep.join([str(tree), *(str(tree / root) for root in roots)])


def run_module(tree: Path, module: str, *args: str, results_dir: Path, timeout_s: float = 1800) -> str:
    """Run ``python -m module args`` on ``tree``'s code, its results (where it records any) into ``results_dir``;
    its standard output (its log goes to ours)."""
    environment = {**os.environ, "PYTHONPATH": import_path(tree), RESULTS_DIR_ENV: str(results_dir)}
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=tree, env=environment, stdout=subprocess.PIPE,
                          text=True, timeout=timeout_s)
    if done.returncode:
        raise RuntimeError(f"{module} of {tree} exited with {done.returncode}:\n{done.stdout[-3000:]}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.baseline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit", help="the earlier commit, as git names it")
    parser.add_argument("module", help="the benchmark module to run, e.g. benchmarks.kafka_joiner")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments, the same for both codes")
    parser.add_argument("--baseline-module", help="the module's name in the earlier commit, if another")
    parser.add_argument("--rounds", type=int, default=2, help="alternate runs of each code")
    options = parser.parse_args(argv)
    try:
        with exported_tree(options.commit) as tree:
            for round_ in range(1, options.rounds + 1):
                for label, code, module in ((f"commit {options.commit}", tree,
                                             options.baseline_module or options.module),
                                            ("current code", REPOSITORY, options.module)):
                    print(f"=== round {round_}, {label}: python -m {module} {' '.join(options.args)}", flush=True)
                    print(run_module(code, module, *options.args, results_dir=tree.parent / "results"), flush=True)
    except BaselineUnavailable as error:
        raise SystemExit(str(error)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
