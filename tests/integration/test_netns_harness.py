"""The network-namespace harness on this machine, with real TCP: hosts reach each other by name and address,
each fault cuts what it should and no more, and nothing is left behind, however a run ends.

Needs root and `ip` (no Kafka, no stack): each test has a prefix of its own, so runs side by side don't collide.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fault_support import kill_process
from stack import netns
from stack.processes import process_start_ticks
from support import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
PORT = 8000
# A connect across a cut fails at once: well under this, where an isolated host's times out.
FAST_FAILURE_S = 0.5

# A run in a process of its own, for the signal tests: it builds two hosts, starts a process in one, prints
# that process's PID, and waits to be signalled.
RUN = """
import signal, sys, time
from stack import netns
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background child may inherit SIGINT ignored
network = netns.Network(sys.argv[1])
with netns.Harness(network, network.hosts("a", "b")) as lab:
    print(lab.popen("a", ["sleep", "300"]).pid, flush=True)
    time.sleep(300)
"""


@pytest.fixture(scope="module", autouse=True)
def _preflight() -> None:
    netns.preflight()


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"mdp{uuid.uuid4().hex[:10]}"
    yield name
    netns.sweep(name)  # a failed test's leftovers, if any


def root_network() -> dict[str, str]:
    """The machine's own network stack as `ip` shows it."""
    views = {"addr": ["addr"], "link": ["link"], "route": ["route"], "route6": ["-6", "route"]}
    return {name: subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
            for name, args in views.items()}


def leftovers(prefix: str) -> dict[str, object]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {"namespaces": sorted(line.split()[0] for line in listed.splitlines() if line.startswith(f"{prefix}-")),
            "etc": sorted(path.name for path in netns.NETNS_ETC.glob(f"{prefix}-*")),
            "owner record": netns.owner_file(prefix).exists()}


NOTHING = {"namespaces": [], "etc": [], "owner record": False}


