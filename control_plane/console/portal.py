"""One-time portal links: a URL that opens the console's tenant view scoped to one tenant.

A SaaS built on the platform puts the console in an iframe of its own settings page: its backend
asks for a link (admin credential: `webhookctl portal link --tenant acme --ttl 15m`, gRPC
Portal.CreatePortalLink) and hands the URL to its user's browser. The link

* works once: opening it swaps it for a console session of that tenant (a conditional update
  decides between two openings of the same link), and a second opening is refused;
* expires: unopened after its TTL it opens nothing;
* carries a random 256-bit token of which only the SHA-256 is stored.

The session it opens is a tenant session like an API key's (same service calls, same tenant
checks), named ``portal_<link id>`` in every audit row it writes, and it never reaches the
operator view.

**Why the portal session is in the path, not in a cookie.** The SaaS page that embeds the portal
is, as a rule, another site than the console (saas.example vs webhooks.platform.example). A
browser sends a SameSite=Strict or Lax cookie to a frame only when the frame is same-site with
every page above it, so in such an iframe the console's cookie is never sent; SameSite=None
would be sent only where third-party cookies are allowed, which Safari, Firefox (partitioned)
and Chrome with third-party cookies blocked do not do reliably -- and it would give up the
Strict protection for every session. So the console keeps SameSite=Strict cookies for logins
(API key, admin token) and carries a portal session in its URLs instead: opening a link
redirects to ``/s/<signed session>/endpoints`` and every link and form of that view keeps the
prefix. It works the same in a same-site iframe, a cross-site iframe and a top-level tab. What
protects it:

* it is the same signed, expiring session (SESSION_TTL_S) a cookie would carry, and only a
  portal session is accepted in a path (an API key's or the admin's never travels there);
* it never leaves the console: Referrer-Policy no-referrer, no third-party resources (CSP
  default-src 'none'), Cache-Control no-store, no access log of paths;
* forms still carry the CSRF token bound to the session, and frame-ancestors names the pages
  allowed to embed the console (control_plane.console_frame_ancestors).

What it cannot do: end before its expiry (it is stateless, like the cookie; the embedding page
ends it by dropping the iframe), and an iframe's URL is copyable by its user like any bearer
link. Alternatively a SaaS may serve the console same-site (a subdomain of its own domain, as
hosted providers' custom domains do); the path session works there too.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from cassandra import DriverException
from cassandra.cluster import NoHostAvailable, Session
from cassandra.query import PreparedStatement

from control_plane.errors import InvalidArgument, NotFound, Unavailable
from control_plane.store import EndpointStore
from core import identifiers

log = logging.getLogger(__name__)

TOKEN_PREFIX = "wpl_"
TOKEN_BYTES = 32
DEFAULT_TTL_S = 15 * 60
MIN_TTL_S = 30
MAX_TTL_S = 24 * 3600
# How long a portal session lasts once its link is opened (the link's TTL only bounds the opening).
SESSION_TTL_S = 3600
# Rows outlive their link by a day, so a late second opening still finds the row and is told
# the link was used rather than that it never existed.
ROW_RETENTION_S = 24 * 3600
PATH = "/portal/"
# A portal session's URLs: PATH_PREFIX + the signed session + the tenant view's path.
PATH_PREFIX = "/s/"
PATH_SESSION = "portal_session"  # its route variable


@dataclass(frozen=True)
class PortalLink:
    link_id: str
    tenant_id: str
    token_hash: str
    created_by: str
    created_at_ms: int
    expires_at_ms: int
    redeemed_at_ms: int | None = None


@dataclass(frozen=True)
class IssuedLink:
    link: PortalLink
    url: str  # shown once: the token is in it and nowhere else


class PortalStore(Protocol):
    def put_link(self, link: PortalLink, ttl_s: int) -> None: ...
    def get_link(self, token_hash: str) -> PortalLink | None: ...
    def redeem(self, link: PortalLink, at_ms: int) -> bool:
        """Mark the link opened unless it was already; True for the one opening that did."""
        ...


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class PortalService:
    def __init__(self, store: PortalStore, tenants: EndpointStore, now_ms: Callable[[], int],
                 random_bytes: Callable[[int], bytes], base_url: str) -> None:
        self._store = store
        self._tenants = tenants
        self._now_ms = now_ms
        self._random = random_bytes
        self._base_url = base_url.rstrip("/")

    def create_link(self, tenant_id: str, ttl_s: int, created_by: str) -> IssuedLink:
        if not identifiers.TENANT_ID.fullmatch(tenant_id or ""):
            raise InvalidArgument("tenant_id is required: the tenant whose view the link opens")
        ttl = ttl_s or DEFAULT_TTL_S
        if not MIN_TTL_S <= ttl <= MAX_TTL_S:
            raise InvalidArgument(f"ttl_seconds must be between {MIN_TTL_S} and {MAX_TTL_S} (0 = {DEFAULT_TTL_S})")
        if self._tenants.get_tenant(tenant_id) is None:
            raise NotFound(f"tenant {tenant_id} not found")
        token = TOKEN_PREFIX + base64.urlsafe_b64encode(self._random(TOKEN_BYTES)).decode().rstrip("=")
        now = self._now_ms()
        link = PortalLink(link_id="pl_" + uuid.UUID(bytes=self._random(16)).hex[:20], tenant_id=tenant_id,
                          token_hash=hash_token(token), created_by=created_by, created_at_ms=now,
                          expires_at_ms=now + ttl * 1000)
        self._store.put_link(link, ttl + ROW_RETENTION_S)
        log.info("portal link %s for tenant %s issued by %s, valid %d s", link.link_id, tenant_id, created_by, ttl)
        return IssuedLink(link, f"{self._base_url}{PATH}{token}")

    def redeem(self, token: str) -> PortalLink:
        """The link behind a token, now marked opened; NotFound for an unknown, expired or used
        link (one answer for all three: the page says no more than that the link is not valid)."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 100:
            raise NotFound("portal link not valid")
        link = self._store.get_link(hash_token(token))
        now = self._now_ms()
        if link is None or link.redeemed_at_ms is not None or now >= link.expires_at_ms:
            raise NotFound("portal link not valid (unknown, expired or already used)")
        if not self._store.redeem(link, now):
            raise NotFound("portal link not valid (unknown, expired or already used)")
        log.info("portal link %s of tenant %s opened", link.link_id, link.tenant_id)
        return link


