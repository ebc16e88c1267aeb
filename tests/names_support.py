"""Machine names as plants and their exports make them, for the tests of every place a name meets a syntax: the
Kafka key, InfluxDB's line protocol and InfluxQL, an MQTT topic, JSON.

`names()` draws any text of 1 to 256 characters (no lone surrogate: that is no text), weighted towards what
breaks syntaxes: dots and backslashes (the key's separator and escape), line-protocol specials, MQTT's level
separator and wildcards, quotes, control characters (NUL, tab, line feed, carriage return, DEL, C1), separators
(space, no-break space, U+2028/U+2029), format characters (BOM, zero-width joiner), private-use, unassigned and
noncharacter code points. `PLANT_NAMES` are a fixed few of each kind, for the end-to-end runs.
"""
from __future__ import annotations

from hypothesis import strategies as st

MAX_NAME_LENGTH = 256  # 03_stream_connector/README.md, "What a valid row is"

SYNTAX = list(".\\/+#$ ,=\"'`{}[]()*?^|:;@&%~<>!")
CONTROL = ["\x00", "\t", "\n", "\r", "\x0b", "\x0c", "\x1b", "\x1f", "\x7f", "\x85", "\x9f"]
SEPARATOR = [" ", "\xa0", "\u2028", "\u2029", "\u3000"]
FORMAT = ["\ufeff", "\u200b", "\u200d", "\u202e", "\u00ad"]
ODD = ["\ue000", "\U000f0000", "\ufdd0", "\ufffe", "\uffff", "\U0001fffe", "\U0010ffff", "\u0378", "😀", "Ω", "ß",
       "中"]

name_characters = st.one_of(
    st.sampled_from(SYNTAX + CONTROL + SEPARATOR + FORMAT + ODD),
    st.characters(whitelist_categories=("Cc", "Cf", "Co", "Cn", "Zs", "Zl", "Zp")),
    st.characters(blacklist_categories=("Cs",)),
)


def names(max_size: int = MAX_NAME_LENGTH) -> st.SearchStrategy[str]:
    """Any name: 1 to `max_size` characters of text."""
    return st.text(name_characters, min_size=1, max_size=max_size)


# Machines as real plants name them: ISA-95 / OPC UA paths, Windows paths and shares, a CSV's stray tab, line feed
# and carriage return, spaces, slashes, MQTT wildcards, quotes, line-protocol specials, JSON and the key's escape,
# non-ASCII, NUL, format and private-use characters, and the longest name.
PLANT_NAMES = [
    "Plant1.Hall2.Press3", "R08.15", ".", "..", "a.", ".a", "C:\\Presses\\P3", "\\\\srv\\line\\", "\\", "a\\.b",
    "Press\t4", "Press 5\n", "Press\r\n6", "Line 7/Cell 8", "machine/states/#", "+", "$SYS", 'Presse "9"', "'10'",
    "Zeile 1, Presse=2", "\\\"quoted\"", "Säge Ω ☃ 中", "\x00NUL", "\u2028", "\ufeffBOM", "\ue000", "\x85",
    "P" * (MAX_NAME_LENGTH - 1) + ".",
]
