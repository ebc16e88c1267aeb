"""The MQTT topic of a row: one topic per machine, `machine/states/<thing>`.

A topic of its own per machine lets several stream connector instances share the input, each
subscribed to filters of its own, while every machine's rows stay on one topic and so in order
(03_stream_connector, "Several instances"). Every topic lies under `machine/states/#`, where the
broker lets devices publish.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pipeline_core.settings import MACHINE_STATES_TOPIC

THING_PLACEHOLDER = "{thing}"
THING_TOPIC_TEMPLATE = f"{MACHINE_STATES_TOPIC}/{THING_PLACEHOLDER}"
# Characters that are no part of a topic level: the level separator and the wildcards.
NOT_IN_A_LEVEL = frozenset("/+#")
# Code points Mosquitto refuses in a topic, closing the connection (`mosquitto_validate_utf8`, confirmed with
# Mosquitto 2.0.11): C0 controls with NUL, DEL and the C1 controls, the noncharacters U+FDD0-U+FDEF and every
# U+xFFFE and U+xFFFF; and the lone surrogates UTF-8 cannot carry.
REFUSED_BY_THE_BROKER = re.compile("[" + r"\x00-\x1f\x7f-\x9f\ufdd0-\ufdef\ud800-\udfff"
                                   + "".join(chr(plane << 16 | low) for plane in range(17) for low in (0xFFFE, 0xFFFF))
                                   + "]")
# The longest Thing put into a topic (the validation's name limit; a topic may hold 65,535 bytes).
MAX_LEVEL_CHARS = 256


def fits_a_level(thing: Any) -> bool:
    """True when `thing` can be one topic level as it is, one the broker takes: a non-empty string of at most
    MAX_LEVEL_CHARS without / + #, not starting with $ (the broker's own topics), without a code point Mosquitto
    refuses in a topic (REFUSED_BY_THE_BROKER)."""
    if type(thing) is not str or not thing or len(thing) > MAX_LEVEL_CHARS or thing.startswith("$"):
        return False
    return NOT_IN_A_LEVEL.isdisjoint(thing) and REFUSED_BY_THE_BROKER.search(thing) is None


def row_topic(template: str) -> Callable[[dict[str, Any]], str]:
    """The function that gives a row its topic: `template` with {thing} replaced by the row's Thing.

    A row whose Thing cannot be a topic level (`fits_a_level`: missing, not a string, holding a wildcard, a
    slash or a character the broker refuses in a topic, such as a tab) goes to `fallback_topic(template)`,
    `machine/states` by default, which the connector's default filter `machine/states/#` covers too: the
    connector reads the Thing from the row, never from the topic."""
    if THING_PLACEHOLDER not in template:
        return lambda _row: template
    fallback = fallback_topic(template)

    def topic(row: dict[str, Any]) -> str:
        thing = row.get("Thing") if isinstance(row, dict) else None
        return template.replace(THING_PLACEHOLDER, thing) if fits_a_level(thing) else fallback

    return topic


def fallback_topic(template: str) -> str | None:
    """The topic of the rows whose Thing cannot be a topic level: the template's part before `/{thing}`; None for
    a template without {thing}, whose one topic every row takes."""
    if THING_PLACEHOLDER not in template:
        return None
    return template.split(THING_PLACEHOLDER, 1)[0].rstrip("/") or template.replace(THING_PLACEHOLDER, "_")
