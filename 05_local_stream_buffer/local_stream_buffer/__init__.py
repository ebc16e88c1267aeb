"""Deterministic time-series join of two in-order streams (pure Python + numpy, no I/O).

``from local_stream_buffer import Record, StreamBuffer`` is a drop-in for the seed's LocalStreamBuffer.
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
