"""A short, seeded run of the stack as `make up JOINER=lsb` runs it while it is grown and its join specs change (the
minutes-long runs on every topology and with each joiner are in tests/reliability/test_live_changes.py).

The stack starts with two join specs, power (speed x torque) and torque_current (torque x current). A synthetic
replay of 1,500 rows of 10 machines with bad rows mixed in, and, one after the other: a spec file with an error given
to `python -m stack specs` (`make specs`): refused, naming the error, no joiner stopped; a file without
torque_current and with current_load (current x load) applied; machine.data grown from 5 to 8 partitions by the
admin API, as any operator tool does it; machine.dlq from 3 to 4 the same way; machine.out from 3 to 4 by `python -m
stack grow` (`make grow`). Each confirmed: by the commands' output, by the count Kafka gives back.

Afterwards machine.out holds exactly, nothing twice, what the oracle (tests/join_reference.py, no code of either
joiner) joins: power over every record, torque_current over those before the spec change, current_load over those
from the change on (each partition from the joiner's position then), each stream in the order it was written (a
thing's records placed by 5 partitions before those placed by 8); machine.dlq exactly the bad rows; InfluxDB every
point. The stream connector placed records by 8 partitions and every stage caught up after it; every stage healthy
at the end."""
from __future__ import annotations

import shutil

import pytest

from chaos_support import ChaosPlan, PrivateStack, chaos_workdir, run_chaos
from growth_support import StatusBeforeDown
from spec_change_support import (INITIAL, LiveChanges, check_live_changes, live_change_faults, live_change_figures,
                                 spec_file)

pytestmark = pytest.mark.integration


class LiveChangesStack(LiveChanges, StatusBeforeDown, PrivateStack):
    """Its stages report every 2 s and the connector looks at machine.data's partition count as often (10 s by
    default), so that the short run follows each change within seconds."""


@pytest.mark.timeout(900)
def test_a_running_stack_grown_and_its_join_specs_changed():
    plan = ChaosPlan(joiner="lsb", rows=1_500, machines=10, rate=100.0, bad_rows=6, seed=20261208)
    workdir = chaos_workdir("live-changes-short")
    initial = spec_file(workdir, INITIAL, "initial_specs.toml")
    stacks: list[LiveChangesStack] = []

    def changing(state_dir, joiner):
        stack = LiveChangesStack(state_dir, joiner)
        stack.start_with_specs(initial)
        stack.env.update(PROGRESS_INTERVAL_S="2", STREAM_CONNECTOR_PARTITION_CHECK_INTERVAL_S="2")
        stacks.append(stack)
        return stack

    report = run_chaos(plan, workdir, live_change_faults(plan.rows / plan.rate, workdir), stack_class=changing,
                       keep_workdir=True)  # the stages' logs, until every check below passed
    failing = check_live_changes(report, stacks[0])
    assert not failing, failing
    shutil.rmtree(workdir)
    print(report.summary(), ";", live_change_figures(report, stacks[0]))
