# The pipeline's image for docker-compose.yml: every Python stage, the Spark master and workers and the
# Spark joiner's driver run from it, so driver and executors share one Python, one pyspark and one copy of
# the pipeline. A Java runtime for Spark's JVM (Spark 4.1 runs on Java 17 and 21; Debian's default is one).
# The checkout is copied in, owned by root and read-only to the stages, which run as an unprivileged user:
# no container mounts the checkout or .env. /checkpoint belongs to that user, so the named volume Compose
# mounts there (the Spark joiner's checkpoint) is writable by it; so is /var/lib/simulator (the replay log).
# The image needs nothing from the host but the checkout's sources: Spark's Kafka connector jars are resolved
# from Maven Central while it builds (`stack.provision`, as `make setup` does natively), and Maven leaves with
# its local repository. openssl makes the certificates `make up` needs before Compose starts (ops/compose).
FROM python:3.11-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends default-jre-headless openssl \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/pipeline
COPY . /opt/pipeline
ENV STACK_CACHE_DIR=/opt/pipeline/.cache
# Editable, so the pipeline finds its files (Spark's log4j2.properties, the Kafka connector jars) in /opt/pipeline.
RUN pip install --no-cache-dir --disable-pip-version-check -e /opt/pipeline \
    && apt-get update && apt-get install -y --no-install-recommends maven \
    && python -c "from stack.provision import fetch_spark_kafka_connector; fetch_spark_kafka_connector()" \
    && apt-get purge -y --auto-remove maven && rm -rf /root/.m2 /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp pipeline \
    && install -d -o 10001 -g 10001 /checkpoint /var/lib/simulator
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark \
    STACK_STATE_DIR=/tmp/stack \
    SPARK_CONF_DIR=/opt/pipeline/06_spark_joiner/conf \
    HOME=/tmp
USER 10001:10001
