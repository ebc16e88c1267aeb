"""`python -m benchmarks.mqtt_publish`: rows/s simulator -> Mosquitto, the seed's method beside ours.

Both publish real rows to a fresh topic while a QoS 1 subscriber in another process counts what
arrives, so "lost" is measured, not assumed. The seed's method is `paho.mqtt.publish.single` at
QoS 2: a new connection and a four-packet handshake per row. The machine is shared, so the two
methods take turns in several rounds and each is summed over its rounds.
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import multiprocessing
import time
import uuid
from dataclasses import dataclass

from paho.mqtt import publish
from paho.mqtt.enums import MQTTErrorCode, MQTTProtocolVersion

from pipeline_core.settings import ConnectionSettings, load_settings
from pipeline_core.mqtt import new_client, pump, wait_connected

from simulator.events import in_order, read_events, repeat
from simulator.publisher import Publisher
from simulator.settings import DEFAULT_EVENTS_FILE

from benchmarks.results import Results, at_least, at_most

SPEED_UP_TARGET = 5.0  # ours against the seed's rows/s


@dataclass(frozen=True)
class Result:
    method: str
    rows: int
    seconds: float
    received: int

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


def _count(settings: ConnectionSettings, topic: str, expected: int, ready, result, deadline_s: float) -> None:
    """Subscriber process: count rows on `topic` until `expected` arrived or the deadline passed."""
    received = [0]
    client = new_client(settings, f"bench-subscriber-{uuid.uuid4().hex[:8]}",
                        protocol=MQTTProtocolVersion.MQTTv311, clean_session=True)
    client.on_message = lambda *_args: received.__setitem__(0, received[0] + 1)
    client.on_subscribe = lambda *_args: ready.set()
    client.connect(settings.mqtt_host, settings.mqtt_port)
    wait_connected(client, 10)
    client.subscribe(topic, qos=1)
    end = time.monotonic() + deadline_s
    while received[0] < expected and time.monotonic() < end:
        if pump(client, 0.1) != MQTTErrorCode.MQTT_ERR_SUCCESS:
            break
    client.disconnect()
    result.put(received[0])


def _with_subscriber(settings: ConnectionSettings, rows: list[bytes], method: str, send) -> Result:
    topic = f"bench/{uuid.uuid4().hex[:10]}/states"
    context = multiprocessing.get_context("spawn")
    ready, counted = context.Event(), context.Queue()
    subscriber = context.Process(target=_count, args=(settings, topic, len(rows), ready, counted, 120), daemon=True)
    subscriber.start()
    if not ready.wait(30):
        raise RuntimeError("the counting subscriber did not subscribe")
    started = time.perf_counter()
    send(topic, rows)
    seconds = time.perf_counter() - started
    received = counted.get(timeout=150)
    subscriber.join(10)
    return Result(method, len(rows), seconds, received)


def seed_method(settings: ConnectionSettings, rows: list[bytes]) -> Result:
    def send(topic: str, payloads: list[bytes]) -> None:
        auth = {"username": settings.mqtt_username, "password": settings.mqtt_password} \
            if settings.mqtt_username else None
        for payload in payloads:
            publish.single(topic, payload, qos=2, hostname=settings.mqtt_host, port=settings.mqtt_port, auth=auth)

    return _with_subscriber(settings, rows, "seed: publish.single, QoS 2, a connection per row", send)


def our_method(settings: ConnectionSettings, rows: list[bytes], window: int, inflight: int) -> Result:
    def send(topic: str, payloads: list[bytes]) -> None:
        publisher = Publisher(settings, f"bench-publisher-{uuid.uuid4().hex[:8]}", window=window, inflight=inflight)
        publisher.connect()
        for payload in payloads:
            publisher.publish(topic, payload)
        if publisher.drain(60) or publisher.failed:
            raise RuntimeError(f"{publisher.failed} rows were not acknowledged")
        publisher.close()

    return _with_subscriber(settings, rows, f"ours: one connection, QoS 1, window {window}", send)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mqtt_publish", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed-rows", type=int, default=900, help="rows for the seed's method, over all rounds (default 900)")
    parser.add_argument("--rows", type=int, default=30_000, help="rows for ours, over all rounds (default 30000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--inflight", type=int, default=0, help="paho's inflight limit (0 = off)")
    args, rest = parser.parse_known_args(argv)
    recorded = Results("mqtt_publish", argv)
    settings = load_settings(ConnectionSettings, rest, prog="python -m benchmarks.mqtt_publish")
    events = in_order(read_events(DEFAULT_EVENTS_FILE), "time")
    payloads = [json.dumps(row).encode() for row in itertools.islice(repeat(events), max(args.rows, args.seed_rows))]

    # publish.single turns on paho's logger, which then reports each closed connection as an error.
    logging.getLogger("paho").setLevel(logging.CRITICAL)
    print(f"simulator -> Mosquitto {settings.mqtt_host}:{settings.mqtt_port}, real rows, a live QoS 1 "
          f"subscriber in another process counting arrivals, {args.rounds} alternating rounds")
    rounds = [(seed_method(settings, payloads[:args.seed_rows // args.rounds]),
               our_method(settings, payloads[:args.rows // args.rounds], args.window, args.inflight))
              for _ in range(args.rounds)]
    results = [Result(per_round[0].method, sum(r.rows for r in per_round), sum(r.seconds for r in per_round),
                      sum(r.received for r in per_round)) for per_round in zip(*rounds)]
    print(f"{'method':<52} {'rows':>7} {'rows/s':>8} {'received':>9} {'lost':>5}")
    for result in results:
        print(f"{result.method:<52} {result.rows:>7,} {result.rate:>8,.0f} {result.received:>9,} "
              f"{result.rows - result.received:>5,}")
    seed, ours = results
    print(f"ours / seed: {ours.rate / seed.rate:.1f}x (target >= {SPEED_UP_TARGET:g}x), "
          f"loss {'none' if all(r.received == r.rows for r in results) else 'SEEN'}")
    recorded.add("ours: one connection, QoS 1", ours.rate, "rows/s")
    recorded.add("seed's method: a connection per row, QoS 2", seed.rate, "rows/s")
    recorded.add("ours / seed's method", ours.rate / seed.rate, "x", at_least(SPEED_UP_TARGET))
    recorded.add("rows lost, both methods", sum(r.rows - r.received for r in results), "rows", at_most(0), count=True)
    recorded.write()
    return 0 if all(r.received == r.rows for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
