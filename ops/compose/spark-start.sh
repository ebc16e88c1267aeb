#!/bin/sh
# Runs a Spark process of docker-compose.yml's cluster (master, worker or the joiner's driver) with Spark's
# RPC authenticated and encrypted by the cluster's shared secret, which reaches Spark in a
# spark-defaults.conf readable by this user only, never on a command line. The master's REST submission
# server cannot authenticate, so it is off: jobs are submitted over the authenticated RPC port.
set -eu
umask 077
mkdir -p /tmp/spark-conf
cp "$SPARK_CONF_DIR"/* /tmp/spark-conf/
cat > /tmp/spark-conf/spark-defaults.conf <<PROPERTIES
spark.authenticate true
spark.authenticate.secret ${SPARK_AUTHENTICATE_SECRET}
spark.network.crypto.enabled true
spark.master.rest.enabled false
PROPERTIES
unset SPARK_AUTHENTICATE_SECRET
export SPARK_CONF_DIR=/tmp/spark-conf
exec "$@"
