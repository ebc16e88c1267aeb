"""Join specs changed on a running stack: what identifies a spec, and whether a spec file can be run.

A spec is known by its fingerprint, a digest of everything that decides its pairs (`fingerprint`): a spec whose
definition changed under the same name is another spec, the old one removed and the new one added. Each joiner keeps
where each spec started per input partition (`pipeline_core.spec_starts`): a spec added joins from the joiner's
position at the change on, so the records before it never reach it, and the specs that stay go on exactly as they
were.

`python -m local_stream_buffer.spec_changes FILE [RUNNING]` checks a spec file as both joiners load it and prints
one JSON document: its specs (name, fingerprint, quantities), or the error that refuses it; with RUNNING (the file
the stack runs) also what would change. `python -m stack specs` (`make specs`) asks it before it stops anything.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import tomllib
from dataclasses import asdict, fields
from pathlib import Path

from .specs import JoinSpec, SpecResolver, load_join_specs

FINGERPRINT_HEX = 12


def fingerprint(spec: JoinSpec) -> str:
    """A digest of the spec's definition: its name and every setting that decides its pairs. A setting at its
    default is left out, so a setting added to the spec format later leaves the fingerprints of the specs that do
    not use it as they were (a changed fingerprint makes the spec a new one, joining from that point on)."""
    defaults = {field.name: field.default for field in fields(spec)}
    defined = {name: value for name, value in asdict(spec).items() if value != defaults[name]}
    return hashlib.sha1(json.dumps(defined, sort_keys=True).encode()).hexdigest()[:FINGERPRINT_HEX]


def fingerprints(specs: tuple[JoinSpec, ...] | list[JoinSpec]) -> dict[str, JoinSpec]:
    return {fingerprint(spec): spec for spec in specs}


def checked_specs(path: str | Path | None) -> tuple[JoinSpec, ...]:
    """The specs of a file as the joiners load and resolve them, or ValueError saying what is wrong (the file
    unreadable or not TOML, a key missing or unknown, a formula unknown, names not unique, an axis pattern or
    quantity that is no regular expression, two specs making one output quantity)."""
    try:
        specs = load_join_specs(path)
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path} is not TOML: {error}") from None
    except KeyError as error:
        raise ValueError(f"a join spec lacks the key {error.args[0]!r} (name, left, right, output and formula are "
                         "required)") from None
    except (TypeError, AttributeError) as error:
        raise ValueError(f"a join spec has a value of the wrong type: {error}") from None
    if not specs:
        raise ValueError(f"{path} holds no [[join]]: a joiner with no spec joins nothing")
    try:
        SpecResolver(specs)
        for spec in specs:
            for pattern in (spec.left, spec.right, spec.output):
                spec.compile(pattern)
    except re.error as error:
        raise ValueError(f"an axis pattern is no regular expression: {error}") from None
    outputs: dict[str, str] = {}
    for spec in specs:
        if spec.output in outputs:
            raise ValueError(f"join specs {outputs[spec.output]!r} and {spec.name!r} both make {spec.output!r}")
        outputs[spec.output] = spec.name
    return specs


def describe(specs: tuple[JoinSpec, ...]) -> list[dict]:
    return [{"name": spec.name, "fingerprint": fingerprint(spec), "left": spec.left, "right": spec.right,
             "output": spec.output} for spec in specs]


def changes(running: tuple[JoinSpec, ...], new: tuple[JoinSpec, ...]) -> dict[str, list[str]]:
    """The spec names added, removed and changed (same name, another definition: removed and added) from
    `running` to `new`."""
    before, after = {spec.name: fingerprint(spec) for spec in running}, {spec.name: fingerprint(spec) for spec in new}
    return {"added": sorted(after.keys() - before.keys()), "removed": sorted(before.keys() - after.keys()),
            "changed": sorted(name for name in before.keys() & after.keys() if before[name] != after[name])}


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if not 1 <= len(arguments) <= 2:
        print("usage: python -m local_stream_buffer.spec_changes FILE [RUNNING]", file=sys.stderr)
        return 2
    try:
        new = checked_specs(arguments[0])
    except ValueError as error:
        print(json.dumps({"error": str(error)}))
        return 1
    document: dict = {"specs": describe(new)}
    if len(arguments) == 2:
        running = load_join_specs(arguments[1] or None)
        document["running"] = describe(running)
        document["changes"] = changes(running, new)
    print(json.dumps(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
