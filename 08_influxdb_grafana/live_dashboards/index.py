"""The server's front door at `/`: the project's own index of its dashboards, each with its description and link.
Plain HTML with its style inline: nothing is fetched from anywhere but this server."""
from __future__ import annotations

import html
from collections.abc import Sequence

from tornado.web import RequestHandler

from grafana_report.dashboards import Dashboard

_STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 60em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
p.note { color: #666; font-size: 0.9em; margin-top: 0; }
li { margin: 0.8em 0; }
li a { font-size: 1.15em; font-weight: 600; }
li div { color: #444; font-size: 0.9em; margin-top: 0.2em; }
"""


def index_html(dashboards: Sequence[Dashboard], refresh_s: float) -> str:
    items = "".join(f'<li><a href="/{html.escape(dashboard.uid)}">{html.escape(dashboard.title)}</a>'
                    f'<div>{html.escape(dashboard.description)}</div></li>' for dashboard in dashboards)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Machine data dashboards</title>'
            f'<style>{_STYLE}</style></head><body><h1>Machine data dashboards</h1>'
            f'<p class="note">The provisioned Grafana dashboards, drawn live from InfluxDB and refreshed every '
            f'{refresh_s:g} s; each page picks its range, machines and axes.</p><ul>{items}</ul></body></html>')


class IndexHandler(RequestHandler):
    """GET / : the index of the dashboards."""

    def initialize(self, page: str) -> None:
        self._page = page

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(self._page)
