"""`make status`'s line on machines whose clocks lie, from the joiners' machine_health rows."""
from __future__ import annotations

from stack.clocks import add_up, describe


def test_each_machine_adds_up_its_joiner_processes_and_names_the_most_faulty_first() -> None:
    rows = [({"stage": "kafka_joiner", "instance": "a", "thing": "Plant1.Hall2.Press3"},
             {"clock_outliers": 3, "clock_steps_back": 0, "clock_jumps_ahead": 1}),
            ({"stage": "spark_joiner", "instance": "b", "thing": "Plant1.Hall2.Press3"},
             {"clock_outliers": 1.0, "clock_steps_back": 2, "clock_jumps_ahead": None}),
            ({"stage": "kafka_joiner", "instance": "a", "thing": "R0815"},
             {"clock_outliers": 0, "clock_steps_back": 2, "clock_jumps_ahead": 0}),
            ({"stage": "kafka_joiner", "instance": "a", "thing": "paused machine"},
             {"clock_outliers": 0, "clock_steps_back": 0, "clock_jumps_ahead": 4}),
            ({"stage": "kafka_joiner", "instance": "a", "thing": "quiet"}, {"clock_outliers": None}),
            # A name InfluxDB cannot carry as it is comes back in its stored form (pipeline_core.influx.stored_name).
            ({"stage": "kafka_joiner", "instance": "a", "thing": '\\"Press\\n3"'}, {"clock_outliers": 1})]
    faults = add_up(rows)
    assert faults == {"Plant1.Hall2.Press3": {"clock_outliers": 4, "clock_steps_back": 2, "clock_jumps_ahead": 1},
                      "R0815": {"clock_outliers": 0, "clock_steps_back": 2, "clock_jumps_ahead": 0},
                      "paused machine": {"clock_outliers": 0, "clock_steps_back": 0, "clock_jumps_ahead": 4},
                      "Press\n3": {"clock_outliers": 1, "clock_steps_back": 0, "clock_jumps_ahead": 0}}
    # A jump ahead alone is no fault (a machine paused for an hour jumps ahead too): counted, not named.
    assert describe(faults) == ("clock faults (last 24h): Plant1.Hall2.Press3 4 outliers, 2 series stepped back; "
                                "R0815 2 series stepped back; \"Press\\n3\" 1 outliers (the joiner's log names each step "
                                "back, as a WARNING; outliers are in machine.dlq)")
    assert describe({"paused machine": faults["paused machine"]}) == "clock faults (last 24h): none"


def test_beyond_five_machines_the_rest_are_counted() -> None:
    faults = {f"M{n}": {"clock_outliers": n, "clock_steps_back": 0, "clock_jumps_ahead": 0} for n in range(1, 9)}
    line = describe(faults)
    assert line.startswith("clock faults (last 24h): M8 8 outliers; M7 7 outliers; M6 6 outliers; M5 5 outliers; "
                           "M4 4 outliers; and 3 more machines")
