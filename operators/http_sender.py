"""The dispatcher's only door to the network: one HTTPS POST per attempt, under the egress policy.

Created inside the dispatcher's background asyncio loop (``await HttpSender.create(...)``); every
``send`` returns a :class:`SendResult` and never raises for anything the endpoint or the network
did, so the caller's code is a plain mapping from result to outcome (:mod:`core.outcomes`). It
raises :class:`core.dispatch.NotSent` for an error of ours before anything was sent.

How the SSRF controls are enforced, in the order a request meets them:

1. :func:`core.egress.parse_target` judges the URL text (scheme, port, userinfo, names, IP
   literals in any notation). The request is then made to ``Target.url``, the canonical form of
   what was judged, so aiohttp never parses the customer's original text.
2. For a host name, :class:`_PolicyResolver` is the connector's only resolver: it resolves, runs
   :func:`core.egress.check_resolved` over EVERY A/AAAA answer, and hands aiohttp only those
   validated addresses. aiohttp connects to exactly what was checked (no second lookup to rebind),
   while TLS SNI and certificate verification still use the host name. The DNS cache is off, so
   every new connection is judged on a fresh answer.
3. Redirects are never followed (a 3xx is returned as the endpoint's answer), nothing is
   decompressed, the response body is read up to a cap, header lines are capped, and connect and
   total time are bounded.

Exceptions map to :class:`core.outcomes.ErrorClass`; details are passed through
:func:`core.secrets.redact` so a secret can never ride an error message into the attempt history.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from core.dispatch import NotSent
from core.egress import EgressPolicy, EgressRefused, check_resolved, parse_target
from core.outcomes import ErrorClass, HttpResult
from core.secrets import redact
from core.settings import DispatchSettings

# host, port -> IP address strings. The default asks the OS (loop.getaddrinfo); tests inject a
# fake that answers loopback addresses, so no test ever sends a DNS query or leaves the machine.
AddressLookup = Callable[[str, int], Awaitable[Sequence[str]]]

RESPONSE_PREFIX_BYTES = 256
_DETAIL_MAX_CHARS = 300
_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


@dataclass(frozen=True)
class SendResult:
    """What one POST produced. ``status`` is None when no status line arrived; then ``error``
    says why. With a status, ``error`` is informational only (body_too_large, or the body read
    timed out / was cut): the status is the endpoint's answer."""

    status: int | None
    error: ErrorClass | None
    error_detail: str
    latency_ms: int
    response_sha256: str = ""  # of the bytes read, at most max_response_bytes
    response_prefix: str = ""  # first 256 bytes, decoded lossily, secrets redacted
    retry_after: str | None = None  # raw header; core.retry decides what it means

    @property
    def http_result(self) -> HttpResult:
        return HttpResult(
            status=self.status, error=self.error, retry_after=self.retry_after, detail=self.error_detail
        )


async def _system_lookup(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class _PolicyResolver(AbstractResolver):
    """Resolve, judge every answer, and return only addresses the policy allows.

    Raising :class:`EgressRefused` (not an OSError) makes aiohttp abort the connection attempt
    with that exception instead of reporting a DNS failure.
    """

    def __init__(self, policy: EgressPolicy, lookup: AddressLookup) -> None:
        self._policy = policy
        self._lookup = lookup

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = list(dict.fromkeys(await self._lookup(host, port)))
        try:
            check_resolved(addresses, self._policy)
        except EgressRefused:
            raise
        except Exception as exc:  # the check itself failed: no connection was made for it
            raise NotSent(f"checking the resolved addresses failed: {type(exc).__name__}") from exc
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=_NUMERIC,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        pass


def _tls_context(settings: DispatchSettings) -> ssl.SSLContext:
    # System CAs always; an extra bundle adds trust (tests use a local CA), it never replaces it.
    context = ssl.create_default_context(purpose=ssl.Purpose.SERVER_AUTH)
    if settings.ca_bundle is not None:
        context.load_verify_locations(cafile=str(settings.ca_bundle))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _detail(exc: BaseException, prefix: str = "") -> str:
    text = str(exc) or type(exc).__name__
    return redact(f"{prefix}{text}")[:_DETAIL_MAX_CHARS]


def _classify(exc: Exception) -> tuple[ErrorClass, str]:
    """Map a transport exception (no status line received) to an error class and a detail."""
    if isinstance(exc, EgressRefused):
        return ErrorClass.EGRESS_REFUSED, _detail(exc)
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        return ErrorClass.TLS, _detail(exc)
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return ErrorClass.DNS, _detail(exc)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return ErrorClass.TIMEOUT, _detail(exc, "connect timed out: ")
    if isinstance(exc, asyncio.TimeoutError):  # ServerTimeoutError and the total timeout
        return ErrorClass.TIMEOUT, _detail(exc, "timed out: ")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ErrorClass.CONNECT, _detail(exc)
    if isinstance(exc, aiohttp.ClientResponseError):
        # The response could not be parsed (bad status line, header over the size caps).
        return ErrorClass.PROTOCOL, _detail(exc, "invalid HTTP response: ")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | ConnectionError):
        return ErrorClass.RESET, _detail(exc, "connection closed: ")
    if isinstance(exc, aiohttp.ClientOSError):
        return ErrorClass.RESET, _detail(exc)
    return ErrorClass.INTERNAL, _detail(exc, f"{type(exc).__name__}: ")


