"""The Spark joiner's entry script for spark-submit, which runs a file, not a module: the same `main` as
`python -m spark_joiner`, with the same flags after the script's path. The packages come from the
`--py-files` archive `make spark-package` builds (see the README, "Submit to a cluster")."""
import sys

from spark_joiner.__main__ import main

if __name__ == "__main__":
    sys.exit(main(prog="spark-submit [spark options] spark_joiner_job.py"))
