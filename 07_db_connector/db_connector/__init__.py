"""Loads machine.data (raw quantities) and machine.out (join results) into InfluxDB, batched and idempotent."""
