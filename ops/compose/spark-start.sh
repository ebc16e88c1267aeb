#!/bin/sh
# Runs a Spark process of docker-compose.yml's cluster (master, worker or the joiner's driver) with Spark's
# RPC authenticated and encrypted by the cluster's shared secret, which reaches Spark in a
# spark-defaults.conf readable by this user only, never on a command line.
set -eu
umask 077
mkdir -p /tmp/spark-conf
cp "$SPARK_CONF_DIR"/* /tmp/spark-conf/
cat > /tmp/spark-conf/spark-defaults.conf <<PROPERTIES
spark.authenticate true
spark.authenticate.secret ${SPARK_AUTHENTICATE_SECRET}
spark.network.crypto.enabled true
PROPERTIES
unset SPARK_AUTHENTICATE_SECRET
export SPARK_CONF_DIR=/tmp/spark-conf
exec "$@"
