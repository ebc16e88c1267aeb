"""Toxiproxy: slow links between hosts, for tests of how the pipeline behaves across a WAN.

Toxiproxy is a TCP proxy whose links take faults ("toxics") over an HTTP API. Its server is built on first use from
its Go module, at a pinned release, with every Go directory under the git-ignored cache, so nothing lands outside
the repo and no prebuilt binary is downloaded."""
from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal

from pipeline_core import paths
from .processes import StackError, port_holder, port_is_free

log = logging.getLogger(__name__)

# The newest v2 release the Go module proxy serves. Its version list and `@latest` stop at v2.5.0, yet each later
# tag resolves by name: v2.12.0 is the last that does.
TOXIPROXY_VERSION = "v2.12.0"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2"
INSTALL_DIR = paths.CACHE_DIR / "toxiproxy"
BINARY = INSTALL_DIR / "bin" / "toxiproxy-server"
# The version stamp is the binary's own: set at link time, as in Toxiproxy's release builds (`-version` prints it,
# and the API's /version), so a changed pin rebuilds, and no stamp file can tell of another binary than the one there.
_VERSION_FLAG = f"-X {TOXIPROXY_MODULE}.Version={TOXIPROXY_VERSION.removeprefix('v')}"
# Where Go is when installed from its release archive and the PATH was not extended (a non-login shell, CI).
_GO_FALLBACK = Path("/usr/local/go/bin/go")


def _go() -> str:
    found = shutil.which("go") or (str(_GO_FALLBACK) if os.access(_GO_FALLBACK, os.X_OK) else None)
    if found is None:
        raise StackError(f"Toxiproxy {TOXIPROXY_VERSION} is built from its Go module, and no `go` command was found: "
                         "install Go 1.23 or newer and put its bin/ folder on the PATH")
    return found


