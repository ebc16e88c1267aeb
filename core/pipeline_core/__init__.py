"""What every stage of the pipeline shares, defined once: the record schema, topics, partitioning,
time normalisation, settings, Kafka/MQTT/InfluxDB client set-up, logging and health checks, and how a
long-running stage stops and reports its progress and health.

Stage packages import this package and never each other."""
