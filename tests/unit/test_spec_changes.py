"""Join specs changed on a running stack, the pure parts: a spec's fingerprint, a spec file checked as the joiners
load it (a file with an error refused naming it), what changes, where each spec started as kept in the committed
offsets' metadata, and the cohorts of a partition's specs."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kafka_joiner.cohorts import plan
from local_stream_buffer.spec_changes import changes, checked_specs, fingerprint
from local_stream_buffer.specs import JoinSpec, load_join_specs
from pipeline_core.spec_starts import read_starts, starts_now, with_starts, without_starts

POWER = load_join_specs()[0]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "specs.toml"
    path.write_text(text)
    return path


def test_a_fingerprint_changes_with_the_definition_and_not_with_a_setting_left_at_its_default() -> None:
    assert fingerprint(POWER) == fingerprint(dataclasses.replace(POWER))
    assert fingerprint(POWER) != fingerprint(dataclasses.replace(POWER, delta_time_s=2.0))
    assert fingerprint(POWER) != fingerprint(dataclasses.replace(POWER, name="power2"))
    # A setting at its default says nothing: specs keep their fingerprints when the format gains a setting.
    assert fingerprint(POWER) == fingerprint(dataclasses.replace(POWER, max_out_of_orderness_s=0.0))


@pytest.mark.parametrize("text, error", [
    ('[[join]]\nname = "x"\nleft = "a"\n', "lacks the key 'right'"),
    ('[[join]]\nname = "x"\nleft = "a"\nright = "b"\noutput = "c"\nformula = "nope"\n', "unknown formula 'nope'"),
    ('[[join]\n', "is not TOML"),
    ("", "holds no [[join]]"),
    ('[[join]]\nname = "x"\nleft = "a"\nright = "b"\noutput = "c"\nformula = "product"\nwhen = 1\n',
     "unknown keys ['when']"),
    ('[[join]]\nname = "x"\nleft = "a"\nright = "b"\noutput = "c"\nformula = "product"\n'
     '[[join]]\nname = "y"\nleft = "d"\nright = "e"\noutput = "c"\nformula = "product"\n', "both make 'c'"),
    ('[[join]]\nname = "x"\nleft = "a{axis}"\nright = "b{axis}"\noutput = "c{axis}"\nformula = "product"\naxis = "("\n',
     "no regular expression"),
])
def test_a_spec_file_with_an_error_is_refused_naming_it(tmp_path: Path, text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("(", r"\(")):
        checked_specs(write(tmp_path, text))


def test_what_changes_between_two_spec_files() -> None:
    current = JoinSpec("current", "vaCurr_C{axis}", "vaLoad_C{axis}", "vaCurrLoad_C{axis}", "product", 1.0)
    slower = dataclasses.replace(POWER, delta_time_s=5.0)
    assert changes((POWER,), (POWER, current)) == {"added": ["current"], "removed": [], "changed": []}
    assert changes((POWER, current), (current,)) == {"added": [], "removed": ["power"], "changed": []}
    assert changes((POWER,), (slower,)) == {"added": [], "removed": [], "changed": ["power"]}


def test_spec_starts_in_a_commits_metadata() -> None:
    metadata = with_starts("spark batch 3 of query q", {"aa": 0, "bb": 120})
    assert read_starts(metadata) == {"aa": 0, "bb": 120}
    assert without_starts(metadata) == "spark batch 3 of query q"
    assert read_starts(with_starts(metadata, {"cc": 7})) == {"cc": 7}  # replaced, not added to
    assert read_starts(None) is None and read_starts("lsb1:processed=5") is None
    assert read_starts("specs=not-ours") is None


def test_a_spec_not_named_in_the_commit_starts_at_the_committed_offset() -> None:
    assert starts_now({"aa": 0}, ["aa", "bb"], 500) == {"aa": 0, "bb": 500}
    # A commit that names no starts (before they were kept): every spec has run since the beginning.
    assert starts_now(None, ["aa", "bb"], 500) == {"aa": 0, "bb": 0}
    assert starts_now({}, ["aa"], None) == {"aa": 0}  # nothing committed there: from its beginning


def test_cohorts_split_only_while_a_held_record_lies_before_a_start() -> None:
    starts = {"old": 0, "new": 500}
    assert plan(starts, held=[100, 600]) == [(0, frozenset({"old"})), (500, frozenset({"new"}))]
    assert plan(starts, held=[600, 700]) == [(0, frozenset({"old", "new"}))]  # every held record past every start
    assert plan(starts, held=[]) == [(0, frozenset({"old", "new"}))]
    # Read again from the beginning (a rebuild): the starts hold whatever is held.
    assert plan(starts, held=[], rebuilding=True) == [(0, frozenset({"old"})), (500, frozenset({"new"}))]
    # An adopted record that fed only `old` where it came from splits them too.
    assert plan(starts, held=[700], feeds=[frozenset({"old"})]) == [(0, frozenset({"new"})), (0, frozenset({"old"}))]