class CassandraPortalStore:
    """portal_links (cassandra/schema/013_portal_links.cql). Statements are prepared on first use,
    so a control plane whose keyspace lacks the table still serves everything else."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._p: dict[str, PreparedStatement] = {}

    def _statement(self, name: str) -> PreparedStatement:
        if name not in self._p:
            self._p[name] = self._session.prepare({
                "insert": "INSERT INTO portal_links (token_hash, link_id, tenant_id, created_by, created_at, "
                "expires_at) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
                "get": "SELECT token_hash, link_id, tenant_id, created_by, created_at, expires_at, redeemed_at "
                "FROM portal_links WHERE token_hash = ?",
                "redeem": "UPDATE portal_links SET redeemed_at = ? WHERE token_hash = ? "
                "IF redeemed_at = null AND link_id = ?",
            }[name])
        return self._p[name]

    def _run(self, name: str, params: tuple[Any, ...]) -> Any:
        try:
            return self._session.execute(self._statement(name), params)
        except (DriverException, NoHostAvailable) as exc:
            raise Unavailable(f"storage unavailable ({type(exc).__name__}); retry") from exc

    def put_link(self, link: PortalLink, ttl_s: int) -> None:
        self._run("insert", (link.token_hash, link.link_id, link.tenant_id, link.created_by,
                             _dt(link.created_at_ms), _dt(link.expires_at_ms), ttl_s))

    def get_link(self, token_hash: str) -> PortalLink | None:
        row = _first(self._run("get", (token_hash,)))
        if row is None or not row["link_id"]:
            return None
        return PortalLink(link_id=row["link_id"], tenant_id=row["tenant_id"], token_hash=row["token_hash"],
                          created_by=row["created_by"] or "", created_at_ms=_ms(row["created_at"]),
                          expires_at_ms=_ms(row["expires_at"]),
                          redeemed_at_ms=_ms(row["redeemed_at"]) if row["redeemed_at"] else None)

    def redeem(self, link: PortalLink, at_ms: int) -> bool:
        row = _first(self._run("redeem", (_dt(at_ms), link.token_hash, link.link_id)))
        return row is not None and bool(row["[applied]"])


def _first(result: Any) -> dict[str, Any] | None:
    for row in result:
        return row if isinstance(row, dict) else dict(zip(result.column_names, row, strict=True))
    return None


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _ms(value: datetime) -> int:
    # The driver returns naive UTC datetimes.
    return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000
