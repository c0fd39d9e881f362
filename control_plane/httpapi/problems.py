"""The HTTP API's errors as RFC 9457 ``application/problem+json``, one stable ``type`` per class.

A servicer ends a failed call with a gRPC status and names the domain error's class in trailing
metadata (control_plane.rpc.servicer.ERROR_CLASS_KEY); the class decides the problem type and the HTTP
status, the code only when no class is named (an unexpected error: INTERNAL). The mapping is one
way (gRPC -> HTTP) and the same for every route:

    class / code                 HTTP  type (/v1/problems/...)
    InvalidArgument              400   invalid-argument
    Unauthenticated              401   unauthenticated
    PermissionDenied             403   permission-denied
    NotFound                     404   not-found        (another tenant's id too)
    AlreadyExists                409   already-exists
    FailedPrecondition           409   failed-precondition
    Aborted                      409   aborted          (a lost race; retrying is safe)
    StaleVersion                 412   stale-version    (If-Match named an old config_version)
    Unavailable                  503   unavailable      (nothing was applied; retry)
    INTERNAL and anything else   500   internal

and the HTTP layer's own: no-route 404, method-not-allowed 405, unsupported-media-type 415,
request-too-large 413, idempotency-key-reused 422 (same key, another request),
idempotency-key-in-progress 409.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc

PROBLEM_JSON = "application/problem+json"
TYPE_PREFIX = "/v1/problems/"


@dataclass(frozen=True)
class ProblemType:
    slug: str
    status: int
    title: str

    @property
    def uri(self) -> str:
        return TYPE_PREFIX + self.slug


def _types(*types: ProblemType) -> dict[str, ProblemType]:
    return {t.slug: t for t in types}


TYPES = _types(
    ProblemType("invalid-argument", 400, "The request is not valid"),
    ProblemType("unauthenticated", 401, "No credential, or an unknown or revoked one"),
    ProblemType("permission-denied", 403, "The credential may not do this"),
    ProblemType("not-found", 404, "No such resource"),
    ProblemType("already-exists", 409, "Already exists"),
    ProblemType("failed-precondition", 409, "Not possible in the resource's current state"),
    ProblemType("aborted", 409, "Lost a race with a concurrent change; retry"),
    ProblemType("stale-version", 412, "The resource changed since the version named by If-Match"),
    ProblemType("unavailable", 503, "A store did not answer; nothing was applied; retry"),
    ProblemType("internal", 500, "Internal error"),
    ProblemType("no-route", 404, "No such route"),
    ProblemType("method-not-allowed", 405, "The route does not take this method"),
    ProblemType("request-too-large", 413, "The body is larger than the API takes (1 MiB)"),
    ProblemType("unsupported-media-type", 415, "The body must be application/json"),
    ProblemType("idempotency-key-reused", 422, "The Idempotency-Key was used for another request"),
    ProblemType("idempotency-key-in-progress", 409, "A request with this Idempotency-Key is still running"),
)

_BY_CLASS = {
    "InvalidArgument": "invalid-argument", "Unauthenticated": "unauthenticated",
    "PermissionDenied": "permission-denied", "NotFound": "not-found", "AlreadyExists": "already-exists",
    "FailedPrecondition": "failed-precondition", "Aborted": "aborted", "StaleVersion": "stale-version",
    "Unavailable": "unavailable",
}
_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid-argument", grpc.StatusCode.OUT_OF_RANGE: "invalid-argument",
    grpc.StatusCode.UNAUTHENTICATED: "unauthenticated", grpc.StatusCode.PERMISSION_DENIED: "permission-denied",
    grpc.StatusCode.NOT_FOUND: "not-found", grpc.StatusCode.ALREADY_EXISTS: "already-exists",
    grpc.StatusCode.FAILED_PRECONDITION: "failed-precondition", grpc.StatusCode.ABORTED: "aborted",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
}


def of_rpc(code: grpc.StatusCode, error_class: str | None) -> ProblemType:
    """The problem type of a failed call: by the domain error's class, else by the code."""
    slug = _BY_CLASS.get(error_class or "") or _BY_CODE.get(code, "internal")
    return TYPES[slug]


@dataclass(frozen=True)
class Problem:
    type: ProblemType
    detail: str
    instance: str = ""
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def status(self) -> int:
        return self.type.status

    def body(self) -> bytes:
        doc: dict[str, Any] = {"type": self.type.uri, "title": self.type.title, "status": self.type.status,
                               "detail": self.detail}
        if self.instance:
            doc["instance"] = self.instance
        doc.update(self.extra)
        return json.dumps(doc, separators=(",", ":")).encode()


def problem(slug: str, detail: str, instance: str = "", **extra: Any) -> Problem:
    return Problem(TYPES[slug], detail, instance, tuple(extra.items()))


def type_document(slug: str) -> dict[str, Any] | None:
    """What GET /v1/problems/<slug> answers: the type's title and status."""
    t = TYPES.get(slug)
    return None if t is None else {"type": t.uri, "title": t.title, "status": t.status}
