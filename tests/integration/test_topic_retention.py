"""Kafka retains the pipeline's topics by size as well as by time: a topic created before the size bound
existed (unbounded, or with another bound) gets the configured retention.bytes when the topics are ensured again."""
from __future__ import annotations

import dataclasses

import pytest
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from pipeline_core.kafka_clients import admin_client
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
        assert admin.describe_configs([resource])[resource].result(30)["retention.bytes"].value == "-1"
        assert ensure_topics(admin, (spec,)) == []  # nothing created: it exists
        # The controller acknowledges the change once committed; the broker that answers `describe` applies it from
        # the metadata log a moment later.
        def bounded() -> dict | None:
            configs = admin.describe_configs([resource])[resource].result(30)
            return configs if configs["retention.bytes"].value != "-1" else None

        configs = wait_for(bounded, 30, "the size bound in the broker's view")
        assert configs["retention.bytes"].value == spec.config["retention.bytes"]
        assert configs["retention.ms"].value == "172800000"  # the rest left as it was
    finally:
        for future in admin.delete_topics([spec.name], operation_timeout=30).values():
            future.result(30)
