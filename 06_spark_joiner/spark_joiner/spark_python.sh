#!/bin/sh
# The Python interpreter Spark starts for the job (PYSPARK_PYTHON, set by session.prepare_environment): the job's own
# interpreter ($SPARK_JOINER_INTERPRETER) without Spark's archives (pyspark.zip, py4j-*.zip, spark-core*.jar) on
# PYTHONPATH, which Spark puts before everything else. The environment installs pyspark and py4j itself, compiled;
# from the archive every process compiles pyspark's modules again. Spark starts one such process outside the worker
# daemon (which drops the archives itself, see worker_daemon.py) when it plans a query's first micro-batch: it asks the
# stateful processor for its state schemas, and there the archive cost 0.3 s of a cold start.
set -f  # the entries are paths, not patterns
kept= separator=
IFS=:
for entry in $PYTHONPATH; do
    case "${entry##*/}" in
        pyspark.zip | py4j-*.zip | spark-core*.jar) ;;
        *) kept="$kept$separator$entry" separator=: ;;
    esac
done
unset IFS
PYTHONPATH=$kept exec "${SPARK_JOINER_INTERPRETER:?the job sets it to its interpreter}" "$@"
