"""The Spark joiner's side of loss outside the pipeline's control: records deleted between two runs of the
job, and its input topic deleted and created again under it, are counted and logged, never silent. A JVM start
or two each (about a minute each on two shared cores), hence here."""
from __future__ import annotations

import re

import pytest

from data_loss_support import delete_records_before, logged_total, produce, records, recreate
from pipeline_core.topics import MACHINE_DATA, TopicSpec
from spark_support import SparkJoinerProcess
from support import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_the_spark_joiner_counts_records_deleted_before_its_batch_read_them(bootstrap, new_topics, tmp_path):
    topics = new_topics()
    ends = produce(bootstrap, topics.data, records(0, 300))
    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path)
    try:
        joiner.start()
        wait_for(lambda: logged_total(joiner.log(), "rows in") == 300, 240, "the first records read", interval_s=0.5)
        assert joiner.terminate() == 0

        # While it is down, 700 more arrive and retention deletes the first 25 of them in every partition.
        after = produce(bootstrap, topics.data, records(300, 700))
        deleted_to = {partition: min(ends.get(partition, 0) + 25, end) for partition, end in after.items()}
        delete_records_before(bootstrap, topics.data, deleted_to)
        deleted = sum(deleted_to[partition] - ends.get(partition, 0) for partition in deleted_to)

        joiner.start()
        wait_for(lambda: logged_total(joiner.log(), "rows in") == 700 - deleted, 240, "the records left read",
                 interval_s=0.5)
        wait_for(lambda: logged_total(joiner.log(), "records skipped") == deleted, 30,
                 f"{deleted} deleted unread")
        assert re.search(r"WARNING .*input records skipped unread \(deleted by retention", joiner.log())
    finally:
        joiner.close()


def test_the_spark_joiner_counts_its_input_topic_deleted_and_what_it_skips_of_the_new_one(bootstrap, new_topics,
                                                                                            tmp_path):
    topics = new_topics()

    produce(bootstrap, topics.data, records(0, 300))
    joiner = SparkJoinerProcess(bootstrap, topics, tmp_path / "checkpoint", tmp_path)
    try:
        joiner.start()
        wait_for(lambda: logged_total(joiner.log(), "rows in") == 300, 240, "the first records read", interval_s=0.5)
        recreate(bootstrap, TopicSpec(topics.data, MACHINE_DATA.partitions, dict(MACHINE_DATA.config)))
        produce(bootstrap, topics.data, records(300, 150))
        wait_for(lambda: logged_total(joiner.log(), "topics deleted") == 1, 120, "the deletion counted", interval_s=0.5)
        # Spark's source goes on from its checkpoint's offsets, not from the new topic's start: whatever of the new
        # records it does not read is counted as skipped. None is silent.
        wait_for(lambda: logged_total(joiner.log(), "rows in") + logged_total(joiner.log(), "records skipped") == 450,
                 120, "every new record read or counted as skipped", interval_s=0.5)
        assert re.search(rf"WARNING .*input topic {re.escape(topics.data)} was deleted", joiner.log())
        assert joiner.alive()
    finally:
        joiner.close()
