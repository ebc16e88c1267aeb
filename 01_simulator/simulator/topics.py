"""The MQTT topic of a row: one topic per machine, `machine/states/<thing>`.

A topic of its own per machine lets several stream connector instances share the input, each
subscribed to filters of its own, while every machine's rows stay on one topic and so in order
(03_stream_connector, "Several instances"). Every topic lies under `machine/states/#`, where the
broker lets devices publish.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline_core.settings import MACHINE_STATES_TOPIC

THING_PLACEHOLDER = "{thing}"
THING_TOPIC_TEMPLATE = f"{MACHINE_STATES_TOPIC}/{THING_PLACEHOLDER}"
# Characters that are no part of a topic level: the level separator, the wildcards, NUL.
NOT_IN_A_LEVEL = frozenset("/+#\0")
# The longest Thing put into a topic (the validation's name limit; a topic may hold 65,535 bytes).
MAX_LEVEL_CHARS = 256


def fits_a_level(thing: Any) -> bool:
    """True when `thing` can be one topic level as it is: a non-empty string without / + # or NUL,
    not starting with $ (the broker's own topics), and no lone surrogate (a topic is UTF-8)."""
    if type(thing) is not str or not thing or len(thing) > MAX_LEVEL_CHARS or thing.startswith("$"):
        return False
    if not NOT_IN_A_LEVEL.isdisjoint(thing):
        return False
    try:
        thing.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def row_topic(template: str) -> Callable[[dict[str, Any]], str]:
    """The function that gives a row its topic: `template` with {thing} replaced by the row's Thing.

    A row whose Thing cannot be a topic level (missing, not a string, holding a wildcard: a row the
    connector dead-letters anyway) goes to the template's part before `/{thing}`, `machine/states`
    by default, which the connector's default filter `machine/states/#` covers too."""
    if THING_PLACEHOLDER not in template:
        return lambda _row: template
    fallback = template.split(THING_PLACEHOLDER, 1)[0].rstrip("/") or template.replace(THING_PLACEHOLDER, "_")

    def topic(row: dict[str, Any]) -> str:
        thing = row.get("Thing") if isinstance(row, dict) else None
        return template.replace(THING_PLACEHOLDER, thing) if fits_a_level(thing) else fallback

    return topic
