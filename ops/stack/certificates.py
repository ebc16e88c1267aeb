"""A private certificate authority and the servers' TLS certificates, made with the `openssl` command.

Generated under the stack's state dir (`tls/`), private keys readable by their owner only. A server certificate is
valid for its server's names and for the names and addresses other hosts reach the servers by
(`TLS_EXTRA_HOSTNAMES`, comma-separated, as in the Compose stack); one the stack made is made again at `up` when a
name it should hold is missing (the names it holds are kept beside it, `<name>.hosts`). For real certificates, put
your CA's PEM file and each server's PEM key + chain at the same paths before `make up` (docs/security.md):
existing files the stack did not make are used as they are."""
from __future__ import annotations

import ipaddress
import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline_core import paths
from .processes import StackError

log = logging.getLogger(__name__)

CA_DAYS = 3650
SERVER_DAYS = 825  # the longest validity clients accept for a server certificate
KEY_BITS = 3072


def tls_dir() -> Path:
    return paths.STATE_DIR / "tls"


@dataclass(frozen=True)
class ServerCertificate:
    """A server's TLS files: `keystore` holds its private key (PKCS#8, unencrypted) and its certificate, as
    Kafka's PEM key store (ssl.keystore.type=PEM) and Mosquitto read them; `certificate` the certificate alone."""

    keystore: Path
    certificate: Path
    key: Path


def ca_file(directory: Path | None = None) -> Path:
    return (directory or tls_dir()) / "ca.pem"


def ensure_ca(directory: Path | None = None) -> Path:
    """The CA's certificate (made with its key on first use); clients trust the servers through it."""
    directory = directory or tls_dir()
    certificate, key = ca_file(directory), directory / "ca-key.pem"
    if certificate.exists():
        return certificate
    _private_dir(directory)
    _openssl("req", "-x509", "-newkey", f"rsa:{KEY_BITS}", "-nodes", "-keyout", key, "-out", certificate,
             "-days", CA_DAYS, "-subj", "/CN=machine-data-pipeline CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return certificate


def extra_hostnames() -> list[str]:
    """TLS_EXTRA_HOSTNAMES: the names and addresses by which other hosts reach the servers."""
    return [host.strip() for host in os.environ.get("TLS_EXTRA_HOSTNAMES", "").split(",") if host.strip()]


def ensure_server_certificate(name: str, hosts: list[str], directory: Path | None = None) -> ServerCertificate:
    """`name`'s key and certificate, signed by the CA, valid for `hosts` (names or IP addresses) and
    `extra_hostnames()`."""
    directory = directory or tls_dir()
    files = ServerCertificate(directory / f"{name}-keystore.pem", directory / f"{name}.pem",
                              directory / f"{name}-key.pem")
    hosts = list(dict.fromkeys([*hosts, *extra_hostnames()]))
    made_for = directory / f"{name}.hosts"
    if files.keystore.exists():
        if not made_for.exists():  # a certificate given to the stack: used as it is, a missing name said
            missing = [host for host in hosts if host not in certificate_names(files.certificate)]
            if missing:
                log.warning("%s is not valid for %s: clients reaching %s by these names will refuse it",
                            files.certificate, ", ".join(missing), name)
            return files
        if set(hosts) <= set(made_for.read_text().split()):
            return files
    ca = ensure_ca(directory)
    names = ",".join(f"IP:{host}" if _is_ip(host) else f"DNS:{host}" for host in hosts)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        request, extensions = Path(scratch) / "request.csr", Path(scratch) / "extensions.cnf"
        extensions.write_text(f"subjectAltName={names}\nextendedKeyUsage=serverAuth,clientAuth\n"
                              "keyUsage=critical,digitalSignature,keyEncipherment\n")
        _openssl("req", "-newkey", f"rsa:{KEY_BITS}", "-nodes", "-keyout", files.key, "-out", request,
                 "-subj", f"/CN={name}")
        _openssl("x509", "-req", "-in", request, "-CA", ca, "-CAkey", directory / "ca-key.pem",
                 "-CAcreateserial", "-out", files.certificate, "-days", SERVER_DAYS, "-sha256",
                 "-extfile", extensions)
    descriptor = os.open(files.keystore, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as keystore:
        keystore.write(files.key.read_text() + files.certificate.read_text())
    made_for.write_text("\n".join(hosts) + "\n")
    return files


def certificate_names(certificate: Path) -> list[str]:
    """The DNS names and IP addresses a certificate is valid for (its subjectAltName); none when it cannot be read."""
    done = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(certificate)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return []
    entries = [entry.strip() for line in done.stdout.splitlines()[1:] for entry in line.split(",")]
    return [entry.split(":", 1)[1] for entry in entries if entry.startswith(("DNS:", "IP Address:"))]


def _private_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)


def _openssl(*args: object) -> None:
    old_umask = os.umask(0o077)  # keys are the owner's only from their first byte
    try:
        done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise StackError("`openssl` is not installed: `sudo apt-get install openssl`") from None
    finally:
        os.umask(old_umask)
    if done.returncode != 0:
        raise StackError(f"openssl {args[0]} failed:\n{done.stderr}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
