"""Classification of one HTTP try: the tree at the top of core/outcomes.py, as a table."""

from __future__ import annotations

import pytest

from core.outcomes import (
    ErrorClass,
    HttpResult,
    classify,
    describe,
    is_endpoint_failure,
    is_fast_failure,
    is_success,
)

E = ErrorClass

CLASSIFICATION = [
    # status, transport error          -> class (None = success)
    (200, None, None),
    (204, None, None),
    (299, None, None),
    (200, E.BODY_TOO_LARGE, None),  # we only cap what we read; the 200 was the ack
    (200, E.TIMEOUT, None),  # body read timed out after the status line: still acked
    (301, None, E.REDIRECT),
    (304, None, E.REDIRECT),
    (308, None, E.REDIRECT),
    (400, None, E.HTTP_4XX),
    (404, None, E.HTTP_4XX),
    (408, None, E.HTTP_408),
    (410, None, E.GONE),
    (429, None, E.HTTP_429),
    (499, None, E.HTTP_4XX),
    (500, None, E.HTTP_5XX),
    (500, E.BODY_TOO_LARGE, E.HTTP_5XX),
    (503, None, E.HTTP_5XX),
    (599, None, E.HTTP_5XX),
    (101, None, E.PROTOCOL),
    (600, None, E.PROTOCOL),
    (None, E.TIMEOUT, E.TIMEOUT),
    (None, E.CONNECT, E.CONNECT),
    (None, E.RESET, E.RESET),
    (None, E.DNS, E.DNS),
    (None, E.TLS, E.TLS),
    (None, E.PROTOCOL, E.PROTOCOL),
    (None, E.EGRESS_REFUSED, E.EGRESS_REFUSED),
    (None, E.INTERNAL, E.INTERNAL),
]


@pytest.mark.parametrize(("status", "error", "expected"), CLASSIFICATION)
def test_classify(status: int | None, error: ErrorClass | None, expected: ErrorClass | None) -> None:
    assert classify(HttpResult(status=status, error=error)) is expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [(None, False), (199, False), (200, True), (226, True), (299, True), (300, False), (500, False)],
)
def test_is_success(status: int | None, expected: bool) -> None:
    assert is_success(status) is expected


BREAKER_VIEW = [
    # result                                      fast   counts against the endpoint
    (HttpResult(None, E.DNS), True, True),
    (HttpResult(None, E.TLS), True, True),
    (HttpResult(None, E.TIMEOUT), False, True),
    (HttpResult(None, E.CONNECT), False, True),
    (HttpResult(503), False, True),
    (HttpResult(429), False, True),
    (HttpResult(404), False, False),  # it answered: it is up
    (HttpResult(301), False, False),
    (HttpResult(410), False, False),
    (HttpResult(200), False, False),
    (HttpResult(None, E.INTERNAL), False, False),  # our bug
    (HttpResult(None, E.EGRESS_REFUSED), False, False),  # we refused; it was never contacted
]


@pytest.mark.parametrize(("result", "fast", "endpoint_failure"), BREAKER_VIEW)
def test_breaker_view(result: HttpResult, fast: bool, endpoint_failure: bool) -> None:
    assert is_fast_failure(result) is fast
    assert is_endpoint_failure(result) is endpoint_failure


def test_a_result_needs_a_status_or_an_error() -> None:
    with pytest.raises(ValueError):
        HttpResult(status=None, error=None)


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (HttpResult(503), "HTTP 503"),
        (HttpResult(None, E.TIMEOUT, detail="read timed out"), "timeout: read timed out"),
    ],
)
def test_describe(result: HttpResult, text: str) -> None:
    assert describe(result) == text
