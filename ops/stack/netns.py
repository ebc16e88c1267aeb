"""Several "hosts" on one machine, for tests of the pipeline across a network: each host is a network namespace
`<prefix>-<host>` with its own address, all joined by a bridge in a namespace of its own (`<prefix>-switch`), so
nothing is added to the machine's own network stack. Faults (a host cut off, the path between two hosts cut) are
made and healed here, and `can_connect` confirms them from inside a host.

    network = Network("mdp1")
    with Harness(network, network.hosts("kafka1", "kafka2")) as lab:
        lab.popen("kafka1", ["python3", "-m", "http.server", "--bind", "kafka1", "8000"])
        lab.isolate("kafka2")

Everything a run made goes when its `with` block ends, on an exception, Ctrl-C or SIGTERM too; `sweep(prefix)`
removes what a run killed outright (SIGKILL) left.
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from .processes import process_start_ticks

log = logging.getLogger(__name__)

# RFC 2544's benchmarking range: never routed on the internet nor used by a LAN, so no address made here can
# shadow one the machine or its network really uses.
TEST_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
DEFAULT_SUBNET = ipaddress.IPv4Network("198.18.0.0/24")
SWITCH = "switch"
BRIDGE = "br0"
# Each host sees one interface, named as on a real machine; the namespace keeps it apart from the machine's own.
HOST_LINK = "eth0"
IFNAMSIZ = 15
NETNS_ETC = Path("/etc/netns")
# /run, like the namespaces' own mounts under /run/netns: a run's owner record lives as long as its namespaces.
OWNER_DIR = Path("/run")
# No hyphen in a prefix: then `<prefix>-` starts the names of one run's namespaces only, whatever its hosts are called.
_PREFIX = re.compile(r"[a-z][a-z0-9]{0,31}")
_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
IP_TIMEOUT_S = 30.0
KILL_DEADLINE_S = 10.0
_CLONE_NEWNET = 0x40000000
# Run inside a host by `can_connect`: one TCP connect, its outcome as JSON on stdout.
_CONNECT_PROBE = """
import errno, json, socket, sys, time
start = time.monotonic()
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    error = None
except TimeoutError:
    error = "timeout"
except OSError as failure:
    error = errno.errorcode.get(failure.errno, str(failure))
print(json.dumps({"error": error, "elapsed_s": time.monotonic() - start}))
"""


class NetnsError(RuntimeError):
    """A namespace operation failed; the message says which and why."""


class PreflightError(NetnsError):
    """Something the harness needs is missing; the message says what and how to get it."""


def in_test_range(value: str | ipaddress.IPv4Address) -> ipaddress.IPv4Address:
    """`value` as an address, refused unless it lies in 198.18.0.0/15."""
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError as error:
        raise ValueError(f"{value!r} is no IPv4 address: {error}") from None
    if address not in TEST_RANGE:
        raise ValueError(f"{address} is outside {TEST_RANGE} (RFC 2544's test range): the harness uses no other "
                         "addresses, so that none can clash with a real network")
    return address


@dataclass(frozen=True)
class Host:
    """One simulated machine: its name (resolvable from every host) and its address."""
    name: str
    address: ipaddress.IPv4Address

    def __post_init__(self) -> None:
        if not _HOST_NAME.fullmatch(self.name) or self.name == SWITCH:
            raise ValueError(f"host name {self.name!r}: use lower-case letters, digits and inner hyphens "
                             f"(a DNS label), and not {SWITCH!r}, which names the bridge's namespace")
        object.__setattr__(self, "address", in_test_range(self.address))


@dataclass(frozen=True)
class Network:
    """One run's network: `prefix` starts every namespace's name, `subnet` holds every host's address."""
    prefix: str
    subnet: ipaddress.IPv4Network = DEFAULT_SUBNET

    def __post_init__(self) -> None:
        check_prefix(self.prefix)
        try:
            subnet = ipaddress.IPv4Network(self.subnet)
        except ValueError as error:
            raise ValueError(f"subnet {self.subnet!r}: {error}") from None
        if not subnet.subnet_of(TEST_RANGE):
            raise ValueError(f"subnet {subnet} is outside {TEST_RANGE} (RFC 2544's test range): the harness uses "
                             "no other addresses, so that none can clash with a real network")
        object.__setattr__(self, "subnet", subnet)

    @property
    def switch(self) -> str:
        return self.namespace(SWITCH)

    def namespace(self, host_name: str) -> str:
        return f"{self.prefix}-{host_name}"

    def hosts(self, *names: str) -> tuple[Host, ...]:
        """Hosts named `names`, given the subnet's addresses in order."""
        if len(names) > self.subnet.num_addresses - 2:
            raise ValueError(f"{len(names)} hosts do not fit in {self.subnet}")
        return tuple(Host(name, address) for name, address in zip(names, self.subnet.hosts()))

    def require_inside(self, address: ipaddress.IPv4Address) -> ipaddress.IPv4Address:
        """`address`, or an error when it is not a host address of the subnet: the guard before any address is
        assigned or routed, so the harness never touches one it does not own."""
        if address not in self.subnet or address in (self.subnet.network_address, self.subnet.broadcast_address):
            raise ValueError(f"{address} is no host address of the run's subnet {self.subnet}")
        return address


