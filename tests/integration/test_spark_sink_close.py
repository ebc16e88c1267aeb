"""The Spark joiner's sink closes quietly after its producer was fenced.

A restarted driver fences its predecessor's producer (the transactional id is fixed per job); the fenced one's
abort fails with a fatal error, and so does any flush after it (librdkafka issue 4849). The job closes the sink
in a `finally`: a close that raised there hid the error that ended the query."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaException

from pipeline_core.topics import MACHINE_DLQ, MACHINE_OUT
from spark_joiner.sink import TransactionalBatchSink
from support import unique

pytestmark = pytest.mark.integration


def test_a_fenced_sink_closes_without_raising(bootstrap: str) -> None:
    transactional_id = unique("spark-joiner-fenced")
    fenced = TransactionalBatchSink(bootstrap, MACHINE_OUT.name, MACHINE_DLQ.name, transactional_id)
    fenced.producer.begin_transaction()
    fenced.producer.produce(MACHINE_DLQ.name, b"a batch's record")
    fenced.producer.flush(10)
    successor = TransactionalBatchSink(bootstrap, MACHINE_OUT.name, MACHINE_DLQ.name, transactional_id)
    try:
        with pytest.raises(KafkaException) as raised:
            fenced.producer.abort_transaction(10)
        assert raised.value.args[0].fatal()
        fenced.close()
    finally:
        successor.close()
