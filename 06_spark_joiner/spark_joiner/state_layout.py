"""How the join's state lies in Spark's state store, and the name of that layout, which the job records with its
checkpoint: a checkpoint of another layout is moved aside and rebuilt from the input (``checkpoint``).

A bucket's join keys are kept in chunks (by thing), each chunk one entry of a map state holding per key the
engine state and the processing time (ms) of its last rows. A micro-batch costs one state read and write per
chunk it touches, not per key: with many machines, per-key state calls were most of the job's cost.
"""
from __future__ import annotations

STATE_CHUNKS_PER_BUCKET = 64
STATE_LAYOUT = f"join keys in {STATE_CHUNKS_PER_BUCKET} chunks per bucket"
# Recorded too when a spec releases idle streams: the query then runs in processing-time mode, with timers.
IDLE_RELEASE_LAYOUT = f"{STATE_LAYOUT}, processing-time timers for idle_release_s"
