"""The join of one partition when its join specs started at different places (specs changed on a running stack).

A spec added joins from the joiner's position at the change (`pipeline_core.spec_starts`): the records before it
never reach it. The join engine routes a record to every spec that reads its quantity, so a partition whose held
records lie before some spec's start joins with one keyed join per cohort of specs: the specs that receive exactly
the same records. A record goes to the cohorts that started at or before it; one adopted from another partition
(`handover`) to the specs it fed there. Its changelog record is one, held while any cohort holds it.

Once every record the partition holds lies at or after every start, the cohorts receive the same records again:
the next restore joins them in one keyed join (`plan`). A rebuild from the partition's beginning keeps them apart.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from local_stream_buffer.clock import ClockCounters
from local_stream_buffer.keyed import IngestOutcome, JoinCounters, KeyedJoiner
from local_stream_buffer.specs import JoinSpec
from local_stream_buffer.status import IngestStatus

_ACCEPTED = IngestStatus.ACCEPTED
_UNROUTED = IngestStatus.UNROUTED

# A cohort: the record position where its specs started in the partition, and their fingerprints.
Cohort = tuple[int, frozenset[str]]


def plan(starts: Mapping[str, int], held: Iterable[int], feeds: Iterable[frozenset[str]] = (),
         rebuilding: bool = False) -> list[Cohort]:
    """The cohorts of a partition's specs (`starts`: fingerprint -> the record position where it
    started, as `held` and the records' sources are: `changelog.record_position`): specs that receive the same
    records share one. A start at or before every held position counts as the beginning (unless `rebuilding`: the
    partition is read again from its beginning); each set of specs adopted records fed elsewhere (`feeds`) splits
    the cohorts it cuts through."""
    held = list(held)
    earliest = min(held) if held else None
    effective = {fingerprint: (start if rebuilding or earliest is None or start > earliest else 0)
                 if held or rebuilding else 0 for fingerprint, start in starts.items()}
    feeds = [fed for fed in {frozenset(fed) for fed in feeds}]
    groups: dict[tuple, set[str]] = {}
    for fingerprint, start in effective.items():
        signature = (start, *(fingerprint in fed for fed in feeds))
        groups.setdefault(signature, set()).add(fingerprint)
    return sorted(((signature[0], frozenset(members)) for signature, members in groups.items()),
                  key=lambda cohort: (cohort[0], sorted(cohort[1])))


class CohortJoiner:
    """Keyed joins of one partition, one per cohort of specs, with the keyed joiner's interface (`ingest`,
    `restore_ingest`, `restored`, `restore_clock`, `clock_changes`, `release_idle`, `restore_release`, the counts).

    :param new_joiner: a keyed join of the given specs, given its release and evict hooks.
    :param on_release: called with a record's source once no cohort holds it any more.
    """

    def __init__(self, cohorts: list[Cohort], specs: Mapping[str, JoinSpec],
                 new_joiner: Callable[[Callable[[object], None], tuple[JoinSpec, ...]], KeyedJoiner],
                 on_release: Callable[[object], None]) -> None:
        self.cohorts = [(start, members, new_joiner(self._released, tuple(specs[f] for f in sorted(members))))
                        for start, members in cohorts]
        self._on_release = on_release
        self._holders: dict[object, int] = {}  # source -> cohorts holding it
        self.feeds: dict[int, frozenset[str]] = {}  # an adopted record's position -> the specs it feeds

    def eligible(self, source: int) -> list[KeyedJoiner]:
        """The cohorts a record at `source` reaches: those started at or before it; for an adopted record (a negative
        source), those of the specs it fed where it came from (all, when it names none)."""
        if source < 0:
            fed = self.feeds.get(source)
            return [joiner for _, members, joiner in self.cohorts if fed is None or members <= fed]
        return [joiner for start, _, joiner in self.cohorts if start <= source]

    def ingest(self, record: Mapping[str, Any], source: int) -> IngestOutcome:
        """The record into every cohort it reaches; accepted when any accepts it (as one keyed join's routes)."""
        joiners = self.eligible(source)
        self._holders[source] = len(joiners)
        accepted, outputs, refused = False, [], None
        for joiner in joiners:
            status, joined, reason = joiner.ingest(record, source)
            outputs.extend(joined)
            if status is _ACCEPTED:
                accepted = True
            else:
                self._released(source, silently=not accepted)
                if refused is None and status is not _UNROUTED:
                    refused = (status, reason)
        if accepted:
            return IngestOutcome(_ACCEPTED, outputs)
        self._holders.pop(source, None)
        status, reason = refused if refused is not None else (_UNROUTED, None)
        return IngestOutcome(status, outputs, reason)

    def restore_ingest(self, record: Mapping[str, Any], source: int) -> IngestStatus:
        """A held record put back (`KeyedJoiner.restore_ingest`) into every cohort it reaches."""
        joiners = self.eligible(source)
        self._holders[source] = len(joiners)
        accepted = False
        for joiner in joiners:
            if joiner.restore_ingest(record, source) is _ACCEPTED:
                accepted = True
            else:
                self._released(source, silently=not accepted)
        if accepted:
            return _ACCEPTED
        self._holders.pop(source, None)
        return IngestStatus.REJECTED

    def restored(self) -> None:
        for _, _, joiner in self.cohorts:
            joiner.restored()

    def restore_clock(self, thing: str, spec_name: str, axis: str, snapshot: dict) -> bool:
        return any(joiner.restore_clock(thing, spec_name, axis, snapshot) for joiner in self._of_spec(spec_name))

    def clock_changes(self) -> list[tuple[str, str, str, dict | None]]:
        return [change for _, _, joiner in self.cohorts for change in joiner.clock_changes()]

    def clock_faults(self) -> dict[str, ClockCounters]:
        totals: dict[str, ClockCounters] = {}
        for _, _, joiner in self.cohorts:
            for thing, faults in joiner.clock_faults().items():
                totals.setdefault(thing, ClockCounters()).add(faults)
        return totals

    def _of_spec(self, spec_name: str) -> list[KeyedJoiner]:
        return [joiner for _, _, joiner in self.cohorts if any(spec.name == spec_name for spec in joiner.resolver.specs)]

    def _released(self, source: object, silently: bool = False) -> None:
        left = self._holders.get(source)
        if left is None:
            return
        if left > 1:
            self._holders[source] = left - 1
            return
        del self._holders[source]
        if not silently:
            self._on_release(source)

    def release_idle(self) -> tuple[list, list]:
        outputs, releases = [], []
        for _, _, joiner in self.cohorts:
            joined, released = joiner.release_idle()
            outputs.extend(joined)
            releases.extend(released)
        return outputs, releases

    def restore_release(self, thing: str, spec_name: str, axis: str, side: int, up_to_ms: float) -> bool:
        return any(joiner.restore_release(thing, spec_name, axis, side, up_to_ms)
                   for joiner in self._of_spec(spec_name))

    @property
    def counters(self) -> JoinCounters:
        total = JoinCounters()
        for _, _, joiner in self.cohorts:
            for name, value in vars(joiner.counters).items():
                setattr(total, name, getattr(total, name) + value)
        return total

    def held_count(self) -> int:
        return len(self._holders)

    def key_count(self) -> int:
        return sum(joiner.key_count() for _, _, joiner in self.cohorts)
