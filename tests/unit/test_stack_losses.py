"""`make status`'s line on loss outside the pipeline's control, from the stages' pipeline_health rows."""
from __future__ import annotations

from stack.losses import add_up, describe


def test_each_stage_adds_up_its_processes_and_stages_without_loss_are_left_out() -> None:
    rows = [({"stage": "db_connector", "instance": "a"}, {"records_deleted_unread": 40, "topics_deleted": 0,
                                                          "offset_resets": 2}),
            ({"stage": "db_connector", "instance": "b"}, {"records_deleted_unread": 2.0, "topics_deleted": 1,
                                                          "offset_resets": None}),
            ({"stage": "stream_connector", "instance": "c"}, {"records_deleted_unread": None}),
            ({"stage": "kafka_joiner", "instance": "d"}, {"records_deleted_unread": 0, "topics_deleted": 0,
                                                          "offset_resets": 0})]
    losses = add_up(rows)
    assert losses == {"db_connector": {"records_deleted_unread": 42, "topics_deleted": 1, "offset_resets": 2}}
    assert describe(losses) == ("loss outside the pipeline's control (last 24h): db_connector 42 records deleted "
                                "unread, 1 topics deleted, 2 offset resets (the stages' logs say which partitions, "
                                "as WARNINGs)")
    assert describe({}) == "loss outside the pipeline's control (last 24h): none"
