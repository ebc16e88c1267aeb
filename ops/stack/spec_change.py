"""`python -m stack specs FILE` (`make specs SPECS=FILE`): another join-spec file applied to the running stack.

1. FILE is checked as the joiners load it (`join_specs.check`): a file with an error is refused, naming it, before
   anything stops;
2. what changes is said: specs added, removed, changed (another definition under the same name: the old one removed,
   the new one added);
3. every joiner process is stopped (each commits what it joined), where their group stands in machine.data read,
   FILE written as the stack's spec file (`join_specs.live_file`), and the joiners started again, healthy.

A spec added joins from there on: every record the joiners had not joined when they stopped, and all later ones;
the records before never reach it, on each partition, in either joiner (`pipeline_core.spec_starts`). A spec
removed makes no more outputs (the pairs it still waited for are never made); the other specs go on exactly as
they were, nothing twice.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import join_specs, joiners, manager, supervision
from .processes import StackError


@dataclass
class SpecsApplied:
    added: list[str]
    removed: list[str]
    changed: list[str]
    joiners_stopped_s: float  # from the stop of the joiners until every one was healthy again
    started_at: dict[int, int]  # partition -> offset from which the specs added join


def apply(path: Path, bootstrap_servers: str, security: Mapping[str, str], cluster: bool,
          notify: Callable[[str], None] = print) -> SpecsApplied | None:
    """Apply the spec file at `path` to the running stack (see the module doc); None when it changes nothing."""
    document = join_specs.check(path)
    changes = document["changes"]
    if not any(changes.values()):
        notify(f"{path}: the stack runs these join specs already ({', '.join(s['name'] for s in document['specs'])}); "
               "nothing to do")
        return None
    specs = {spec["name"]: spec for spec in document["specs"]}
    running = {spec["name"]: spec for spec in document["running"]}
    for name in changes["added"] + changes["changed"]:
        notify(f"{'changed' if name in changes['changed'] else 'added'}: {name} ({specs[name]['left']} x "
               f"{specs[name]['right']} -> {specs[name]['output']})")
    for name in changes["removed"]:
        notify(f"removed: {name} ({running[name]['output']}: no more outputs)")
    joiner = joiners.chosen()
    services = manager.joiner_services(joiner)
    position = joiners.position_of(joiner, cluster)
    with supervision.exclusive():
        if supervision.daemon_pid() is None:
            raise StackError("the stack is not running: `make up` starts it (with the spec file in "
                             f"{join_specs.VARIABLES[joiner]})")
        began = time.monotonic()
        supervision.stop_together([service.name for service in services])
        started_at = joiners.committed_offsets(bootstrap_servers, dict(security), position.group_id,
                                               position.input_topic)
        join_specs.write(join_specs.live_file(), path.read_bytes())
        notify(f"the {joiner} joiner stopped; "
               + (f"specs added join {position.input_topic} from its committed offsets ("
                  + ", ".join(f"{partition}: {offset:,}" for partition, offset in sorted(started_at.items())) + ")"
                  if started_at else f"specs added join {position.input_topic} from its beginning (nothing joined "
                                     "yet)"))
        manager.start_together(services)
        took = time.monotonic() - began
    notify(f"{', '.join(service.name for service in services)} running again with {path.name}, healthy, "
           f"{took:.1f} s after the stop")
    return SpecsApplied(changes["added"], changes["removed"], changes["changed"], took, started_at)
