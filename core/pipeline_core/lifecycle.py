"""How every long-running stage stops: one `StopSignal` per process, set by SIGTERM or SIGINT.

A stage's loop polls `is_set()` (or sleeps in `wait(timeout)`), finishes what is in flight (the last
batch, the open transaction, the records awaiting Kafka) and returns; the process then exits 0.

A thread that dies of an exception nothing caught ends the process (`exit_on_thread_failure`): a stage whose
loop thread lives on while one of its workers is gone would look alive to supervision and do nothing.

SIGUSR1 writes every thread's stack to stderr (the stage's log), at once, from the signal handler of
`faulthandler`, even while the main thread is blocked: the stack's watchdog asks for it before it ends a stage whose
loop stopped turning, so that the log says where it hung.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Every thread's stack into the log, the process going on.
STACK_DUMP_SIGNAL = signal.SIGUSR1


class StopSignal:
    """A stop request that loops poll or wait on; set once, by a signal or by code (tests, benchmarks)."""

    def __init__(self) -> None:
        self._requested = False
        self._event = threading.Event()
        self.reason: str | None = None

    def set(self, reason: str = "stop requested") -> None:
        if not self._requested:
            self.reason = reason
            self._requested = True
        self._event.set()

    def is_set(self) -> bool:
        return self._requested

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` s, waking at once when a stop is requested; True if it is."""
        return self._requested or self._event.wait(timeout)

    def _on_signal(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self._requested:
            threading.Thread(target=log.warning, name="stop-signal", daemon=True,
                             args=("%s: already stopping (SIGKILL forces it)", name)).start()
            return
        self.reason = name
        self._requested = True
        # The handler runs on the main thread between two bytecodes, possibly while that thread holds the
        # event's lock inside `wait` or a logging handler's lock: both are taken on a thread of their own.
        threading.Thread(target=self._announce, name="stop-signal", daemon=True, args=(name,)).start()

    def _announce(self, name: str) -> None:
        log.info("%s: finishing what is in flight, then stopping", name)
        self._event.set()


_process_signal: StopSignal | None = None


def process_stop_signal() -> StopSignal:
    """The process's `StopSignal`; the first call (from the main thread) installs the SIGTERM and SIGINT
    handlers that set it, and STACK_DUMP_SIGNAL's that writes every thread's stack to stderr; later calls return the
    same one."""
    global _process_signal
    if _process_signal is None:
        stop = StopSignal()
        for signum in STOP_SIGNALS:
            signal.signal(signum, stop._on_signal)
        try:
            faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
        except (AttributeError, ValueError, OSError):  # stderr is no file (a test captures it): no dumps here
            pass
        _process_signal = stop
    return _process_signal


# The exit status of a process ended by a thread's uncaught exception (EX_SOFTWARE: an internal error).
THREAD_FAILURE_EXIT_CODE = 70


def exit_on_thread_failure() -> None:
    """From now on an exception that ends any thread of this process but the main one, uncaught (a `SystemExit`
    too: nothing else would end the process), is logged and ends the process with `THREAD_FAILURE_EXIT_CODE`,
    so that supervision restarts it. A thread of a library (Py4J's callback server runs Spark's `foreachBatch`)
    would otherwise die alone, and the work waiting on it with it. Once a stop is requested the process is
    ending anyway, and such an exception is only logged."""

    def on_failure(failure: threading.ExceptHookArgs) -> None:
        thread = failure.thread.name if failure.thread is not None else "a thread"
        stopping = _process_signal is not None and _process_signal.is_set()
        log.critical("%s died of %s: %s", thread, failure.exc_type.__name__, failure.exc_value,
                     exc_info=(failure.exc_type, failure.exc_value, failure.exc_traceback))
        if stopping:
            return
        # Not sys.exit: the main thread may be blocked anywhere.
        end_process(THREAD_FAILURE_EXIT_CODE, f"ending the process (exit status {THREAD_FAILURE_EXIT_CODE}) so that "
                    "supervision starts it again")

    threading.excepthook = on_failure


def end_process(exit_status: int, message: str) -> None:
    """Log `message` as critical and end this process at once with `exit_status`, without the interpreter's exit:
    no thread is joined, no client closed, no `atexit` hook run, so that whatever a stuck thread or client waits
    for cannot hold the process (supervision starts it again; what it had not committed is read again)."""
    log.critical("%s", message)
    logging.shutdown()
    os._exit(exit_status)