class HttpSender:
    """One aiohttp session per dispatcher instance; ``limit`` bounds the whole pool."""

    def __init__(
        self, session: aiohttp.ClientSession, policy: EgressPolicy, settings: DispatchSettings
    ) -> None:
        self._session = session
        self._policy = policy
        self._max_body = settings.max_response_bytes

    @classmethod
    async def create(
        cls,
        settings: DispatchSettings,
        policy: EgressPolicy,
        resolver: AddressLookup | None = None,
    ) -> HttpSender:
        """Build the sender; must run inside the event loop that will call :meth:`send`."""
        connector = aiohttp.TCPConnector(
            resolver=_PolicyResolver(policy, resolver or _system_lookup),
            use_dns_cache=False,
            ssl=_tls_context(settings),
            limit=settings.max_in_flight,
        )
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=settings.total_timeout_s, sock_connect=settings.connect_timeout_s
            ),
            # Without decompression a small gzip body cannot expand into a huge one, and
            # "identity" asks the endpoint not to compress so the recorded prefix is readable.
            auto_decompress=False,
            headers={"User-Agent": settings.user_agent, "Accept-Encoding": "identity"},
            max_line_size=settings.max_header_bytes,
            max_field_size=settings.max_header_bytes,
            # No proxy or netrc from the environment: egress goes where the policy judged.
            trust_env=False,
            # Cookies set by one customer's endpoint must never travel with another request.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        return cls(session, policy, settings)

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> SendResult:
        """POST ``body`` (exact bytes) to ``url``. Never raises for endpoint or network faults."""
        started = time.monotonic()

        def elapsed_ms() -> int:
            return int((time.monotonic() - started) * 1000)

        if self._session.closed:  # aiohttp would raise inside post, taken below for a sent request
            raise NotSent("the HTTP session is closed")
        try:
            target = parse_target(url, self._policy)
        except EgressRefused as refused:
            return SendResult(None, ErrorClass.EGRESS_REFUSED, _detail(refused), elapsed_ms())
        except Exception as exc:  # the policy check itself failed: nothing was sent
            raise NotSent(f"judging the URL failed: {type(exc).__name__}") from exc

        status: int | None = None
        retry_after: str | None = None
        received = b""
        info: tuple[ErrorClass, str] | None = None
        try:
            async with self._session.post(
                URL(target.url, encoded=True), data=body, headers=dict(headers), allow_redirects=False
            ) as response:
                status = response.status
                retry_after = response.headers.get("Retry-After")
                received, info = await self._read_capped(response)
        except NotSent:
            raise  # from the resolver, before any connection: not an attempt
        except Exception as exc:  # an adapter: every failure becomes a result, none escapes
            error, detail = _classify(exc)
            if status is None:
                return SendResult(None, error, detail, elapsed_ms())
            # The status line arrived and decides; what went wrong reading the body is a note.
            info = (error, f"after HTTP {status}, reading the body: {detail}")

        kept = received[: self._max_body]
        return SendResult(
            status=status,
            error=info[0] if info else None,
            error_detail=info[1] if info else "",
            latency_ms=elapsed_ms(),
            response_sha256=hashlib.sha256(kept).hexdigest(),
            response_prefix=redact(kept[:RESPONSE_PREFIX_BYTES].decode("utf-8", errors="replace")),
            retry_after=retry_after,
        )

    async def _read_capped(
        self, response: aiohttp.ClientResponse
    ) -> tuple[bytes, tuple[ErrorClass, str] | None]:
        """Read at most max_response_bytes + 1 bytes; one more than the cap proves it is too big,
        and then the connection is closed instead of draining an endless body."""
        limit = self._max_body + 1
        chunks: list[bytes] = []
        total = 0
        while total < limit:
            chunk = await response.content.read(limit - total)
            if not chunk:
                return b"".join(chunks), None
            chunks.append(chunk)
            total += len(chunk)
        response.close()
        return b"".join(chunks), (
            ErrorClass.BODY_TOO_LARGE,
            f"response body exceeds {self._max_body} bytes; stopped reading",
        )

    async def close(self) -> None:
        await self._session.close()
