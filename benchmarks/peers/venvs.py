"""Each peer's own virtualenv under ``.cache/peers/``, made on first use.

The peers' packages pin what this project must not be held to (Quix Streams 3.28 holds confluent-kafka below
2.13; PyFlink 2.2 wants pandas < 2.3, pyarrow < 21 and py4j 0.10.9.7), so none of them is in the project's
environment: ``make up`` and ``make test`` never install them. A peer runs as a subprocess of its venv's Python,
with this repository on its path for its own script only (the script imports nothing of the project).

A venv is remade when its requirements change (a stamp file holds them); a failed install leaves no stamp.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import venv
from pathlib import Path

from pipeline_core.paths import CACHE_DIR, KAFKA_DIR

log = logging.getLogger(__name__)

PEERS_DIR = CACHE_DIR / "peers"
# name -> pip requirements. Flink's Kafka SQL connector pairs with its minor version (5.0.0-2.2 with 2.2).
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "quix": ("quixstreams==3.28.1",),
    "flink": ("apache-flink==2.2.1",),
    "pathway": ("pathway==0.33.0",),
}
FLINK_KAFKA_CONNECTOR = "org.apache.flink:flink-sql-connector-kafka:5.0.0-2.2"


def peer_python(name: str) -> Path:
    """The Python of peer ``name``'s venv, made and installed first if it is missing or out of date."""
    folder = PEERS_DIR / f"{name}-venv"
    python = folder / "bin" / "python"
    stamp = folder / ".installed"
    wanted = "\n".join(REQUIREMENTS[name])
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return python
    print(f"setting up the {name} peer's virtualenv in {folder} (once; minutes) ...", file=sys.stderr, flush=True)
    venv.EnvBuilder(clear=True, with_pip=True).create(folder)
    install_log = folder / "pip-install.log"
    with install_log.open("w") as output:
        result = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check",
                                 *REQUIREMENTS[name]], stdout=output, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise RuntimeError(f"installing {name}'s packages failed; see {install_log}:\n"
                           + "\n".join(install_log.read_text().splitlines()[-15:]))
    stamp.write_text(wanted)
    return python


def flink_connector_jar() -> Path:
    """The Kafka SQL connector jar (one fat jar) from Maven Central, fetched once with Maven."""
    folder = PEERS_DIR / "flink-jars"
    group, artifact, version = FLINK_KAFKA_CONNECTOR.split(":")
    jar = folder / f"{artifact}-{version}.jar"
    if jar.exists():
        return jar
    print(f"fetching {FLINK_KAFKA_CONNECTOR} from Maven Central into {folder} ...", file=sys.stderr, flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mvn", "-q", "-B", "-s", str(KAFKA_DIR / "maven-settings.xml"),
                             "dependency:copy", f"-Dartifact={FLINK_KAFKA_CONNECTOR}",
                             f"-DoutputDirectory={folder}"], capture_output=True, text=True, cwd=folder)
    if result.returncode != 0 or not jar.exists():
        raise RuntimeError("Maven could not fetch the Flink Kafka connector:\n"
                           + "\n".join((result.stdout + result.stderr).splitlines()[-15:]))
    return jar
