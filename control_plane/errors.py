"""What can go wrong in a control-plane call, as domain errors the servicer maps to gRPC codes.

    ControlPlaneError
    ├── InvalidArgument      bad input; the message names the field and what is accepted
    ├── NotFound             unknown id, or another tenant's id (existence is not leaked)
    ├── AlreadyExists        a name or idempotency key already taken by something else
    ├── FailedPrecondition   valid request, wrong state (endpoint disabled, outside window)
    │   └── StaleVersion     a conditional change named a version that is no longer current
    ├── Aborted              lost a race with a concurrent change; retrying is safe
    ├── Unauthenticated      no credential, or an unknown/revoked one
    ├── PermissionDenied     a real credential that may not do this
    └── Unavailable          Cassandra or Kafka did not answer; nothing was applied

Messages are shown to callers verbatim, so they never contain secrets or internals.
"""

from __future__ import annotations


class ControlPlaneError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(ControlPlaneError):
    pass


class NotFound(ControlPlaneError):
    pass


class AlreadyExists(ControlPlaneError):
    pass


class FailedPrecondition(ControlPlaneError):
    pass


class StaleVersion(FailedPrecondition):
    pass


class Aborted(ControlPlaneError):
    pass


class Unauthenticated(ControlPlaneError):
    pass


class PermissionDenied(ControlPlaneError):
    pass


class Unavailable(ControlPlaneError):
    pass