def check_prefix(prefix: str) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"prefix {prefix!r}: use 1-32 lower-case letters and digits, starting with a letter "
                         "(no hyphen: it separates the prefix from a host's name)")
    return prefix


def bridge_port(index: int) -> str:
    """The bridge's end of host number `index`'s veth pair: generated, since a host's name may be too long for
    an interface's 15 characters."""
    name = f"p{index}"
    if len(name) > IFNAMSIZ:
        raise ValueError(f"interface name {name!r} is longer than {IFNAMSIZ} characters")
    return name


def hosts_file(hosts: Iterable[Host]) -> str:
    """/etc/hosts as every host sees it: localhost, then each host's name and address."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{host.address}\t{host.name}" for host in hosts]
    return "\n".join(lines) + "\n"


def exec_prefix(namespace: str) -> list[str]:
    """The start of a command line that runs the rest inside `namespace`, with its /etc/netns files (the hosts
    file) mounted over /etc."""
    return ["ip", "netns", "exec", namespace]


def _ip(*args: str) -> str:
    command = ["ip", *args]
    log.debug("%s", " ".join(command))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NetnsError(f"`{' '.join(command)}` could not run: {error}") from None
    if done.returncode != 0:
        raise NetnsError(f"`{' '.join(command)}` failed: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


_libc = ctypes.CDLL(None, use_errno=True)
_unshare = _libc.unshare  # looked up here: a forked child must not load a library
_setns = _libc.setns


def _enter(descriptor: int, what: str) -> None:
    if _setns(descriptor, _CLONE_NEWNET) != 0:
        raise NetnsError(f"cannot enter the network namespace {what}: {os.strerror(ctypes.get_errno())}")


@contextmanager
def entered(namespace: str) -> Iterator[None]:
    """Run the calling thread inside `namespace`'s network stack for the block: the sockets it opens meanwhile (a
    probe, a client) are that host's, its loopback included; other threads keep their own. Names still resolve by
    the process's /etc/hosts."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        try:
            target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        except FileNotFoundError:
            raise NetnsError(f"no network namespace {namespace}") from None
        try:
            _enter(target, namespace)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _enter(own, "the thread started in")
    finally:
        os.close(own)


def current_namespace_is(namespace: str) -> bool:
    """True when this process's network stack is `namespace`'s."""
    try:
        return os.stat(f"/run/netns/{namespace}").st_ino == os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def exists(namespace: str) -> bool:
    return Path(f"/run/netns/{namespace}").exists()


