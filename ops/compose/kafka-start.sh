#!/bin/sh
# A Kafka KRaft node in docker-compose.yml (apache/kafka image, as its unprivileged user), configured from
# its environment. Every listener is encrypted and authenticated:
#   BROKER, CONTROLLER  between the nodes: TLS with client certificates (the nodes' CN=kafka-broker,
#                       a super user), so no node needs a SCRAM user to join
#   CLIENT              the stages and any host of a multi-host deployment: SASL_SSL, SCRAM-SHA-512,
#                       advertised as ${ADVERTISED_HOST}:9092
#   HOST                tools on the Docker host: SASL_SSL on localhost:${HOST_PORT}
# ACLs per principal (StandardAuthorizer, nothing allowed without an ACL) are created by the setup job.
# The properties hold no secret; only the first start formats the storage with the admin's SCRAM
# credential, the one user that exists before the setup job creates the others.
set -eu
umask 077
config=/tmp/server.properties
cat > "$config" <<PROPERTIES
node.id=${NODE_ID}
process.roles=broker,controller
controller.quorum.voters=${QUORUM_VOTERS}
controller.listener.names=CONTROLLER
inter.broker.listener.name=BROKER
listeners=BROKER://:19092,CONTROLLER://:9093,CLIENT://:9092,HOST://:9094
advertised.listeners=BROKER://${ADVERTISED_HOST}:19092,CLIENT://${ADVERTISED_HOST}:9092,HOST://localhost:${HOST_PORT}
listener.security.protocol.map=BROKER:SSL,CONTROLLER:SSL,CLIENT:SASL_SSL,HOST:SASL_SSL
listener.name.broker.ssl.client.auth=required
listener.name.controller.ssl.client.auth=required
ssl.keystore.type=PEM
ssl.keystore.location=/certs/server.pem
ssl.truststore.type=PEM
ssl.truststore.location=/certs/ca.crt
ssl.principal.mapping.rules=RULE:^CN=([^,]+).*\$/\$1/,DEFAULT
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.client.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.host.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:kafka-broker;User:admin
log.dirs=/var/lib/kafka/data
default.replication.factor=${REPLICATION_FACTOR}
min.insync.replicas=${MIN_INSYNC_REPLICAS}
offsets.topic.replication.factor=${REPLICATION_FACTOR}
transaction.state.log.replication.factor=${REPLICATION_FACTOR}
transaction.state.log.min.isr=${MIN_INSYNC_REPLICAS}
share.coordinator.state.topic.replication.factor=${REPLICATION_FACTOR}
share.coordinator.state.topic.min.isr=${MIN_INSYNC_REPLICAS}
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0
message.max.bytes=16842752
replica.fetch.max.bytes=16842752
PROPERTIES

# The healthcheck's client: the node's own certificate on the BROKER listener, no password.
cat > /tmp/health.properties <<PROPERTIES
security.protocol=SSL
ssl.keystore.type=PEM
ssl.keystore.location=/certs/server.pem
ssl.truststore.type=PEM
ssl.truststore.location=/certs/ca.crt
PROPERTIES

if [ ! -f /var/lib/kafka/data/meta.properties ]; then
  /opt/kafka/bin/kafka-storage.sh format --ignore-formatted --cluster-id "${CLUSTER_ID}" --config "$config" \
    --add-scram "SCRAM-SHA-512=[name=admin,password=${KAFKA_ADMIN_PASSWORD}]"
fi
unset KAFKA_ADMIN_PASSWORD
exec /opt/kafka/bin/kafka-server-start.sh "$config"
