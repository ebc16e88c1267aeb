"""Deterministic time-series join of two in-order streams (pure Python + numpy, no I/O).

``from local_stream_buffer import Record, StreamBuffer`` is a drop-in for the seed's LocalStreamBuffer: that
seed-compatible API speaks epoch **seconds** under the seed's names (``Record.phenomenonTime``, ``delta_time``,
``max_latency``). The rest of the package speaks the pipeline's wire unit, epoch **milliseconds**, and names it
(``delta_time_ms``, ``max_out_of_orderness_ms``; processing time in seconds: ``max_latency_s``).
"""

from .cases import JoinCase
from .record import Record, record_from_dict
from .status import IngestStatus
from .stream_buffer import StreamBuffer
from .two_stream_join import DEFAULT_MAX_PENDING_PER_SIDE, LEFT, RIGHT, TwoStreamJoin

__all__ = [
    "DEFAULT_MAX_PENDING_PER_SIDE",
    "IngestStatus",
    "JoinCase",
    "LEFT",
    "RIGHT",
    "Record",
    "StreamBuffer",
    "TwoStreamJoin",
    "record_from_dict",
]
