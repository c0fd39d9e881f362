"""What one HTTP try produced, how it is classified, and the outcomes the retry policy decides.

Classification of one try (:func:`classify`), read top to bottom::

    HttpResult
    ├── status present: the endpoint answered; the status line decides
    │   ├── 2xx ........................ success (even if we stopped reading a large body)
    │   ├── 3xx ........................ REDIRECT        never followed, permanent
    │   ├── 408 ........................ HTTP_408        retry
    │   ├── 410 ........................ GONE            permanent, disables the endpoint
    │   ├── 429 ........................ HTTP_429        retry, honours Retry-After
    │   ├── other 4xx .................. HTTP_4XX        permanent for this endpoint config
    │   ├── 5xx ........................ HTTP_5XX        retry (503 honours Retry-After)
    │   └── 1xx as final, >= 600 ....... PROTOCOL        retry
    └── status None: no usable response; the transport error decides
        ├── DNS, TLS ................... retry, and a *fast* failure for the breaker
        ├── CONNECT, RESET, TIMEOUT .... retry
        ├── PROTOCOL ................... retry
        ├── EGRESS_REFUSED ............. permanent (the SSRF policy will refuse it again)
        └── INTERNAL ................... retry (our bug, not the endpoint's; not held against it)

The outcome types are what :func:`core.retry.decide` returns, so callers match on a type instead
of re-deriving meaning from a status int.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, TypeAlias


class ErrorClass(enum.StrEnum):
    """Why one try did not succeed. Stored on every attempt row, so values are stable strings."""

    # -- transport: no HTTP status was received ------------------------------------------------
    TIMEOUT = "timeout"  # connect or total timeout; the endpoint may still have processed it
    CONNECT = "connect"  # TCP connect refused or unreachable; nothing was sent
    RESET = "reset"  # connection reset or closed before a complete status line
    DNS = "dns"  # the host name did not resolve
    TLS = "tls"  # handshake, certificate or hostname verification failed
    PROTOCOL = "protocol"  # not parseable HTTP: bad status line, headers over the size cap
    EGRESS_REFUSED = "egress_refused"  # SSRF policy refused the resolved destination; never sent
    INTERNAL = "internal"  # a failure inside the dispatcher itself, not caused by the endpoint
    # -- the endpoint answered with a status that is not 2xx -----------------------------------
    REDIRECT = "redirect"  # 3xx: we never follow redirects, and a redirect is not an ack
    HTTP_408 = "http_408"  # Request Timeout: the endpoint asks us to try again
    HTTP_429 = "http_429"  # Too Many Requests: try again, after Retry-After if it is sane
    GONE = "gone"  # 410: the receiver says this endpoint is gone for good
    HTTP_4XX = "http_4xx"  # any other 4xx: the request as configured will not be accepted
    HTTP_5XX = "http_5xx"  # server error: transient from our point of view
    # -- informational: recorded with a status, never decides on its own -----------------------
    BODY_TOO_LARGE = "body_too_large"  # we stopped reading the response at the byte cap


# Errors worth trying again: the same request may succeed later.
_RETRYABLE: frozenset[ErrorClass] = frozenset(
    {
        ErrorClass.TIMEOUT,
        ErrorClass.CONNECT,
        ErrorClass.RESET,
        ErrorClass.DNS,
        ErrorClass.TLS,
        ErrorClass.PROTOCOL,
        ErrorClass.INTERNAL,
        ErrorClass.HTTP_408,
        ErrorClass.HTTP_429,
        ErrorClass.HTTP_5XX,
    }
)

# Failures that say the destination is unreachable as configured (bad name, bad certificate):
# retrying soon rarely helps, so the breaker opens after fewer of them.
_FAST_FAILURES: frozenset[ErrorClass] = frozenset({ErrorClass.DNS, ErrorClass.TLS})

# Failures that are not evidence about the endpoint's health: our own bugs, and destinations
# we refused to contact. The breaker must not open on them.
_NOT_ENDPOINT_FAULT: frozenset[ErrorClass] = frozenset(
    {ErrorClass.INTERNAL, ErrorClass.EGRESS_REFUSED}
)


@dataclass(frozen=True)
class HttpResult:
    """The facts of one finished try, as the HTTP sender reports them.

    ``error`` with a status is informational (e.g. BODY_TOO_LARGE after a 200): once the endpoint
    sent a status line, that status is its answer.
    """

    status: int | None
    error: ErrorClass | None = None
    retry_after: str | None = None  # raw Retry-After header; parsed by the policy, not the sender
    detail: str = ""  # short human-readable cause (exception text), for the attempt record

    def __post_init__(self) -> None:
        if self.status is None and self.error is None:
            raise ValueError("HttpResult needs a status or an error")


def is_success(status: int | None) -> bool:
    """Any 2xx is the endpoint's acknowledgement; nothing else is."""
    return status is not None and 200 <= status <= 299


