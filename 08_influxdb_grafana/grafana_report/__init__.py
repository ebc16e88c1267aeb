"""Renders the provisioned Grafana dashboards to PNG from the same InfluxQL, for machines without Grafana."""
