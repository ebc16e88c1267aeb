"""Where each join spec started in each input partition, kept in the joiners' committed offsets.

A join spec added to a running stack joins from the joiner's position at the change: every record the joiner had
not yet joined, and all later ones; no record before it reaches the new spec (docs/operations.md, "Join specs
changed"). Both joiners commit their input position in Kafka with every transaction; with it, as the commit's
metadata, they commit per partition where each spec they run started there: `specs=<fingerprint>@<offset>,...`,
a spec's fingerprint being a digest of its definition (`local_stream_buffer.spec_changes.fingerprint`). A restart
reads them back: a spec named there keeps its start, one not named there is new and starts at the committed offset,
one named there but no longer in the spec file is gone. A joiner's own metadata may stand beside it, separated by
`;`; a switch of joiners hands it over with the offsets (`stack.joiners.hand_over`).
"""
from __future__ import annotations

import re
from collections.abc import Mapping

SPECS_PART = "specs="
_SEPARATOR = ";"
_ENTRY = re.compile(r"([0-9a-f]{1,64})@(\d+)")


def read_starts(metadata: str | None) -> dict[str, int] | None:
    """The spec starts a commit's metadata names (fingerprint -> offset); None when it names none (a commit from
    before starts were kept, or by another writer: every spec then counts as running since the beginning)."""
    for part in (metadata or "").split(_SEPARATOR):
        part = part.strip()
        if part.startswith(SPECS_PART):
            starts = {}
            for entry in filter(None, part[len(SPECS_PART):].split(",")):
                matched = _ENTRY.fullmatch(entry)
                if matched is None:
                    return None  # not ours: no starts
                starts[matched.group(1)] = int(matched.group(2))
            return starts
    return None


def with_starts(metadata: str | None, starts: Mapping[str, int]) -> str:
    """`metadata` with its spec starts replaced by `starts` (the joiner's own parts kept)."""
    parts = [part for part in (metadata or "").split(_SEPARATOR) if part and not part.strip().startswith(SPECS_PART)]
    parts.append(SPECS_PART + ",".join(f"{fingerprint}@{offset}" for fingerprint, offset in sorted(starts.items())))
    return _SEPARATOR.join(parts)


def without_starts(metadata: str | None) -> str:
    """`metadata` with its spec starts taken out: what a joiner's own parts say."""
    return _SEPARATOR.join(part for part in (metadata or "").split(_SEPARATOR)
                           if part and not part.strip().startswith(SPECS_PART))


def starts_now(committed: Mapping[str, int] | None, fingerprints: list[str], position: int | None) -> dict[str, int]:
    """Where each of the running specs (`fingerprints`) starts in a partition whose committed offset is `position`
    (None: nothing committed) and whose commit named `committed` starts (None: none): a spec named there keeps its
    start; one not named starts at the committed offset; with no starts named at all, every spec runs since the
    beginning (offset 0)."""
    if committed is None:
        return {fingerprint: 0 for fingerprint in fingerprints}
    return {fingerprint: committed.get(fingerprint, position or 0) for fingerprint in fingerprints}
