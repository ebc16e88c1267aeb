"""The time-series record of the seed's API: one measurement or event of one quantity."""

from __future__ import annotations

from typing import Any, Mapping

from pipeline_core.timestamps import to_epoch_seconds


class Record:
    """A measurement or event: quantity, time in epoch seconds, result and free metadata.

    Seed-compatible: ``Record(quantity, timestamp=None, phenomenon_time=None, result=None, **metadata)``.
    The time may be given in s, ms, µs or ns (normalised to seconds) or as an ISO-8601 string (naive = UTC).
    """

    __slots__ = ("quantity", "phenomenonTime", "result", "metadata")

    def __init__(
        self,
        quantity: object,
        timestamp: float | int | str | None = None,
        phenomenon_time: float | int | str | None = None,
        result: Any = None,
        **metadata: Any,
    ) -> None:
        if timestamp is not None:
            self.phenomenonTime = to_epoch_seconds(timestamp)
        elif phenomenon_time is not None:
            self.phenomenonTime = to_epoch_seconds(phenomenon_time)
        else:
            raise ValueError("either 'timestamp' or 'phenomenon_time' has to be set")
        self.quantity = str(quantity)
        self.result = result
        self.metadata = metadata

    @classmethod
    def from_dict(cls, fields: Mapping[str, Any]) -> Record:
        """A record from a dict with 'quantity', 'timestamp' or 'phenomenonTime', 'result'; the rest is metadata."""
        metadata = dict(fields)
        quantity = metadata.pop("quantity", None)
        timestamp = metadata.pop("timestamp", None)
        phenomenon_time = metadata.pop("phenomenonTime", None)
        result = metadata.pop("result", None)
        return cls(quantity, timestamp=timestamp, phenomenon_time=phenomenon_time, result=result, **metadata)

    def set_quantity(self, quantity: str) -> None:
        self.quantity = quantity

    def get_quantity(self) -> str:
        return self.quantity

    def get_time(self) -> float | int:
        return self.phenomenonTime

    def get_result(self) -> Any:
        return self.result

    def get(self, name: str) -> Any:
        """A metadata attribute, None if absent."""
        return self.metadata.get(name)

    def get_metadata(self) -> dict[str, Any]:
        return self.metadata

    def __repr__(self) -> str:
        tail = f", meta={self.metadata}}}" if self.metadata else "}"
        return f"{{phenomenonTime={self.phenomenonTime}, quantity={self.quantity}, result={self.result}" + tail


def record_from_dict(fields: Mapping[str, Any]) -> Record:
    """Seed-compatible alias of :meth:`Record.from_dict`."""
    return Record.from_dict(fields)
