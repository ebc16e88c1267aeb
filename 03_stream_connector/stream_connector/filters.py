"""The MQTT topic filters one connector instance subscribes to, checked before it connects.

Several instances share the input by taking disjoint filters (README, "Several instances"): each
machine publishes on a topic of its own, so all its rows reach one instance, in order, and land in
its thing's partition. MQTT shared subscriptions (`$share/<group>/...`) are refused: Mosquitto hands
their messages out to the group's members in turn, message by message, so one machine's rows would
be written by several instances at once and reach Kafka out of order.
"""
from __future__ import annotations

SHARED_SUBSCRIPTION_PREFIX = "$share/"


class FilterError(ValueError):
    """The filters cannot be subscribed to as given; the message says why."""


def filter_problem(topic_filter: str) -> str | None:
    """Why `topic_filter` is no valid MQTT topic filter, or None (MQTT 3.1.1, 4.7.1)."""
    if not topic_filter:
        return "is empty"
    if "\0" in topic_filter:
        return "contains NUL"
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            return "has '#' other than as its whole last level"
        if "+" in level and level != "+":
            return "has '+' other than as a whole level"
    return None


def overlap(first: str, second: str) -> bool:
    """True when some topic matches both filters (`a/#` matches `a` itself, as MQTT says)."""
    a, b = first.split("/"), second.split("/")
    index = 0
    while True:
        if (index < len(a) and a[index] == "#") or (index < len(b) and b[index] == "#"):
            return True
        if index == len(a) or index == len(b):
            return len(a) == len(b)
        if "+" not in (a[index], b[index]) and a[index] != b[index]:
            return False
        index += 1


def covers(wider: str, narrower: str) -> bool:
    """True when every topic that matches `narrower` matches `wider` too."""
    a, b = wider.split("/"), narrower.split("/")
    for index, level in enumerate(a):
        if level == "#":
            return True
        if index == len(b):
            return False  # `narrower` ends here (a topic one level short of `wider`'s)
        if b[index] == "#" or (level != "+" and (b[index] == "+" or b[index] != level)):
            return False
    return len(a) == len(b)


def parse_filters(text: str) -> list[str]:
    """The comma-separated filters of `text`, or `FilterError`: each valid, no shared subscription,
    no two overlapping (a row on both would come twice)."""
    filters = [part.strip() for part in text.split(",")]
    if not any(filters):
        raise FilterError("no topic filter given")
    for topic_filter in filters:
        if topic_filter.startswith(SHARED_SUBSCRIPTION_PREFIX):
            raise FilterError(
                f"{topic_filter!r} is a shared subscription: Mosquitto deals its messages out to the group's "
                "members one by one, so a machine's rows would reach Kafka out of order; give each instance "
                "filters of its own instead")
        problem = filter_problem(topic_filter)
        if problem is not None:
            raise FilterError(f"topic filter {topic_filter!r} {problem}")
    for index, topic_filter in enumerate(filters):
        for other in filters[index + 1:]:
            if overlap(topic_filter, other):
                raise FilterError(f"topic filters {topic_filter!r} and {other!r} overlap: a row on both would "
                                  "come twice; make them disjoint")
    return filters
