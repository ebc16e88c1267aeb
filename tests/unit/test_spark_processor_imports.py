"""What Spark's driver loads to plan the job's query: it unpickles the stateful processor in a Python process of its
own and asks it for its state variables (``init``) before any row arrives. That process must not pay for the join's
imports (pandas, pyarrow, the engine), which held up every start of the job; the worker daemon, which forks the
processes that join, must have them loaded before it forks."""
from __future__ import annotations

import json
import subprocess
import sys

from pyspark import cloudpickle

from spark_joiner.processor import BucketJoinProcessor

# (Not numpy: pyspark itself imports it.)
JOIN_MODULES = ("pandas", "pyarrow", "local_stream_buffer.keyed_batch", "spark_joiner.bucket_join")

# As Spark's transform_with_state_driver_worker does: unpickle, then init with a handle that records the schemas.
PLAN_QUERY = f"""
import json, pickle, sys

class Handle:
    def __init__(self):
        self.states = []
    def getMapState(self, name, key_schema, value_schema):
        self.states.append(name)
    def getValueState(self, name, schema):
        self.states.append(name)

processor = pickle.loads(sys.stdin.buffer.read())
handle = Handle()
processor.init(handle)
print(json.dumps({{"states": handle.states, "loaded": [name for name in {JOIN_MODULES!r} if name in sys.modules]}}))
"""

PREPARE_WORKERS = f"""
import json, sys
from spark_joiner.worker_daemon import prepare_workers
prepare_workers()
print(json.dumps([name for name in {JOIN_MODULES!r} if name in sys.modules]))
"""


def _run(code: str, given: bytes = b"") -> object:
    done = subprocess.run([sys.executable, "-c", code], input=given, capture_output=True, check=True, timeout=120)
    return json.loads(done.stdout)


def test_planning_the_query_loads_none_of_the_join_s_modules() -> None:
    pickled = cloudpickle.dumps(BucketJoinProcessor(None, "machine.data", 10_000))
    planned = _run(PLAN_QUERY, pickled)
    assert planned == {"states": ["join_chunks", "key_count"], "loaded": []}


def test_the_worker_daemon_loads_them_before_it_forks() -> None:
    assert _run(PREPARE_WORKERS) == list(JOIN_MODULES)
