"""Quix Streams' as-of join (``StreamingDataFrame.join_asof``), as its documentation sets it up.

Quix joins two topics co-partitioned by the join key and does not join a topic with itself, so the app
splits ``machine.data`` into the speed and the torque stream of each (thing, axis) with ``group_by`` (one
repartition topic each, keyed ``<thing>.<output quantity>``), then joins every speed record with the latest
torque record at or before it (``how="inner"``), keeps pairs at most delta_time apart, and writes output
records of the engine's shape. Event time is the record's phenomenonTime (the topic's timestamp extractor).
Exactly once: ``processing_guarantee="exactly-once"``, committing as often as the standalone joiner does.

It runs in a process of its own (``run_app``), as a Quix service would; counters in shared memory tell the
bench how far it got.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import multiprocessing
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

with warnings.catch_warnings():
    # Its Kafka client's schema-registry extra imports a deprecated module of Authlib on import; not used here.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated", category=DeprecationWarning)
    from quixstreams import Application

from local_stream_buffer.specs import JoinSpec, SpecBinding

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class QuixAsofSettings:
    bootstrap: str
    input_topic: str
    output_topic: str
    consumer_group: str
    state_dir: Path
    commit_interval_s: float
    specs: tuple[JoinSpec, ...]


@dataclasses.dataclass
class QuixAsofProgress:
    """Shared with the bench's process: what the app has processed so far, and when it started."""

    inputs: Any  # multiprocessing.Value('q'): machine.data records processed
    joinable: Any  # multiprocessing.Value('q'): records processed from the two repartition topics
    first_input_at: Any  # multiprocessing.Value('d'): wall-clock time of the first input record, 0 before
    cpu_seconds: Any  # multiprocessing.Value('d'): the app's CPU time, written when it stopped

    @classmethod
    def shared(cls, context: multiprocessing.context.BaseContext) -> QuixAsofProgress:
        return cls(context.Value("q", 0, lock=False), context.Value("q", 0, lock=False),
                   context.Value("d", 0.0, lock=False), context.Value("d", 0.0, lock=False))


def _phenomenon_time(value: Any, _headers: Any, _timestamp: int, _timestamp_type: Any) -> int:
    return int(value["phenomenonTime"])


def build_app(settings: QuixAsofSettings, progress: QuixAsofProgress) -> Application:
    """The app: machine.data -> per spec, speed and torque re-keyed by join key -> as-of join -> output topic."""
    app = Application(broker_address=settings.bootstrap, consumer_group=settings.consumer_group,
                      auto_offset_reset="earliest", processing_guarantee="exactly-once",
                      commit_interval=settings.commit_interval_s, state_dir=str(settings.state_dir),
                      loglevel="WARNING")
    source = app.topic(settings.input_topic, key_deserializer="str", value_deserializer="json",
                       timestamp_extractor=_phenomenon_time)
    output = app.topic(settings.output_topic, key_serializer="str", value_serializer="json")

    def count_input(_value: Any) -> None:
        if not progress.inputs.value:
            progress.first_input_at.value = time.time()
        progress.inputs.value += 1

    def count_joinable(_value: Any) -> None:
        progress.joinable.value += 1

    records = app.dataframe(source).update(count_input)
    for spec in settings.specs:
        sides = []
        for side, pattern in enumerate((spec.left, spec.right)):
            binding_of = _bindings(spec, pattern)
            stream = records.filter(lambda value, binding_of=binding_of: binding_of(value["quantity"]) is not None)
            stream = stream.group_by(lambda value, binding_of=binding_of: _join_key(value, binding_of),
                                     name=f"{spec.name}-{side}")
            sides.append(stream.update(count_joinable))
        left_binding = _bindings(spec, spec.left)
        delta_ms = float("inf") if spec.delta_time is None else spec.delta_time * 1000
        joined = sides[0].join_asof(
            sides[1], how="inner", name=spec.name,
            on_merge=lambda left, right, binding_of=left_binding: _output_record(binding_of(left["quantity"]),
                                                                                 left, right))
        joined = joined.filter(lambda pair, delta_ms=delta_ms:
                               pair["left"]["phenomenonTime"] - pair["right"]["phenomenonTime"] <= delta_ms)
        joined.to_topic(output, key=lambda pair: pair["thing"])
    return app


def _join_key(record: dict[str, Any], binding_of: Callable[[str], SpecBinding | None]) -> str:
    """The key both sides of a join are re-keyed by: thing and output quantity."""
    return f"{record['thing']}.{binding_of(record['quantity']).output_quantity}"


def _bindings(spec: JoinSpec, pattern: str) -> Callable[[str], SpecBinding | None]:
    """The binding of ``spec`` a quantity of ``pattern`` (the spec's left or right) feeds, None for others."""
    compiled = spec.compile(pattern)

    @functools.lru_cache(maxsize=4096)
    def binding_of(quantity: str) -> SpecBinding | None:
        match = compiled.fullmatch(quantity)
        return None if match is None else spec.bind(match.groupdict().get("axis", ""))

    return binding_of


def _output_record(binding: SpecBinding, left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    """An output record of the engine's shape (no ``case``, no ``id``: an as-of join has neither)."""
    return {"thing": left["thing"], "quantity": binding.output_quantity,
            "phenomenonTime": (left["phenomenonTime"] + right["phenomenonTime"]) / 2,
            "result": binding.combine(left["result"], right["result"]),
            "left": {key: left[key] for key in ("quantity", "phenomenonTime", "result")},
            "right": {key: right[key] for key in ("quantity", "phenomenonTime", "result")}}


def run_app(settings: QuixAsofSettings, progress: QuixAsofProgress) -> None:
    """The process's target: run the app until SIGTERM (Quix stops at the next message and commits)."""
    logging.basicConfig(level=logging.WARNING)
    cpu_before = time.process_time()  # after the imports, as the other peers' figures start
    build_app(settings, progress).run()
    progress.cpu_seconds.value = time.process_time() - cpu_before
