"""The console's figures page of one endpoint: the last 24 hours as a chart of requests per hour
by status class, drawn on the server (control_plane.console.svg_bar_chart: the console runs no script),
with its success rate, p50/p99 latency and breaker transitions (control_plane.history.endpoint_figures
says where each comes from). The endpoint is read through EndpointService first, so another
tenant's endpoint id answers 404 like one that does not exist."""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web
from markupsafe import Markup

from control_plane.console import health, svg_bar_chart
from control_plane.console.context import CONSOLE, blocking
from control_plane.history import endpoint_figures

SERIES = endpoint_figures.CLASSES


def chart(f: endpoint_figures.Figures) -> Markup:
    """The figures' chart, as markup safe to insert (the chart module escapes every label)."""
    buckets = [svg_bar_chart.Bucket(datetime.fromtimestamp(hour / 1000, tz=UTC).strftime("%H:00"), counts)
               for hour, counts in f.hours]
    return Markup(svg_bar_chart.stacked_bars(buckets, SERIES, "requests per hour by status class, last 24 h",
                                             label_every=3))  # noqa: S704 -- escaped by svg_bar_chart


def add_routes(app: web.Application, base: str) -> None:
    app.router.add_get(f"{base}/endpoints/{{endpoint_id}}/figures", _figures)


async def _figures(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    endpoint_id = request.match_info["endpoint_id"]
    endpoint = await blocking(c.services.endpoints.get, principal, endpoint_id)
    now = c.services.now_ms()
    figures = await blocking(endpoint_figures.read, c.services.deliveries, principal, endpoint_id, now,
                             c.services.prometheus_url)
    strip = await blocking(health.tenant_health, c.services, principal, [endpoint_id])
    return c.render(request, "figures.html", endpoint=endpoint, f=figures, chart=chart(figures),
                    legend=Markup(svg_bar_chart.legend(SERIES)), health=strip,  # noqa: S704 -- escaped there
                    now_ms=now)
