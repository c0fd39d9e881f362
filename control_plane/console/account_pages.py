"""The console's account page: where every event of the session's tenant went in a window, per
event type (core/account.py says what each figure means; control_plane.history.account reads it).
The window is the last 1, 6 or 24 hours, or a from/until pair; each run reads the events topic
and the history for it, so the page offers no window longer than the service allows."""

from __future__ import annotations

from aiohttp import web

from control_plane import errors
from control_plane.console.context import CONSOLE, blocking, form_time
from core import account as acc

HOUR_MS = 3_600_000
CHOICES = (1, 6, 24)


def window(query: dict[str, str], now_ms: int) -> tuple[int, int]:
    """(since, until) from the page's query: ``since``/``until`` (UTC date and time), else the
    last ``hours`` (one of CHOICES, default 1)."""
    since, until = form_time(query.get("since", ""), "since"), form_time(query.get("until", ""), "until")
    if since is not None or until is not None:
        return since if since is not None else (until or now_ms) - HOUR_MS, until if until is not None else now_ms
    hours = query.get("hours", "1")
    if not hours.isdigit() or int(hours) not in CHOICES:
        raise errors.InvalidArgument(f"hours must be one of {', '.join(map(str, CHOICES))}")
    return now_ms - int(hours) * HOUR_MS, now_ms


def add_routes(app: web.Application, base: str) -> None:
    app.router.add_get(f"{base}/account", _account)


async def _account(request: web.Request) -> web.StreamResponse:
    c = request.app[CONSOLE]
    principal = c.principal(request)
    if c.services.account is None:
        raise errors.Unavailable("the account is not available on this console")
    since, until = window(dict(request.query), c.services.now_ms())
    account = await blocking(c.services.account.account, principal, since, until)
    return c.render(request, "account.html", a=account, total=account.total, statuses=acc.DELIVERY_STATUSES,
                    choices=CHOICES, hours=request.query.get("hours", ""))
