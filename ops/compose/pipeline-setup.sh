#!/bin/sh
# docker-compose.yml's setup job. As Kafka's admin, `python -m stack topics` creates the pipeline's topics and
# every stage's SCRAM user and ACLs, from the stages' passwords in this container's environment; as
# InfluxDB's admin, `python -m stack influxdb` creates the database's retention policies and history.
# Both are idempotent: the job runs again at every start. Then it stays up, healthy, as the stages'
# readiness gate.
set -eu
rm -f /tmp/ready
python -m stack topics
python -m stack influxdb
touch /tmp/ready
exec sleep infinity
