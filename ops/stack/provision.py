"""`python -m stack.provision`: install what the native stack needs, idempotently.

Debian's mosquitto and influxdb packages (and Java/Maven if missing, and docker-compose to validate
the Compose file), Apache Kafka's jars and
Spark's Kafka connector from Maven Central into the git-ignored cache. Fast when all is there.
Debian's Chromium, for the tests that load a page in a real browser, is installed on demand by
`install_chromium`, not here.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from pipeline_core import paths

DEBIAN_PACKAGES = {  # binary -> package
    "mosquitto": "mosquitto",
    "influxd": "influxdb",
    "java": "openjdk-17-jre-headless",
    "mvn": "maven",
    # Validates docker-compose.yml in `make test` (`docker-compose config`) where no Docker is installed:
    # Debian's Compose 1.29 installs in seconds and needs no engine for `config`.
    "docker-compose": "docker-compose",
}


class ProvisionError(RuntimeError):
    pass


def _installed(binary: str) -> bool:
    if binary == "docker-compose" and compose_command() is not None:
        return True
    return bool(shutil.which(binary) or any(os.access(f"{d}/{binary}", os.X_OK) for d in ("/usr/sbin", "/sbin")))


def compose_command() -> list[str] | None:
    """The Compose command line here: Docker's plugin (`docker compose`) where it answers, else
    `docker-compose`; None when neither is installed."""
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def install_debian_packages() -> None:
    missing = sorted({package for binary, package in DEBIAN_PACKAGES.items() if not _installed(binary)})
    if not missing:
        return
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if os.geteuid() != 0:
        raise ProvisionError("missing Debian packages; run this once, then `make setup` again:\n"
                             f"  sudo apt-get update && sudo {' '.join(command)}")
    print(f"installing Debian packages: {', '.join(missing)}", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)


CHROMIUM_BINARIES = ("chromium", "chromium-browser")


def install_chromium() -> str:
    """The path of a headless-capable Chromium, Debian's package installed first where none is. Only the tests
    that load a page in a real browser need it (`tests/browser_support.py`): it is no part of what `make setup`
    installs for the stack, and the first such test on a fresh machine installs it."""
    found = next((path for path in map(shutil.which, CHROMIUM_BINARIES) if path), None)
    if found:
        return found
    command = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    if os.geteuid() != 0:
        raise ProvisionError(f"Chromium is missing; install it once: sudo apt-get update && sudo {' '.join(command)}")
    print("installing Debian's chromium for the browser tests ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    installed = shutil.which("chromium")
    if installed is None:
        raise ProvisionError("apt-get installed chromium, yet no chromium command is on the PATH")
    return installed


def _maven_copy(output: Path, stamp_value: str, *maven_args: str) -> None:
    stamp = output / ".resolved"
    if stamp.exists() and stamp.read_text() == stamp_value:
        return
    print(f"resolving jars from Maven Central into {output.relative_to(paths.REPO_ROOT)} ...", flush=True)
    if output.exists():
        shutil.rmtree(output)
    result = subprocess.run(
        ["mvn", "-q", "-B", "-s", str(paths.KAFKA_DIR / "maven-settings.xml"),
         "-f", str(paths.KAFKA_DIR / "pom.xml"), *maven_args,
         "dependency:copy-dependencies", f"-DoutputDirectory={output}", "-DincludeScope=runtime"],
        capture_output=True, text=True)
    if result.returncode != 0:
        raise ProvisionError("Maven could not resolve the jars (is Maven Central reachable?):\n"
                             + "\n".join((result.stdout + result.stderr).splitlines()[-15:]))
    stamp.write_text(stamp_value)


def fetch_kafka() -> None:
    pom_hash = hashlib.sha256((paths.KAFKA_DIR / "pom.xml").read_bytes()).hexdigest()
    _maven_copy(paths.KAFKA_LIBS, pom_hash)


def fetch_spark_kafka_connector() -> None:
    """spark-sql-kafka matching the installed pyspark, so Spark sessions start without network."""
    spark_version = version("pyspark")
    # Spark's own jars (pyspark/jars) already hold these; a second, older copy would shadow them.
    bundled = ("hadoop-client-api,hadoop-client-runtime,scala-library,scala-parallel-collections_2.13,"
               "slf4j-api,jsr305,lz4-java,snappy-java,spark-tags_2.13")
    _maven_copy(paths.SPARK_JARS, spark_version, "-P", "spark-kafka", f"-Dspark.version={spark_version}",
                f"-DexcludeArtifactIds={bundled}")


def main() -> int:
    try:
        install_debian_packages()
        fetch_kafka()
        fetch_spark_kafka_connector()
    except (ProvisionError, subprocess.CalledProcessError) as error:
        print(f"setup failed: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