def classify(result: HttpResult) -> ErrorClass | None:
    """The error class of one try, or None when it succeeded. See the tree in the module doc."""
    status = result.status
    if status is None:
        # __post_init__ guarantees an error when there is no status.
        assert result.error is not None
        return result.error
    if is_success(status):
        return None
    if 300 <= status <= 399:
        return ErrorClass.REDIRECT
    if status == 408:
        return ErrorClass.HTTP_408
    if status == 410:
        return ErrorClass.GONE
    if status == 429:
        return ErrorClass.HTTP_429
    if 400 <= status <= 499:
        return ErrorClass.HTTP_4XX
    if 500 <= status <= 599:
        return ErrorClass.HTTP_5XX
    # A 1xx as a final answer or a status beyond 599 is broken HTTP, which we treat like a
    # garbled response: maybe a misbehaving proxy, worth another try within the deadline.
    return ErrorClass.PROTOCOL


def is_retryable(error_class: ErrorClass) -> bool:
    return error_class in _RETRYABLE


def is_fast_failure(result: HttpResult) -> bool:
    """DNS and TLS failures: retried, but the breaker opens after fewer of them."""
    return classify(result) in _FAST_FAILURES


def is_endpoint_failure(result: HttpResult) -> bool:
    """Should the breaker count this try against the endpoint's health?

    Only retryable failures the endpoint is responsible for. A permanent 4xx proves the endpoint
    is up (it answered), and our own errors or SSRF refusals say nothing about it.
    """
    error_class = classify(result)
    return (
        error_class is not None
        and is_retryable(error_class)
        and error_class not in _NOT_ENDPOINT_FAULT
    )


def describe(result: HttpResult) -> str:
    """A short reason for humans: ``HTTP 503`` or ``timeout: read timed out``."""
    if result.status is not None:
        head = f"HTTP {result.status}"
    else:
        assert result.error is not None
        head = result.error.value
    return f"{head}: {result.detail}" if result.detail else head


# -- outcomes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Succeeded:
    """The endpoint acknowledged with a 2xx; the delivery is done."""

    status: int


@dataclass(frozen=True)
class Retry:
    """Try again at ``at_ms`` (unix ms); the delivery stays pending and visible."""

    at_ms: int
    reason: str
    error_class: ErrorClass


@dataclass(frozen=True)
class GaveUp:
    """No more automatic tries. ``failed``: permanent error or attempts exhausted;
    ``expired``: the next try would fall past the absolute deadline."""

    reason: str
    final_status: Literal["failed", "expired"]
    error_class: ErrorClass


@dataclass(frozen=True)
class DisableEndpoint:
    """410 Gone: this delivery fails permanently and the endpoint is disabled (Standard
    Webhooks), so no further deliveries are attempted until a person re-enables it."""

    reason: str
    error_class: ErrorClass = ErrorClass.GONE


Outcome: TypeAlias = Succeeded | Retry | GaveUp | DisableEndpoint
