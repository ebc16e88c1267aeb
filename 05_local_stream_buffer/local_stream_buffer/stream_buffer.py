"""The seed-compatible per-record API: ``StreamBuffer`` joins a left and a right stream of ``Record``s.

Times in epoch seconds, as the seed's ``Record.phenomenonTime`` (and ``delta_time`` and ``max_latency`` in seconds,
under the seed's names); the join underneath takes milliseconds, so each record's time goes in times 1000."""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any, Callable

from .cases import CASE_LABELS, JoinCase
from .record import Record
from .status import IngestStatus
from .two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE, LEFT, RIGHT, Entry, PairSink, TwoStreamJoin

logger = logging.getLogger(__name__)

# Enum members as module constants: attribute access on an Enum class is slow on the hot path.
_ACCEPTED = IngestStatus.ACCEPTED
_LATE = IngestStatus.LATE

JoinFunction = Callable[..., Any]


class StreamBuffer:
    """Deterministic time-series join of the records of a left stream ('r') and a right stream ('s').

    Drop-in for the seed's ``StreamBuffer``; see the package README for the join contract. Each stream
    must arrive in its own time order; the interleaving of the two is free and does not change the result.

    :param instant_emit: must be True (emission on each ingested record), as in the seed.
    :param delta_time: pairs farther apart than this many seconds are not emitted (None: no limit).
    :param max_latency: seconds of processing time a pending predecessor pair may wait before it is
        emitted as it stands (None: wait for certainty). Records that later arrive inside the gap so
        closed are late: counted, passed to ``late_function`` and not joined.
    :param left: name of the left stream (labels only, as in the seed).
    :param right: name of the right stream.
    :param buffer_results: keep join results for :meth:`fetch_results`.
    :param join_function: ``f(record_left, record_right)`` building the join result; it also receives
        ``case=JoinCase`` if it accepts a ``case`` argument. Default: the seed's dict, plus 'case'.
    :param commit_function: ``f(record_to_commit)`` called once per record when it leaves the buffers
        (no longer able to pair), e.g. to commit its Kafka offset.
    :param verbose: log every ingest and join at INFO level.
    :param max_pending_per_side: pending records per side beyond which the oldest are forced, so a
        stalled stream cannot grow the buffers without bound.
    :param late_function: ``f(record)`` called for each late record.
    :param clock: processing-time clock in seconds for ``max_latency`` (injectable for tests).
    """

    def __init__(
        self,
        instant_emit: bool = True,
        delta_time: float | None = None,
        max_latency: float | None = None,
        left: str = "r",
        right: str = "s",
        buffer_results: bool = True,
        join_function: JoinFunction | None = None,
        commit_function: Callable[[Record], None] | None = None,
        verbose: bool = False,
        *,
        max_pending_per_side: int = DEFAULT_MAX_PENDING_PER_SIDE,
        late_function: Callable[[Record], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not instant_emit:
            raise NotImplementedError("only instant emission is supported, as in the seed")
        self.left_quantity = left
        self.right_quantity = right
        self._buffer_results = buffer_results
        self._join_function = join_function
        self._join_function_takes_case = join_function is not None and _accepts_case(join_function)
        self._late_function = late_function
        self._verbose = verbose
        self._results: list[Any] = []
        self._fetched = 0  # results handed out by fetch_results
        self._left_counter = 0
        self._right_counter = 0
        self._join_counter = 0  # joins, where the results do not count them
        # The common case, the seed's result dicts buffered, appends one dict per join: the results then
        # count the joins, and the emitter is a closure over the list (the hot path of this class).
        self._results_count_joins = join_function is None and buffer_results
        if join_function is not None:
            emit = self._emit_join_function
        elif buffer_results:
            emit = _seed_result_appender(self._results.append)
        else:
            emit = self._count_join  # default results nobody fetches need not be built
        self._join = TwoStreamJoin(
            emit=_logging(emit) if verbose else emit,
            release=_commit_hook(commit_function),
            delta_time_ms=None if delta_time is None else delta_time * 1000,
            max_pending_per_side=max_pending_per_side,
            max_latency_s=max_latency,
            clock=clock,
        )
        self._ingest = self._join.ingest

    def ingest_left(self, record: Record) -> IngestStatus:
        """Ingest the next record of the left stream and emit the pairs it makes certain."""
        self._left_counter += 1
        status = self._ingest(LEFT, record.phenomenonTime * 1000, record.result, record)
        if status is not _ACCEPTED:
            self._not_accepted(status, LEFT, record)
        elif self._verbose:
            logger.info("ingested into '%s': %s", self.left_quantity, record)
        return status

    def ingest_right(self, record: Record) -> IngestStatus:
        """Ingest the next record of the right stream and emit the pairs it makes certain."""
        self._right_counter += 1
        status = self._ingest(RIGHT, record.phenomenonTime * 1000, record.result, record)
        if status is not _ACCEPTED:
            self._not_accepted(status, RIGHT, record)
        elif self._verbose:
            logger.info("ingested into '%s': %s", self.right_quantity, record)
        return status

    def poll(self) -> None:
        """Emit pairs overdue by ``max_latency`` although no record arrived (call it when the streams are idle)."""
        self._join.poll()

    def fetch_results(self) -> list[Any]:
        """The join results since the last fetch (the buffer is emptied)."""
        results = self._results.copy()
        self._results.clear()  # the same list: the emitter appends to it
        self._fetched += len(results)
        return results

    def get_left_counter(self) -> int:
        """Records passed to :meth:`ingest_left`."""
        return self._left_counter

    def get_right_counter(self) -> int:
        """Records passed to :meth:`ingest_right`."""
        return self._right_counter

    def get_join_counter(self) -> int:
        if self._results_count_joins:
            return self._fetched + len(self._results)
        return self._join_counter

    def get_duplicate_counter(self) -> int:
        return self._join.duplicates

    def get_rejected_counter(self) -> int:
        return self._join.rejected

    def get_late_counter(self) -> int:
        return self._join.late

    def get_forced_counter(self) -> int:
        """Pending records resolved early by ``max_latency`` or the pending limit."""
        return self._join.forced

    def get_peak_buffer_size(self) -> int:
        """The most records one side has held at once."""
        return self._join.peak_buffer

    def get_left_buffer(self) -> list[Record]:
        """The left records currently held, oldest first."""
        return [entry[2] for entry in self._join.buffer(LEFT)]

    def get_right_buffer(self) -> list[Record]:
        """The right records currently held, oldest first."""
        return [entry[2] for entry in self._join.buffer(RIGHT)]

    def _not_accepted(self, status: IngestStatus, side: int, record: Record) -> None:
        stream = self.right_quantity if side else self.left_quantity
        if status is _LATE:
            logger.debug("late record in '%s': %s", stream, record)
            if self._late_function is not None:
                self._late_function(record)
        else:
            logger.debug("%s record in '%s' (last t=%s ms): %s", status.value, stream, self._join.last_time(side),
                         record)

    def _count_join(self, case: int, left: Entry, right: Entry) -> None:
        self._join_counter += 1

    def _emit_join_function(self, case: int, left: Entry, right: Entry) -> None:
        if self._join_function_takes_case:
            result = self._join_function(record_left=left[2], record_right=right[2], case=JoinCase(case))
        else:
            result = self._join_function(record_left=left[2], record_right=right[2])
        self._join_counter += 1
        if self._buffer_results and result is not None:
            self._results.append(result)


def _seed_result_appender(append: Callable[[Any], None]) -> PairSink:
    """An emitter appending the seed's default join result, plus the case, for each pair."""
    labels = CASE_LABELS

    def emit(case: int, left: Entry, right: Entry) -> None:
        record_left = left[2]
        record_right = right[2]
        result = {
            "r.quantity": record_left.quantity,
            "r.phenomenonTime": record_left.phenomenonTime,
            "r.result": left[1],
            "s.quantity": record_right.quantity,
            "s.phenomenonTime": record_right.phenomenonTime,
            "s.result": right[1],
            "case": labels[case],
        }
        if record_left.metadata:
            result["r.metadata"] = record_left.metadata
        if record_right.metadata:
            result["s.metadata"] = record_right.metadata
        append(result)

    return emit


def _logging(emit: PairSink) -> PairSink:
    """``emit``, logging each join at INFO level (the seed's verbose mode printed them)."""

    def logged(case: int, left: Entry, right: Entry) -> None:
        emit(case, left, right)
        logger.info("join case %s: %s with %s", CASE_LABELS[case], left[2], right[2])

    return logged


def _accepts_case(join_function: JoinFunction) -> bool:
    try:
        parameters = inspect.signature(join_function).parameters
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return "case" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _commit_hook(commit_function: Callable[[Record], None] | None) -> Callable[[Record], None] | None:
    if commit_function is None:
        return None

    def commit(record: Record) -> None:
        # Keyword call as in the seed, whose users wrote ``def commit_fct(record_to_commit)``.
        commit_function(record_to_commit=record)

    return commit
