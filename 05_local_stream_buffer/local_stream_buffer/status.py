"""What became of an ingested record."""

from enum import Enum


class IngestStatus(Enum):
    ACCEPTED = "accepted"  # held for joining
    DUPLICATE = "duplicate"  # exact duplicate (same time, same result) of its stream's last record: dropped
    REJECTED = "rejected"  # breaks its stream's time order (older, or same time with another result), or malformed
    LATE = "late"  # inside a gap of its stream that forcing already closed: pairs were emitted without it
    UNROUTED = "unrouted"  # matches no join spec (keyed joiner only)
