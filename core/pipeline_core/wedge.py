"""Fault injection for tests of supervision: a stage's loop wedged on request.

Off unless the stage's settings turn it on (`--wedge-on-sigusr2`, PIPELINE_WEDGE_ON_SIGUSR2). Then SIGUSR2 arms
it, and the next turn of the stage's loop (its `ProgressReporter.maybe_report`) blocks for good in a read from a
socket whose peer never writes: what a call without a timeout on a peer that never answers does. The process lives
on and answers signals (SIGTERM sets its stop, SIGUSR1 writes its threads' stacks), its other threads go on, and
its loop never turns again, so its heartbeat stops. The stack's watchdog (ops/stack/watchdog.py) is what ends such
a stage and starts it again; its tests wedge a stage this way.
"""
from __future__ import annotations

import logging
import signal
import socket
import threading

log = logging.getLogger(__name__)

WEDGE_SIGNAL = signal.SIGUSR2


class Wedge:
    """Armed by WEDGE_SIGNAL once `install`ed; `block_if_armed` then never returns."""

    def __init__(self) -> None:
        self._armed = threading.Event()
        self._peer: socket.socket | None = None

    def install(self) -> None:
        """Arm on WEDGE_SIGNAL (from the main thread, as every signal handler is installed)."""
        signal.signal(WEDGE_SIGNAL, self._arm)

    @property
    def armed(self) -> bool:
        return self._armed.is_set()

    def _arm(self, _signum: int, _frame: object) -> None:
        self._armed.set()  # no logging here: the handler may interrupt the main thread inside a logging call

    def block_if_armed(self) -> None:
        """Block the calling thread for good once armed, in a read that never returns; else return at once."""
        if not self._armed.is_set():
            return
        log.warning("wedged by %s (fault injection, --wedge-on-sigusr2): this thread blocks in a read that never "
                    "returns, and the stage's loop turns no more", WEDGE_SIGNAL.name)
        # Both ends held by this object: the peer stays open and never writes, so the read sees no data and no end.
        self._peer, reader = socket.socketpair()
        while True:
            reader.recv(1)  # a signal's handler runs meanwhile and the read goes on (PEP 475)
