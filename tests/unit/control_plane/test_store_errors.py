"""Which storage errors a control-plane call answers UNAVAILABLE (retry: every write is idempotent
by its version check or request id) rather than INTERNAL."""

from __future__ import annotations

import pytest
from cassandra import WriteTimeout
from cassandra.cluster import NoHostAvailable
from cassandra.protocol import ErrorMessage, InvalidRequestException

from control_plane.errors import Unavailable
from control_plane.store.cql import unavailable_on_driver_error

# Protocol v5's CAS_WRITE_UNKNOWN: a lightweight transaction whose proposal a minority accepted
# (seen on a 3-node ring under concurrent creates). The driver has no class for it.
CAS_WRITE_UNKNOWN = 0x1700


@pytest.mark.parametrize("exc", [
    NoHostAvailable("no host", {}),
    WriteTimeout("timed out", write_type=0),
    ErrorMessage(CAS_WRITE_UNKNOWN, "CAS operation result is unknown - proposal accepted by 1 but not a quorum.",
                 None),
])
def test_a_transient_storage_error_is_unavailable(exc: Exception) -> None:
    @unavailable_on_driver_error
    def write() -> None:
        raise exc

    with pytest.raises(Unavailable, match="storage unavailable"):
        write()


def test_a_server_error_that_is_not_transient_is_not_hidden_as_unavailable() -> None:
    invalid = InvalidRequestException(0x2200, "unconfigured table endpoints", None)

    @unavailable_on_driver_error
    def read() -> None:
        raise invalid

    with pytest.raises(ErrorMessage):
        read()
