"""`make status`'s line on loss outside the pipeline's control, from the stages' pipeline_health rows."""
from __future__ import annotations

from stack.losses import add_up, describe


def test_each_stage_adds_up_its_processes_and_stages_without_loss_are_left_out() -> None:
    rows = [({"stage": "db_connector", "instance": "a"}, {"records_skipped": 40, "topics_deleted": 0,
                                                          "offset_resets": 2}),
            ({"stage": "db_connector", "instance": "b"}, {"records_skipped": 2.0, "topics_deleted": 1,
                                                          "offset_resets": None}),
            ({"stage": "stream_connector", "instance": "c"}, {"records_skipped": None}),
            ({"stage": "kafka_joiner", "instance": "d"}, {"records_skipped": 0, "topics_deleted": 0,
                                                          "offset_resets": 0})]
    losses = add_up(rows)
    assert losses == {"db_connector": {"records_skipped": 42, "topics_deleted": 1, "offset_resets": 2}}
    assert describe(losses) == ("loss outside the pipeline's control (last 24h): db_connector 42 records skipped, "
                                "1 topics deleted, 2 offset resets (the stages' logs say which partitions, "
                                "as WARNINGs)")
    assert describe({}) == "loss outside the pipeline's control (last 24h): none"