def _in_new_netns() -> None:
    """In a child before exec: a network namespace of its own, gone when the child exits."""
    if _unshare(_CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def preflight(euid: int | None = None) -> None:
    """Raise PreflightError unless the harness can work here: root (`euid`, the process's own by default), the
    `ip` command, `ip netns`, and a bridge and a veth pair that can be made (in a throwaway namespace that
    vanishes with its process, so the check leaves nothing even when killed)."""
    if (os.geteuid() if euid is None else euid) != 0:
        raise PreflightError("needs root: run as root or with sudo")
    if shutil.which("ip") is None:
        raise PreflightError("needs the `ip` command of iproute2 on PATH: install it (apt-get install iproute2)")
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if listing.returncode != 0:
        raise PreflightError(f"`ip netns` does not work here ({listing.stderr.strip()}): it needs a kernel with "
                             "network namespaces and a writable /run")
    probe = f"link add {BRIDGE} type bridge\nlink add v0 type veth peer name v1\nlink set v0 master {BRIDGE}\n"
    try:
        made = subprocess.run(["ip", "-batch", "-"], input=probe, capture_output=True, text=True,
                              timeout=IP_TIMEOUT_S, preexec_fn=_in_new_netns)
    except subprocess.SubprocessError:
        raise PreflightError("cannot create a network namespace: the kernel needs network namespaces "
                             "(CONFIG_NET_NS) and the process CAP_SYS_ADMIN (in a container: a privileged one)")
    if made.returncode != 0:
        raise PreflightError(f"cannot make a bridge and a veth pair ({made.stderr.strip()}): the kernel needs "
                             "its bridge and veth drivers (modprobe bridge veth)")


def owner_file(prefix: str) -> Path:
    """Where run `prefix` records its owner's PID while it lives."""
    return OWNER_DIR / f"netns-harness-{prefix}.json"


def _owner_alive(prefix: str) -> int | None:
    """The PID of the live process that owns run `prefix`, or None when it died (or no record is left)."""
    try:
        owner = json.loads(owner_file(prefix).read_text())
    except (OSError, ValueError):
        return None
    return _alive(owner)


def _alive(process: object) -> int | None:
    """The PID of the process a record names ({"pid", "start_ticks"}) while it lives, else None."""
    pid = process.get("pid") if isinstance(process, dict) else None
    if not isinstance(pid, int) or process_start_ticks(pid) != process.get("start_ticks"):
        return None  # gone, or its PID taken by a later process
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state == "Z" else pid  # a zombie's teardown will never run


def _process_record(pid: int) -> dict[str, int | None]:
    return {"pid": pid, "start_ticks": process_start_ticks(pid)}


def orphans() -> list[str]:
    """The prefixes of runs whose owner died without removing them: a run built by a process that is gone, or a
    lasting one (a stack's hosts) whose guardian is gone (a test killed with SIGKILL before its `down`). A lasting
    run without a guardian (`make up TOPOLOGY=hosts`) is never an orphan: `make down` removes it."""
    found = []
    for record_file in sorted(OWNER_DIR.glob("netns-harness-*.json")):
        try:
            owner = json.loads(record_file.read_text())
        except (OSError, ValueError):
            continue
        process = owner.get("guardian") if "lasting" in owner else owner
        if process is not None and _alive(process) is None:
            found.append(record_file.name.removeprefix("netns-harness-").removesuffix(".json"))
    return found


def sweep_orphans() -> list[str]:
    """Sweep every orphaned run (`orphans`); the namespaces removed."""
    return [namespace for prefix in orphans() for namespace in sweep(prefix)]


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _pids_in(namespace: str) -> list[int]:
    try:
        return [int(pid) for pid in _ip("netns", "pids", namespace).split()]
    except NetnsError:  # no such namespace (any more): nothing runs in it
        return []


def _kill_everything_in(namespace: str) -> list[int]:
    """SIGKILL every process in `namespace` until none is left (a dying process may fork); the PIDs that
    outlived KILL_DEADLINE_S."""
    deadline = time.monotonic() + KILL_DEADLINE_S
    while pids := _pids_in(namespace):
        if time.monotonic() > deadline:
            return pids
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    return []


def _remove(prefix: str, namespaces: Sequence[str]) -> None:
    """Remove `namespaces` (first every process in them, then each namespace, its links with it, and its /etc/netns
    directory), then `prefix`'s owner record. Goes on past a failure, so that as much as possible goes; raises
    at the end naming what is left."""
    left: list[str] = []
    for namespace in namespaces:
        if survivors := _kill_everything_in(namespace):
            left.append(f"processes {survivors} in {namespace} survived SIGKILL")
    present = set(_namespaces())
    for namespace in namespaces:
        if namespace in present:
            try:
                _ip("netns", "delete", namespace)
            except NetnsError as error:
                left.append(str(error))
        shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)
    owner_file(prefix).unlink(missing_ok=True)
    if left:
        raise NetnsError(f"run {prefix} left: " + "; ".join(left))


def sweep(prefix: str) -> list[str]:
    """Remove what run `prefix` left when it died without its teardown (SIGKILL, a crash): its namespaces, the
    processes in them, their /etc/netns directories and the owner record. A run whose owner still lives is left
    alone. Returns the namespaces removed."""
    check_prefix(prefix)
    owner = _owner_alive(prefix)
    if owner is not None:
        log.warning("not sweeping run %s: its owner, pid %d, still runs", prefix, owner)
        return []
    mine = f"{prefix}-"
    found = {name for name in _namespaces() if name.startswith(mine)}
    if NETNS_ETC.is_dir():
        found |= {path.name for path in NETNS_ETC.iterdir() if path.name.startswith(mine)}
    # The switch last: the hosts' ends of the veth pairs go with their namespaces, the bridge's with it.
    namespaces = sorted(found, key=lambda name: (name == f"{prefix}-{SWITCH}", name))
    if namespaces or owner_file(prefix).exists():
        log.info("sweeping run %s, whose owner died: %s", prefix, ", ".join(namespaces) or "its owner record")
    _remove(prefix, namespaces)
    return namespaces


