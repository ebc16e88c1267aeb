#!/bin/sh
# docker-compose.yml's Kafka setup job, as the admin principal: `python -m stack topics` creates the
# pipeline's topics and, since a credentials file is given, every stage's SCRAM user and ACLs from it.
# The file is written from this container's environment (`env | grep`: no secret on a command line) into
# /tmp, readable by this user only. Then the job stays up, healthy, as the stages' readiness gate.
set -eu
umask 077
rm -f /tmp/ready
credentials=/tmp/credentials.env
env | grep -E '^KAFKA_[A-Z_]+_PASSWORD=' > "$credentials"
printf 'KAFKA_SECURITY_PROTOCOL=%s\nKAFKA_SSL_CA_LOCATION=%s\n' "$KAFKA_SECURITY_PROTOCOL" "$KAFKA_SSL_CA_LOCATION" \
  >> "$credentials"
export PIPELINE_CREDENTIALS_FILE="$credentials"
python -m stack topics
touch /tmp/ready
exec sleep infinity
