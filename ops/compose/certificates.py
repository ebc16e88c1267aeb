"""`python ops/compose/certificates.py [.certs]`: a private CA and the TLS certificates of the Compose servers.

`make up STACK=docker` runs it before Compose; it keeps what exists, so a second run changes nothing and
clients keep trusting the CA. Layout (docs/security.md):

  .certs/            0700, git-ignored: nobody else on the host reads into it
    ca.key           the CA's private key, 0600, never mounted into a container
    ca.crt           what every client trusts (the stages, devices, `make data` on the host)
    kafka/           server.pem (key and certificate, Kafka's PEM keystore) and ca.crt, mounted read-only;
                     one broker identity (CN=kafka-broker) for every Kafka node, also their client
                     certificate on the inter-broker and controller listeners (mutual TLS)
    mosquitto/       server.key, server.crt and ca.crt, mounted read-only

A container reads the mounted directory as another uid, so the files in it are world-readable; the 0700
directory above them keeps them from the host's other users. Real certificates replace these files
under the same names. TLS_EXTRA_HOSTNAMES (comma-separated) adds the names other hosts use to reach
the servers to both certificates.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

CA_DAYS = 3650
SERVER_DAYS = 825  # the longest validity clients such as browsers and Apple's TLS stack accept
KAFKA_BROKER_NAME = "kafka-broker"
SERVERS = {  # directory -> (common name, host names in the certificate)
    "kafka": (KAFKA_BROKER_NAME, ["kafka", "kafka-1", "kafka-2", "kafka-3", "localhost"]),
    "mosquitto": ("mosquitto", ["mosquitto", "localhost"]),
}


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def _ensure_ca(directory: Path) -> None:
    if (directory / "ca.crt").exists() and (directory / "ca.key").exists():
        return
    _openssl("req", "-x509", "-newkey", "rsa:3072", "-nodes", "-keyout", str(directory / "ca.key"),
             "-out", str(directory / "ca.crt"), "-days", str(CA_DAYS), "-subj", "/CN=machine-data-pipeline CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    (directory / "ca.key").chmod(0o600)
    (directory / "ca.crt").chmod(0o644)


def _ensure_server(directory: Path, name: str, common_name: str, hostnames: list[str]) -> None:
    target = directory / name
    target.mkdir(mode=0o755, exist_ok=True)
    (target / "ca.crt").write_bytes((directory / "ca.crt").read_bytes())
    if (target / "server.crt").exists() and (target / "server.key").exists():
        return
    with tempfile.TemporaryDirectory(dir=directory) as work:
        request, extensions = Path(work) / "server.csr", Path(work) / "extensions.cnf"
        extensions.write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
            f"subjectAltName={','.join(f'DNS:{host}' for host in hostnames)},IP:127.0.0.1\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(target / "server.key"),
                 "-out", str(request), "-subj", f"/CN={common_name}")
        _openssl("x509", "-req", "-in", str(request), "-CA", str(directory / "ca.crt"),
                 "-CAkey", str(directory / "ca.key"), "-CAcreateserial", "-days", str(SERVER_DAYS),
                 "-extfile", str(extensions), "-out", str(target / "server.crt"))
    (target / "server.key").chmod(0o644)  # read by the container's own uid; .certs/ (0700) guards it
    # Kafka's PEM keystore: the PKCS#8 key and its certificate chain in one file.
    (target / "server.pem").write_bytes((target / "server.key").read_bytes() + (target / "server.crt").read_bytes())
    (target / "server.pem").chmod(0o644)


def ensure_certificates(directory: Path, extra_hostnames: list[str] | None = None) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    _ensure_ca(directory)
    for name, (common_name, hostnames) in SERVERS.items():
        _ensure_server(directory, name, common_name, [*hostnames, *(extra_hostnames or [])])
    (directory / "ca.srl").unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    extra = [host.strip() for host in os.environ.get("TLS_EXTRA_HOSTNAMES", "").split(",") if host.strip()]
    ensure_certificates(Path(argv[0] if argv else ".certs"), extra)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
