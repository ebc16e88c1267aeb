"""The Kafka key of a record on machine.data and machine.out: its thing and its quantity, for any names.

    key = escaped thing + "." + quantity, in UTF-8
    escaped thing = the thing with each "\\" written "\\\\" and each "." written "\\."

The thing ends at the key's first dot that no backslash escapes; the quantity is the rest, as it is (it may
hold dots and backslashes of its own). So ``Plant1.Hall2.Press3`` measuring ``actSpeed_C11`` is keyed
``Plant1\\.Hall2\\.Press3.actSpeed_C11``, and every pair of names has a key of its own.

A thing without a dot and without a backslash (every thing the pipeline took before names could hold them)
is its own escape: its keys are byte for byte what they always were, so records written before and the
joiners' state (kept by thing, never by key) read the same after an upgrade.

`record_key` and `split_key` are the only places that build and take apart a key: every stage goes through
them (`pipeline_core.admission` for the joiners' step 1 and key check).
"""
from __future__ import annotations

import functools
import re
from typing import NamedTuple

KEY_SEPARATOR = "."
KEY_ESCAPE = "\\"
_ESCAPES = str.maketrans({KEY_ESCAPE: KEY_ESCAPE * 2, KEY_SEPARATOR: KEY_ESCAPE + KEY_SEPARATOR})
# An escaped thing and its separating dot: runs of characters that are neither backslash nor dot, and backslashes
# escaping one of them; possessive, as a key's thing has one reading.
_ESCAPED_THING = re.compile(r"(?:[^\\.]++|\\[\\.])*+\.", re.DOTALL)


class KeyParts(NamedTuple):
    """What a record key names: a thing and one of its quantities."""

    thing: str
    quantity: str


# A plant of 100,000 machines fits, as `pipeline_core.partitioning.thing_partition`'s cache: a thing named by its
# path (``Plant1.Hall2.Press3``) is escaped once, not once per record (the stream connector writes a dozen a row).
@functools.lru_cache(maxsize=1 << 17)
def escape_thing(thing: str) -> str:
    """The thing as its keys begin with it, before the separating dot (cached: a pipeline sees few things, many
    times)."""
    if KEY_SEPARATOR not in thing and KEY_ESCAPE not in thing:  # nearly every thing: no copy
        return thing
    return thing.translate(_ESCAPES)


def key_prefix(thing: str) -> str:
    """What every key of `thing` starts with: its escape and the separating dot (a column of keys is these
    prefixes with the quantities appended)."""
    return escape_thing(thing) + KEY_SEPARATOR


def record_key(thing: str, quantity: str) -> str:
    """The Kafka key of the records of `thing`'s `quantity`: all values of one time series land in one
    partition, in order."""
    return escape_thing(thing) + KEY_SEPARATOR + quantity


def split_key(key: str) -> KeyParts | None:
    """The thing and quantity of a record key (`record_key`'s inverse); None when the text is no record key:
    no unescaped dot, or a backslash in the thing that escapes neither a backslash nor a dot."""
    if KEY_ESCAPE not in key:
        thing, separator, quantity = key.partition(KEY_SEPARATOR)
        return KeyParts(thing, quantity) if separator else None
    # In C, not character by character: a joiner takes the key of a thing named by its path apart per record.
    escaped = _ESCAPED_THING.match(key)
    if escaped is None:
        return None
    separator_at = escaped.end() - 1
    # Every dot of an escaped thing has its backslash: what backslashes are left after those are escaped ones.
    thing = key[:separator_at].replace(KEY_ESCAPE + KEY_SEPARATOR, KEY_SEPARATOR).replace(KEY_ESCAPE * 2, KEY_ESCAPE)
    return KeyParts(thing, key[separator_at + 1:])
