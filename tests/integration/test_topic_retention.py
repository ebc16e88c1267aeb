"""Kafka retains the pipeline's topics by size as well as by time: a topic created before the size bound
existed (unbounded, or with another bound) gets the configured retention.bytes when the topics are ensured again."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from pipeline_core.kafka_clients import admin_client, retry_transient
from pipeline_core.topics import MACHINE_DATA, ensure_topics
from support import unique, wait_for

pytestmark = pytest.mark.integration


def test_ensure_topics_sets_the_size_bound_on_an_existing_topic(bootstrap: str) -> None:
    admin = admin_client(bootstrap)
    spec = dataclasses.replace(MACHINE_DATA, name=unique("machine.data.bound"))
    for future in admin.create_topics([NewTopic(spec.name, 1, 1, config={"retention.ms": "172800000",
                                                                        "retention.bytes": "-1"})]).values():
        future.result(30)
    resource = ConfigResource(ResourceType.TOPIC, spec.name)
    try:
        assert described(admin, resource, "the new topic's configuration")["retention.bytes"].value == "-1"
        assert ensure_topics(admin, (spec,)) == []  # nothing created: it exists
        configs = described(admin, resource, "the size bound", lambda found: found["retention.bytes"].value != "-1")
        assert configs["retention.bytes"].value == spec.config["retention.bytes"]
        assert configs["retention.ms"].value == "172800000"  # the rest left as it was
    finally:
        for future in admin.delete_topics([spec.name], operation_timeout=30).values():
            future.result(30)


def described(admin: AdminClient, resource: ConfigResource, what: str,
              holds: Callable[[dict], bool] = lambda _: True) -> dict:
    """The topic's configuration once the broker answering `describe` shows what `holds`: the controller
    acknowledges a topic's creation or change once committed, and each broker applies it from the metadata log a
    moment later."""
    def configs() -> dict | None:
        found = retry_transient(lambda: admin.describe_configs([resource])[resource].result(30),
                                what=f"describing {resource.name}", deadline_s=30)
        return found if holds(found) else None

    return wait_for(configs, 30, f"{what} in the broker's view")
