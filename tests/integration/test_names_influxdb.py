"""Generated names (`names_support.names`) written by the DB connector's line protocol into the real InfluxDB and
read back as every reader reads them: SHOW TAG VALUES (the dashboards' variables), a WHERE on the tag (the tests'
checks), the dashboards' regular expression over all of them (Grafana's and `make report`'s `$thing`), and the
series' tags of a GROUP BY (the labels). Each gives back the exact name (`shown_name` of the tag value)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from db_connector.points import body, data_point
from db_connector_support import database  # noqa: F401 (a fixture)
from grafana_report.macros import regex_value
from names_support import names
from pipeline_core.influx import shown_name, stored_name
from support import unique

pytestmark = pytest.mark.integration

T_MS = 1_554_096_460_000


def influxql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(names(), min_size=1, max_size=25, unique=True))
def test_any_name_is_read_back_from_influxdb_exactly(database, things: list[str]) -> None:  # noqa: F811
    name, client = database
    measurement = unique("names").replace(".", "_")
    lines = [data_point(measurement, {"thing": thing, "quantity": "q", "phenomenonTime": T_MS + index,
                                      "result": float(index)}) for index, thing in enumerate(things)]
    assert client.request("write", "POST", params={"db": name, "precision": "n", "rp": "raw"}, data=body(lines),
                          expected_response_code=204)
    tags = [point["value"] for point in
            client.query(f'SHOW TAG VALUES FROM "raw"."{measurement}" WITH KEY = "thing"').get_points()]
    assert sorted(shown_name(tag) for tag in tags) == sorted(things)
    grouped = client.query(f'SELECT "result" FROM "raw"."{measurement}" GROUP BY "thing"')
    assert {shown_name(tags["thing"]): [point["result"] for point in points]
            for (_measurement, tags), points in grouped.items()} == {thing: [float(i)] for i, thing in enumerate(things)}
    for index, thing in enumerate(things):
        by_value = client.query(f'SELECT "result" FROM "raw"."{measurement}" '
                                f'WHERE "thing" = {influxql_string(stored_name(thing))}').get_points()
        assert [point["result"] for point in by_value] == [float(index)], repr(thing)
    every = client.query(f'SELECT count("result") FROM "raw"."{measurement}" '
                         f'WHERE "thing" =~ /^{regex_value(tags)}$/').get_points()
    assert [point["count"] for point in every] == [len(things)]
