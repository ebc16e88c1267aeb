"""The provisioned Grafana dashboards as live web pages without Grafana: a Bokeh server
(`python -m live_dashboards`)."""
