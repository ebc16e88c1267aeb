"""What every stage of the pipeline shares, defined once: the record schema, topics, partitioning,
time normalisation, settings, Kafka/MQTT/InfluxDB client set-up, logging and health checks.

Stage packages import this package and never each other."""
