# The pipeline's image for docker-compose.yml: every Python stage, the Spark master and workers and the
# Spark joiner's driver run from it, so driver and executors share one Python, one pyspark and one copy of
# the pipeline. A Java runtime for Spark's JVM (Spark 4.1 runs on Java 17 and 21; Debian's default is one).
# The checkout is copied in, owned by root and read-only to the stages, which run as an unprivileged user:
# no container mounts the checkout or .env. /checkpoint belongs to that user, so the named volume Compose
# mounts there (the Spark joiner's checkpoint) is writable by it.
FROM python:3.11-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/pipeline
COPY . /opt/pipeline
# Editable, so the pipeline finds its files (Spark's log4j2.properties, Kafka connector jars) where
# `make setup` put them in the checkout.
RUN pip install --no-cache-dir --disable-pip-version-check -e /opt/pipeline \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp pipeline \
    && install -d -o 10001 -g 10001 /checkpoint
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    STACK_CACHE_DIR=/opt/pipeline/.cache \
    STACK_STATE_DIR=/tmp/stack \
    SPARK_CONF_DIR=/opt/pipeline/06_spark_joiner/conf \
    HOME=/tmp
USER 10001:10001