def _in_main_thread() -> bool:
    """Only the main thread may set signal handlers."""
    return threading.current_thread() is threading.main_thread()


def _raise_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    # As an exception, SIGTERM unwinds through the `with` block like Ctrl-C, and the teardown runs.
    log.warning("signal %d: tearing the network down", signum)
    raise SystemExit(128 + signum)


@dataclass(frozen=True)
class ConnectResult:
    """One TCP connect from inside a host: `error` is the errno's name (e.g. 'EHOSTUNREACH') or 'timeout'."""
    connected: bool
    error: str | None
    elapsed_s: float


class Harness:
    """The namespaces of `network`'s run, one per host and one for the switch: built on entering the `with` block
    (a prefix already in use is refused), removed on leaving it however it is left."""

    def __init__(self, network: Network, hosts: Iterable[Host]) -> None:
        self.network = network
        self.hosts: dict[str, Host] = {}
        for host in hosts:
            if host.name in self.hosts:
                raise ValueError(f"two hosts named {host.name!r}")
            if host.address in {other.address for other in self.hosts.values()}:
                raise ValueError(f"two hosts at {host.address}")
            network.require_inside(host.address)
            self.hosts[host.name] = host
        self._ports = {name: bridge_port(index) for index, name in enumerate(self.hosts)}
        self._processes: list[subprocess.Popen[Any]] = []
        self._claimed = False
        self._previous_sigterm: tuple[Any] | None = None  # set while this run's SIGTERM handler is installed

    def namespace(self, host: str) -> str:
        self._host(host)
        return self.network.namespace(host)

    def namespaces(self) -> list[str]:
        """Every namespace of the run, the switch's last."""
        return [self.network.namespace(name) for name in self.hosts] + [self.network.switch]

    def build_lasting(self, owner: str, guardian_pid: int | None = None) -> Harness:
        """Build the run's namespaces to outlive this process (a stack's hosts, which `sweep(prefix)` removes): its
        owner record names `owner` and no process, so that no teardown runs when this object goes. With a
        `guardian_pid` (the test that made the stack), `sweep_orphans` removes them once that process is gone."""
        try:
            self._build(owner, guardian_pid)
        except BaseException:
            self._teardown()
            raise
        self._claimed = False
        return self

    def __enter__(self) -> Harness:
        if _in_main_thread():
            self._previous_sigterm = (signal.signal(signal.SIGTERM, _raise_on_sigterm),)
        try:
            self._build()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._teardown()

    def _claim(self, lasting_owner: str | None = None, guardian_pid: int | None = None) -> None:
        """Record this process as the run's owner, so that `sweep` leaves a live run alone; fails when the prefix
        is taken."""
        prefix = self.network.prefix
        owner = _owner_alive(prefix)
        if owner is not None:
            raise NetnsError(f"prefix {prefix} is in use by the run of pid {owner}: choose another")
        taken = [name for name in _namespaces() if name.startswith(f"{prefix}-")]
        if taken or owner_file(prefix).exists():
            raise NetnsError(f"a dead run left namespaces of prefix {prefix} ({', '.join(taken) or 'its record'}): "
                             f"remove them with stack.netns.sweep({prefix!r})")
        lasting = {"lasting": lasting_owner, **({"guardian": _process_record(guardian_pid)} if guardian_pid else {})}
        record = json.dumps(lasting if lasting_owner else _process_record(os.getpid()))
        # O_EXCL: of two runs claiming one prefix at once, one fails here instead of both sharing namespaces.
        with open(os.open(owner_file(prefix), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w") as file:
            file.write(record)
        self._claimed = True

    def _build(self, lasting_owner: str | None = None, guardian_pid: int | None = None) -> None:
        self._claim(lasting_owner, guardian_pid)
        switch = self.network.switch
        log.info("building run %s: %d hosts on %s", self.network.prefix, len(self.hosts), self.network.subnet)
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", switch, "link", "set", BRIDGE, "up")
        length = str(self.network.subnet.prefixlen)
        for name, host in self.hosts.items():
            namespace, port = self.network.namespace(name), self._ports[name]
            _ip("netns", "add", namespace)
            # Made in the switch with its peer put straight into the host: neither end is ever in the root namespace.
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", HOST_LINK, "netns", namespace)
            _ip("-n", switch, "link", "set", port, "master", BRIDGE, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            address = self.network.require_inside(host.address)
            _ip("-n", namespace, "address", "add", f"{address}/{length}", "dev", HOST_LINK)
            _ip("-n", namespace, "link", "set", HOST_LINK, "up")
            directory = NETNS_ETC / namespace
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "hosts").write_text(hosts_file(self.hosts.values()))

    def _teardown(self) -> None:
        # A second Ctrl-C or SIGTERM must not cut the teardown short: noted, and delivered once it is done. (Not by
        # blocking them: the kernel would hand them to another thread, and Python still runs the handler here.)
        noted: list[int] = []
        held = {signum: signal.signal(signum, lambda caught, _frame: noted.append(caught))
                for signum in (signal.SIGINT, signal.SIGTERM)} if _in_main_thread() else {}
        try:
            if self._claimed:
                log.info("tearing down run %s", self.network.prefix)
                try:
                    _remove(self.network.prefix, self.namespaces())
                finally:
                    for process in self._processes:
                        if process.poll() is None:
                            process.kill()
                        process.wait()
                    self._claimed = False
        finally:
            if self._previous_sigterm is not None:
                held[signal.SIGTERM] = self._previous_sigterm[0]
                self._previous_sigterm = None
            for signum, handler in held.items():
                signal.signal(signum, handler)
            if noted:
                signal.raise_signal(noted[0])

    def _host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise ValueError(f"no host {name!r} in run {self.network.prefix} (hosts: {', '.join(self.hosts)})") \
                from None

    def argv(self, host: str) -> list[str]:
        """The start of a command line that runs the rest in `host`."""
        return exec_prefix(self.namespace(host))

    def popen(self, host: str, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `args` in `host` (the keywords go to Popen); it is killed at teardown if still running."""
        process = subprocess.Popen([*self.argv(host), *args], **kwargs)
        self._processes.append(process)
        return process

    def isolate(self, host: str) -> None:
        """Cut `host` off from every other host: its port on the bridge goes down, as when its cable is pulled,
        so what is sent either way is lost and a connect times out."""
        self._host(host)
        log.info("isolating %s", host)
        _ip("-n", self.network.switch, "link", "set", self._ports[host], "down")

    def rejoin(self, host: str) -> None:
        self._host(host)
        log.info("%s rejoins the network", host)
        _ip("-n", self.network.switch, "link", "set", self._ports[host], "up")

    def cut_between(self, a: str, b: str) -> None:
        """Cut only the path between hosts `a` and `b`, both ways, by a route in each to the other.

        `unreachable` of the three route types: a connect across the cut fails at once (measured: 3 ms, as with
        `blackhole` and `prohibit`) and with EHOSTUNREACH, "No route to host", what a client logs when a route
        is really lost, where `blackhole` gives EINVAL and `prohibit` EACCES, which read as a bug or a
        permission problem. A cut that should look like silent loss (timeouts) is `isolate`'s."""
        self._route_between("replace", a, b)

    def heal_between(self, a: str, b: str) -> None:
        self._route_between("delete", a, b)

    def _route_between(self, action: str, a: str, b: str) -> None:
        if a == b:
            raise ValueError(f"a path between {a!r} and itself")
        log.info("%s the path between %s and %s", "cutting" if action == "replace" else "healing", a, b)
        for source, target in ((a, b), (b, a)):
            address = self.network.require_inside(self._host(target).address)
            _ip("-n", self.namespace(source), "route", action, "unreachable", f"{address}/32")

    def connect(self, src_host: str, dst: str, port: int, timeout_s: float = 1.0) -> ConnectResult:
        """One TCP connect from inside `src_host` to `dst` (a host's name, resolved by the host's /etc/hosts, or an
        address): run as a child in the namespace, since only there do its routes and names apply."""
        command = [*self.argv(src_host), sys.executable, "-I", "-S", "-c", _CONNECT_PROBE, dst, str(port),
                   str(timeout_s)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + IP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise NetnsError(f"the connect probe in {src_host} hung past its {timeout_s} s") from None
        if done.returncode != 0:
            raise NetnsError(f"the connect probe in {src_host} failed: {done.stderr.strip()}")
        outcome = json.loads(done.stdout)
        return ConnectResult(outcome["error"] is None, outcome["error"], outcome["elapsed_s"])

    def can_connect(self, src_host: str, dst: str, port: int, timeout_s: float = 1.0) -> bool:
        return self.connect(src_host, dst, port, timeout_s).connected
