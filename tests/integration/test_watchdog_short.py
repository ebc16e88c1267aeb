"""The watchdog in brief, as part of `make test`: on the single stack, mid-replay, the standalone joiner's loop is
wedged (fault injection, PIPELINE_WEDGE_ON_SIGUSR2: it blocks for good in a read that never returns, the process
alive and answering signals), and the watchdog ends it and starts it again with no one asking. Confirmed: the
heartbeat stopped while the process lived, the old process group went, a new process runs and reports healthy;
`make status` counts the restart apart from supervisord's and shows it with the threads' stacks from the log, and
InfluxDB holds the count. Then machine.out equals the offline join of machine.data (join_reference, no code of the
joiner), nothing twice, and InfluxDB every point (chaos_support.check_outcome).

`make reliability` wedges every stage on every topology (tests/reliability/test_watchdog.py)."""
from __future__ import annotations

import pytest

from chaos_support import ChaosPlan, Fault, PrivateStack, chaos_workdir, only_the_wedged_were_restarted, run_chaos

pytestmark = pytest.mark.integration

# The stages report every 3 s, so a wedged one is stale after 14 s instead of 35 s.
WEDGEABLE = {"PIPELINE_WEDGE_ON_SIGUSR2": "true", "PROGRESS_INTERVAL_S": "3"}


def wedgeable_stack(stacks: list[PrivateStack]):
    """A stack class for `run_chaos` whose stages honour the wedge, kept in `stacks` for the checks."""
    def make(state_dir, joiner: str) -> PrivateStack:
        stack = PrivateStack(state_dir, joiner)
        stack.env.update(WEDGEABLE)
        stacks.append(stack)
        return stack
    return make


@pytest.mark.timeout(900)
def test_a_wedged_joiner_is_restarted_by_the_watchdog_and_the_join_stays_exact() -> None:
    plan = ChaosPlan(joiner="lsb", rows=2_000, machines=10, rate=50.0, kills_per_stage=0, bad_rows=0,
                     server_faults=())
    stacks: list[PrivateStack] = []
    report = run_chaos(plan, chaos_workdir("watchdog"), [Fault(6.0, "wedge", "lsb-joiner")],
                       stack_class=wedgeable_stack(stacks), after=only_the_wedged_were_restarted)
    print(report.summary())
    (outcome,) = stacks[0].wedges
    assert outcome.new_pid != outcome.old_pid, outcome
    print(outcome.describe())