def running(pid: int, start_ticks: int | None) -> bool:
    """Whether process `pid`, started at `start_ticks`, still runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and process_start_ticks(pid) == start_ticks


def start_listeners(lab: netns.Harness) -> None:
    """An HTTP server in every host on its own address, up when it answers from inside its host."""
    for name, host in lab.hosts.items():
        lab.popen(name, [sys.executable, "-m", "http.server", "--bind", str(host.address), str(PORT)],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for name in lab.hosts:
        wait_for(lambda name=name: lab.can_connect(name, name, PORT), 15, f"the listener in {name}")


Run = tuple[subprocess.Popen[str], int, int | None]


@pytest.fixture
def start_run(prefix: str) -> Iterator[Callable[[], Run]]:
    """Starts run `prefix` in a child process and returns once its hosts exist: the child, and the PID and start of
    its process in a host. The child is killed at the end, if still running, before the prefix is swept."""
    children: list[subprocess.Popen[str]] = []

    def start() -> Run:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT / "ops"),
                                                                          os.environ.get("PYTHONPATH")]))}
        child = subprocess.Popen([sys.executable, "-c", RUN, prefix], stdout=subprocess.PIPE, text=True, env=env,
                                 start_new_session=True)
        children.append(child)
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 30)
        line = child.stdout.readline() if ready else ""
        assert line.strip().isdigit(), f"the run did not start (exit {child.poll()})"
        pid = int(line)
        assert leftovers(prefix)["namespaces"] == [f"{prefix}-a", f"{prefix}-b", f"{prefix}-switch"]
        return child, pid, process_start_ticks(pid)

    yield start
    for child in children:
        child.kill()
        child.wait()


def test_hosts_reach_each_other_by_name_and_address_without_touching_the_root_namespace(prefix: str) -> None:
    before = root_network()
    network = netns.Network(prefix)
    with netns.Harness(network, network.hosts("a", "b", "c")) as lab:
        start_listeners(lab)
        assert lab.can_connect("a", "b", PORT)
        assert lab.can_connect("a", "198.18.0.2", PORT)
        assert lab.connect("a", "c", PORT + 1).error == "ECONNREFUSED"  # a probe that can fail
        assert root_network() == before
    assert root_network() == before


def test_an_isolated_host_reaches_no_one_until_it_rejoins(prefix: str) -> None:
    network = netns.Network(prefix)
    with netns.Harness(network, network.hosts("a", "b", "c")) as lab:
        start_listeners(lab)
        lab.isolate("b")
        assert lab.connect("a", "b", PORT, timeout_s=0.5).error == "timeout"
        assert not lab.can_connect("b", "c", PORT, timeout_s=0.5)
        assert lab.can_connect("a", "c", PORT)
        lab.rejoin("b")
        wait_for(lambda: lab.can_connect("a", "b", PORT), 10, "a to reach b again")
        assert lab.can_connect("b", "c", PORT)


def test_a_cut_parts_two_hosts_both_ways_and_no_other_path(prefix: str) -> None:
    network = netns.Network(prefix)
    with netns.Harness(network, network.hosts("a", "b", "c")) as lab:
        start_listeners(lab)
        lab.cut_between("a", "b")
        for source, target in (("a", "b"), ("b", "a")):
            attempt = lab.connect(source, target, PORT, timeout_s=5)
            assert attempt.error == "EHOSTUNREACH" and attempt.elapsed_s < FAST_FAILURE_S, (source, attempt)
        assert lab.can_connect("a", "c", PORT)
        assert lab.can_connect("c", "b", PORT)
        lab.heal_between("a", "b")
        assert lab.can_connect("a", "b", PORT)
        assert lab.can_connect("b", "a", PORT)


def test_leaving_the_block_by_an_exception_leaves_nothing(prefix: str) -> None:
    before = root_network()
    network = netns.Network(prefix)
    with pytest.raises(RuntimeError, match="a failing test"):
        with netns.Harness(network, network.hosts("a", "b")) as lab:
            sleeper = lab.popen("a", ["sleep", "300"])
            started = process_start_ticks(sleeper.pid)
            assert leftovers(prefix)["namespaces"] == [f"{prefix}-a", f"{prefix}-b", f"{prefix}-switch"]
            raise RuntimeError("a failing test")
    assert leftovers(prefix) == NOTHING
    assert not running(sleeper.pid, started)
    assert root_network() == before


@pytest.mark.parametrize("signum, exit_code", [(signal.SIGTERM, 128 + signal.SIGTERM),
                                               (signal.SIGINT, -signal.SIGINT)])
def test_a_signalled_run_leaves_nothing(prefix: str, start_run: Callable[[], Run], signum: int,
                                        exit_code: int) -> None:
    before = root_network()
    child, sleeper, started = start_run()
    assert running(sleeper, started)
    os.kill(child.pid, signum)
    assert child.wait(timeout=30) == exit_code
    wait_for(lambda: leftovers(prefix) == NOTHING, 10, f"run {prefix}'s namespaces to go")
    wait_for(lambda: not running(sleeper, started), 10, "the process in a host to end")
    assert root_network() == before


def test_sweep_removes_what_a_killed_run_left_and_spares_a_live_one(prefix: str,
                                                                    start_run: Callable[[], Run]) -> None:
    child, sleeper, started = start_run()
    assert netns.sweep(prefix) == []  # its owner still runs
    assert leftovers(prefix)["namespaces"] == [f"{prefix}-a", f"{prefix}-b", f"{prefix}-switch"]
    kill_process(child, f"run {prefix}")  # confirmed: it ran, and the SIGKILL ended it before it could clean up
    assert leftovers(prefix)["owner record"] and running(sleeper, started)
    assert netns.sweep(prefix) == [f"{prefix}-a", f"{prefix}-b", f"{prefix}-switch"]
    assert leftovers(prefix) == NOTHING
    wait_for(lambda: not running(sleeper, started), 10, "the process in a host to end")


def test_a_lasting_run_is_an_orphan_once_its_guardian_is_gone_and_never_without_one(prefix: str) -> None:
    """A stack's hosts outlive the process that built them; a test's stack names the test as guardian, so that a
    test killed before its `down` leaves nothing the next one does not sweep. A user's stack has no guardian."""
    guardian = subprocess.Popen(["sleep", "300"])
    unguarded = f"{prefix}u"
    try:
        netns.Harness(netns.Network(prefix), netns.Network(prefix).hosts("a")).build_lasting("a test", guardian.pid)
        netns.Harness(netns.Network(unguarded), netns.Network(unguarded).hosts("a")).build_lasting("a user's stack")
        assert prefix not in netns.orphans() and unguarded not in netns.orphans()
        kill_process(guardian, "the guardian")
        assert prefix in netns.orphans() and unguarded not in netns.orphans()
        assert {f"{prefix}-a", f"{prefix}-switch"} <= set(netns.sweep_orphans())
        assert leftovers(prefix) == NOTHING
        assert leftovers(unguarded)["namespaces"] == [f"{unguarded}-a", f"{unguarded}-switch"]
    finally:
        guardian.kill()
        netns.sweep(unguarded)
    assert leftovers(unguarded) == NOTHING


def test_preflight_says_what_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(netns.PreflightError, match=r"^needs root: run as root or with sudo$"):
        netns.preflight(euid=1000)
    monkeypatch.setattr(netns, "_unshare", lambda _flags: -1)  # as where the kernel refuses a new namespace
    with pytest.raises(netns.PreflightError, match=r"cannot create a network namespace: .*CAP_SYS_ADMIN"):
        netns.preflight()
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(netns.PreflightError, match=r"needs the `ip` command of iproute2 .*apt-get install iproute2"):
        netns.preflight()


@pytest.mark.parametrize("address", ["10.0.0.1", "192.168.1.1", "198.17.255.255", "198.20.0.1"])
def test_an_address_outside_the_test_range_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match=r"outside 198\.18\.0\.0/15"):
        netns.Host("a", address)
    with pytest.raises(ValueError, match=r"outside 198\.18\.0\.0/15"):
        netns.Network("mdpx", f"{address}/32")