def installed_version() -> str | None:
    """The version the binary in the cache was built as ("2.12.0"), None when there is none."""
    try:
        out = subprocess.run([str(BINARY), "-version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.removeprefix("toxiproxy-server version ").strip() or None


def ensure_installed() -> Path:
    """The Toxiproxy server binary at the pinned version, built from its Go module when missing or of another
    version. A first build downloads the module and its dependencies and compiles them: a minute or more. One
    build at a time: a second caller (another test process, a benchmark) waits for it and finds the binary built."""
    if _pinned_installed():
        return BINARY
    INSTALL_DIR.mkdir(parents=True, exist_ok=True)
    with open(INSTALL_DIR / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return BINARY if _pinned_installed() else _build()


def _pinned_installed() -> bool:
    return installed_version() == TOXIPROXY_VERSION.removeprefix("v")


def _build() -> Path:
    go = _go()
    env = {
        **os.environ,
        # All of Go's state under the cache: the module's source, the compiled packages, the installed binary.
        "GOPATH": str(INSTALL_DIR / "gopath"),
        "GOMODCACHE": str(INSTALL_DIR / "gopath" / "pkg" / "mod"),
        "GOCACHE": str(INSTALL_DIR / "go-build"),
        "GOBIN": str(BINARY.parent),
        # Go writes its module cache read-only; writable, a plain `rm -rf .cache` clears it.
        "GOFLAGS": "-modcacherw",
        # Never download another Go toolchain: an old `go` fails with the version the module needs instead.
        "GOTOOLCHAIN": "local",
        # A static binary: no C compiler needed, none of the host's libraries linked.
        "CGO_ENABLED": "0",
    }
    package = f"{TOXIPROXY_MODULE}/cmd/server@{TOXIPROXY_VERSION}"
    log.info("building Toxiproxy %s from its Go module into %s (a first build: a minute or more) ...",
             TOXIPROXY_VERSION, INSTALL_DIR)
    started = time.monotonic()
    # -s -w: no symbol table or debug info, as in the release builds (a third smaller).
    result = subprocess.run([go, "install", f"-ldflags=-s -w {_VERSION_FLAG}", package],
                            env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"`go install {package}` failed (is the Go module proxy reachable?):\n"
                         + "\n".join((result.stdout + result.stderr).splitlines()[-15:]))
    # `go install` names the binary after its package's folder, `server`: renamed to say what it serves.
    os.replace(BINARY.with_name("server"), BINARY)
    log.info("built Toxiproxy %s in %.0f s: %s", TOXIPROXY_VERSION, time.monotonic() - started, BINARY)
    return BINARY


Stream = Literal["upstream", "downstream"]  # upstream: client -> server; downstream: server -> client


class ToxiproxyError(RuntimeError):
    """The API refused a request: `status` is its HTTP status (404 no such proxy or toxic, 409 one exists)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ToxiproxyClient:
    """Toxiproxy's HTTP API (the README of its Go module): proxies, and latency toxics on their links."""

    def __init__(self, api_url: str, timeout_s: float = 10.0) -> None:
        self.api_url = api_url.rstrip("/")
        self.timeout_s = timeout_s

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.api_url + path, method=method, data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                data = response.read()
        except urllib.error.HTTPError as error:
            # The API answers a refusal with {"error": message, "status": code}.
            try:
                message = json.loads(error.read()).get("error", error.reason)
            except ValueError:
                message = error.reason
            raise ToxiproxyError(f"Toxiproxy refused {method} {path}: {error.code} {message}", error.code) from None
        return json.loads(data) if data else None  # 204 No Content after a delete

    def version(self) -> str:
        return str(self._request("GET", "/version")["version"])

    def proxies(self) -> dict[str, dict[str, Any]]:
        """Every proxy by name: its listen and upstream addresses, whether enabled, and its toxics."""
        return dict(self._request("GET", "/proxies"))

    def create_proxy(self, name: str, listen: str, upstream: str) -> dict[str, Any]:
        """A proxy listening on `listen` ("addr:port"; port 0 picks a free one) that forwards to `upstream`
        ("host:port"). The proxy as created: its `listen` holds the port it listens on."""
        return dict(self._request("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream}))

    def delete_proxy(self, name: str) -> None:
        """Stop the proxy and drop its connections."""
        self._request("DELETE", f"/proxies/{_quoted(name)}")

    def add_latency(self, proxy: str, toxic: str, latency_ms: int, *, jitter_ms: int = 0,
                    stream: Stream = "downstream") -> dict[str, Any]:
        """Delay all data one way through `proxy` by `latency_ms` +/- `jitter_ms`: on its open connections too."""
        return dict(self._request("POST", f"/proxies/{_quoted(proxy)}/toxics", {
            "name": toxic, "type": "latency", "stream": stream, "toxicity": 1.0,
            "attributes": {"latency": latency_ms, "jitter": jitter_ms}}))

    def remove_toxic(self, proxy: str, toxic: str) -> None:
        self._request("DELETE", f"/proxies/{_quoted(proxy)}/toxics/{_quoted(toxic)}")


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


# The toxics `delay_link` adds, by the direction each delays.
DELAY_TOXICS: dict[Stream, str] = {"upstream": "delay_upstream", "downstream": "delay_downstream"}


def delay_link(client: ToxiproxyClient, proxy: str, round_trip_ms: int, jitter_ms: int = 0) -> None:
    """Give the link through `proxy` a round-trip time of `round_trip_ms` more, as a long link between hosts has.

    Half each way, as on a real link: a request and its answer cross the proxy once each way, so they see the
    whole round trip, and data that flows one way alone (a producer's writes, a consumer's fetched records) sees
    the one-way delay, neither none nor the full round trip as it would with all of it on one side."""
    upstream_ms = round_trip_ms // 2
    for stream, latency_ms in (("upstream", upstream_ms), ("downstream", round_trip_ms - upstream_ms)):
        client.add_latency(proxy, DELAY_TOXICS[stream], latency_ms, jitter_ms=jitter_ms, stream=stream)


def restore_link(client: ToxiproxyClient, proxy: str) -> None:
    """Remove the delay `delay_link` gave the link through `proxy`."""
    for toxic in DELAY_TOXICS.values():
        client.remove_toxic(proxy, toxic)


class ToxiproxyServer:
    """A `toxiproxy-server` process whose API listens on host:api_port, and a client of it.

    A context manager: entering starts the server and returns once its API answers; leaving stops it (and so
    every proxy it runs) and waits for the process to end."""

    def __init__(self, api_port: int, host: str = "127.0.0.1", binary: Path | None = None,
                 start_deadline_s: float = 30.0) -> None:
        self.host = host
        self.api_port = api_port
        self.binary = binary
        self.start_deadline_s = start_deadline_s
        self.client = ToxiproxyClient(f"http://{host}:{api_port}")
        self.process: subprocess.Popen[bytes] | None = None
        # The server's log (JSON lines on stdout), kept to tell why a start failed; deleted when it stops.
        self._output: BinaryIO | None = None

    def __enter__(self) -> ToxiproxyServer:
        # Taken, the API port would fail only in the server's log (it keeps running without an API), or worse,
        # another server there would answer the readiness poll.
        if not port_is_free(self.api_port, self.host):
            raise StackError(f"Toxiproxy's API port {self.host}:{self.api_port} is taken by "
                             f"{port_holder(self.api_port)}: choose another port")
        binary = self.binary or ensure_installed()
        self._output = tempfile.TemporaryFile()
        # LOG_LEVEL is the pipeline's too, in Python's level names; the server gets its own: a line per connection.
        self.process = subprocess.Popen(
            [str(binary), "-host", self.host, "-port", str(self.api_port)], stdin=subprocess.DEVNULL,
            stdout=self._output, stderr=subprocess.STDOUT, env={**os.environ, "LOG_LEVEL": "info"})
        try:
            self._wait_until_answering(self.process, self._output)
        except BaseException:
            self.stop()
            raise
        log.info("Toxiproxy (pid %d) answers on %s", self.process.pid, self.client.api_url)
        return self

    def _wait_until_answering(self, process: subprocess.Popen[bytes], output: BinaryIO) -> None:
        deadline = time.monotonic() + self.start_deadline_s
        while True:
            if process.poll() is not None:
                raise StackError(f"Toxiproxy exited with code {process.returncode} at its start:\n{_tail(output)}")
            try:
                self.client.version()
                return
            except OSError:  # not listening yet (urllib's URLError is an OSError)
                pass
            if time.monotonic() > deadline:
                raise StackError(f"Toxiproxy's API did not answer on {self.client.api_url} within "
                                 f"{self.start_deadline_s:.0f} s:\n{_tail(output)}")
            time.sleep(0.05)  # the poll's interval

    def stop(self, deadline_s: float = 10.0) -> None:
        """SIGTERM (the server closes its proxies), SIGKILL past `deadline_s`; the process reaped either way."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=deadline_s)
            except subprocess.TimeoutExpired:
                log.warning("Toxiproxy (pid %d) outlived SIGTERM by %.0f s: killing it",
                            self.process.pid, deadline_s)
                self.process.kill()
                self.process.wait()
        if self._output is not None:
            self._output.close()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def _tail(output: BinaryIO, lines: int = 15) -> str:
    output.seek(0)
    return "\n".join(output.read().decode(errors="replace").splitlines()[-lines:])
