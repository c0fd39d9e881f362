"""Which history errors are one write's own (its values), as opposed to Cassandra's state.

    Exception raised by a write or read, or set on its completion
    ├── rejected: the same statement fails again, whatever Cassandra's state
    │   ├── UnicodeError, ValueError, TypeError, OverflowError, struct.error
    │   │       the driver could not encode a bound value (a lone surrogate in a text column,
    │   │       an int out of range): raised as the write is built, before anything is sent
    │   └── InvalidRequest .... Cassandra read the statement and refused it as invalid
    └── everything else: timeouts, Unavailable, NoHostAvailable, overload, a closed session --
            the store's state, which a later try may find better; never the delivery's fault

A rejected error becomes :class:`core.dispatch.WriteRejected` for the driver, which ends that one
delivery only once other writes are seen to succeed (core.endpoint_driver, ``_storage``).
"""

from __future__ import annotations

import struct

from cassandra import InvalidRequest

from core.dispatch import WriteRejected

_REJECTED: tuple[type[BaseException], ...] = (ValueError, TypeError, OverflowError, struct.error, InvalidRequest)


def as_driver_error(exc: BaseException) -> BaseException:
    """The error to hand the driver: WriteRejected for one of the write's own, else ``exc``."""
    if isinstance(exc, _REJECTED) and not isinstance(exc, WriteRejected):
        return WriteRejected(f"{type(exc).__name__}")
    return exc
