"""Which quiet streams are due for their idle release (a spec's ``idle_release_s``; see ``reorder``).

The keyed joiner tells :class:`IdleStreams` of every record arriving at a stream whose join spec sets an idle
release; :meth:`IdleStreams.due` names the streams that have had none for their ``idle_release_s`` since. Per
distinct ``idle_release_s`` the streams are kept in the order of their last arrival, so finding the due ones
looks at those due and one more, however many streams are tracked.

The batch path (Spark) keeps each side's last arrival in the key's state instead, and asks
:func:`due_sides` of a key's state bytes.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable

from .reorder import load_key_state
from .two_stream_join import LEFT, RIGHT

Stream = tuple[Hashable, int]  # a join key (any hashable owner) and its side


class IdleStreams:
    """Streams by the processing time (``clock``, seconds) their last record arrived, per idle release."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._by_idle_s: dict[float, dict[Stream, float]] = {}

    def arrived(self, stream: Stream, idle_release_s: float) -> None:
        """A record of ``stream`` arrived now (whatever became of it)."""
        streams = self._by_idle_s.get(idle_release_s)
        if streams is None:
            streams = self._by_idle_s[idle_release_s] = {}
        else:
            streams.pop(stream, None)  # to the end: the order is of last arrival
        streams[stream] = self._clock()

    def due(self) -> list[Stream]:
        """The streams without a record for their idle release, each named once (until its next record)."""
        now = self._clock()
        found = []
        for idle_release_s, streams in self._by_idle_s.items():
            while streams:
                stream, arrived = next(iter(streams.items()))
                if now - arrived < idle_release_s:
                    break
                del streams[stream]
                found.append(stream)
        return found

    def forget(self, owner: Hashable) -> None:
        """Stop tracking both sides of a join key (an evicted one)."""
        for streams in self._by_idle_s.values():
            streams.pop((owner, LEFT), None)
            streams.pop((owner, RIGHT), None)

    def __len__(self) -> int:
        return sum(map(len, self._by_idle_s.values()))


def due_sides(state: bytes | None, now_ms: int, idle_release_ms: float) -> list[int]:
    """The sides of a key's stored state (the batch path) that buffer records and had none arrive for
    ``idle_release_ms`` up to ``now_ms``."""
    if state is None:
        return []
    reorder, _ = load_key_state(state)
    return [side for side in (LEFT, RIGHT)
            if len(reorder.times[side]) and now_ms - reorder.arrived_ms[side] >= idle_release_ms]


def next_due_ms(state: bytes | None, idle_release_ms: float) -> int | None:
    """When the earliest side of a key's stored state that buffers records is due for its idle release."""
    if state is None:
        return None
    reorder, _ = load_key_state(state)
    due = [reorder.arrived_ms[side] + idle_release_ms for side in (LEFT, RIGHT) if len(reorder.times[side])]
    return int(min(due)) if due else None
