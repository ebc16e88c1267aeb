"""Quix Streams' as-of join (``StreamingDataFrame.join_asof``), as its documentation sets it up.

Quix joins two topics co-partitioned by the join key and does not join a topic with itself, so the app
splits ``machine.data`` into the speed and the torque stream of each (thing, axis) with ``group_by`` (one
repartition topic each, keyed ``<thing>.<output quantity>``), then joins every speed record with the latest
torque record at or before it (``how="inner"``), keeps pairs at most delta_time apart, and writes output
records of the engine's shape. Event time is the record's phenomenonTime (the topic's timestamp extractor).
Exactly once: ``processing_guarantee="exactly-once"``, committing as often as the standalone joiner does.

It runs in its own virtualenv (``venvs.REQUIREMENTS["quix"]``), as a Quix service would:
``python -m benchmarks.peers.quix_asof <settings.json>`` (``peer_io``); SIGTERM stops it after a last commit.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

from benchmarks.peers import peer_io

with warnings.catch_warnings():
    # Its Kafka client's schema-registry extra imports a deprecated module of Authlib on import; not used here.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated", category=DeprecationWarning)
    from quixstreams import Application


def _phenomenon_time(value: Any, _headers: Any, _timestamp: int, _timestamp_type: Any) -> int:
    return int(value["phenomenonTime"])


def build_app(settings: dict[str, Any], status: peer_io.Status) -> Application:
    """The app: machine.data -> per spec, speed and torque re-keyed by join key -> as-of join -> output topic."""
    app = Application(broker_address=settings["bootstrap"], consumer_group=settings["group"],
                      auto_offset_reset="earliest", processing_guarantee="exactly-once",
                      commit_interval=settings["commit_interval_s"], state_dir=settings["state_dir"],
                      loglevel="WARNING")
    source = app.topic(settings["input_topic"], key_deserializer="str", value_deserializer="json",
                       timestamp_extractor=_phenomenon_time)
    output = app.topic(settings["output_topic"], key_serializer="str", value_serializer="json")
    records = app.dataframe(source).update(lambda _value: status.count("inputs"))
    for spec in peer_io.specs(settings):
        sides = []
        for side in (0, 1):
            stream = records.filter(lambda value, side=side, spec=spec: spec.axis(side, value["quantity"]) is not None)
            stream = stream.group_by(lambda value, side=side, spec=spec: _join_key(spec, side, value),
                                     name=f"{spec.name}-{side}")
            sides.append(stream.update(lambda _value: status.count("joinable")))
        joined = sides[0].join_asof(
            sides[1], how="inner", name=spec.name,
            on_merge=lambda left, right, spec=spec: spec.output_record(left["thing"], spec.axis(0, left["quantity"]),
                                                                       left, right))
        joined = joined.filter(lambda pair, spec=spec: spec.within_delta(pair["left"]["phenomenonTime"],
                                                                         pair["right"]["phenomenonTime"]))
        joined.to_topic(output, key=lambda pair: pair["thing"])
    return app


def _join_key(spec: peer_io.PeerSpec, side: int, record: dict[str, Any]) -> str:
    """The key both sides of a join are re-keyed by: thing and output quantity."""
    return f"{record['thing']}.{spec.output_quantity(spec.axis(side, record['quantity']))}"


def main() -> None:
    """Run the app until SIGTERM (Quix stops at the next message and commits)."""
    logging.basicConfig(level=logging.WARNING)
    settings = peer_io.load_settings()
    status = peer_io.Status(settings["status_file"])
    build_app(settings, status).run()
    status.set(finished=True)


if __name__ == "__main__":
    main()
