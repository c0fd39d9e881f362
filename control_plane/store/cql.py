"""What every Cassandra store of the control plane shares: one driver session, statements prepared
once at the configured consistency, rows as dicts, times in and out, driver failures as
:class:`errors.Unavailable`, and lightweight transactions (``IF NOT EXISTS``, ``IF version = ?``)
sent again when Cassandra could not learn their outcome.

The LWT helpers live here and nowhere else: :meth:`CassandraTables._applied` and
:meth:`CassandraTables._lwt` are how a store of this package asks "did my condition hold?".
"""

from __future__ import annotations

import calendar
import functools
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, ClassVar, ParamSpec, TypeVar

from cassandra import ConsistencyLevel, DriverException, WriteTimeout, WriteType
from cassandra.cluster import NoHostAvailable, Session
from cassandra.protocol import ErrorMessage
from cassandra.query import PreparedStatement

from control_plane.errors import Unavailable

P = ParamSpec("P")
R = TypeVar("R")

# What the driver raises when storage is out of reach (a timeout, no host): the caller retries.
DRIVER_ERRORS = (DriverException, NoHostAvailable)


def ms(value: datetime | None) -> int | None:
    # The driver returns naive UTC datetimes.
    if value is None:
        return None
    return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000


def dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def rows(result: Any) -> Iterator[dict[str, Any]]:
    # Whatever row factory the shared session uses, rows become dicts keyed by column name.
    names = result.column_names
    for row in result:
        yield row if isinstance(row, dict) else dict(zip(names, row, strict=True))


def unavailable(exc: BaseException) -> Unavailable:
    """The API's answer to a driver failure: UNAVAILABLE, retry."""
    return Unavailable(f"storage unavailable ({type(exc).__name__}); retry")


_CAS_WRITE_UNKNOWN = 0x1700
# An LWT whose outcome Cassandra could not learn is tried this many times in all before the call
# answers UNAVAILABLE, backing off a random 25-200 ms, doubling: on a ring, concurrent creates of
# one tenant (one partition of `endpoints`) contend in Paxos and a few of them come back unknown.
_LWT_TRIES = 4
_LWT_BACKOFF_S = (0.025, 0.2)


def _outcome_unknown(exc: BaseException) -> bool:
    """Cassandra could not tell whether this LWT applied: a CAS write timeout, or protocol v5's
    CAS_WRITE_UNKNOWN (a proposal a minority accepted), which has no driver class."""
    if isinstance(exc, WriteTimeout):
        return getattr(exc, "write_type", None) == WriteType.CAS
    return isinstance(exc, ErrorMessage) and exc.code == _CAS_WRITE_UNKNOWN


def unavailable_on_driver_error(fn: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except DRIVER_ERRORS as exc:
            # A timed-out LWT may or may not have applied; the caller retries and the version
            # check (or the idempotency key) makes the retry safe.
            raise unavailable(exc) from exc
        except ErrorMessage as exc:
            # Protocol v5's CAS_WRITE_UNKNOWN (a proposal a minority of replicas accepted; seen on a
            # 3-node ring under concurrent creates) has no driver class: the same as a timed-out LWT.
            if not _outcome_unknown(exc):
                raise
            raise Unavailable("storage unavailable (LWT result unknown); retry") from exc

    return wrapper


class CassandraTables:
    """A store over one driver session on keyspace ``webhooks``: the statements its class names in
    ``STATEMENTS`` prepared once, and the helpers that send them."""

    STATEMENTS: ClassVar[Mapping[str, str]] = {}

    def __init__(self, session: Session, scan_page_size: int = 500, consistency: str = "LOCAL_QUORUM") -> None:
        self._session = session
        self._scan_page_size = scan_page_size
        # Whatever session it is given (the server's, a test's), reads and writes at the
        # configured level (cassandra.consistency); LWTs at LOCAL_SERIAL (the server's profile).
        self._consistency = ConsistencyLevel.name_to_value[consistency]
        self._p = self._prepare_all()

    def _prepare_all(self) -> dict[str, PreparedStatement]:
        prepared = {}
        for name, text in self.STATEMENTS.items():
            stmt = self._session.prepare(text)
            stmt.consistency_level = self._consistency
            prepared[name] = stmt
        return prepared

    def _execute_all(self, queries: list[tuple[str, Sequence[Any]]]) -> list[Iterator[dict[str, Any]]]:
        """Several reads sent at once (first pages in parallel), each then read like _execute."""
        futures = []
        for name, params in queries:
            bound = self._p[name].bind(params)
            bound.fetch_size = self._scan_page_size
            futures.append(self._session.execute_async(bound))
        return [rows(f.result()) for f in futures]

    def _execute(
        self, name: str, params: Sequence[Any], fetch_size: int | None = None
    ) -> Iterator[dict[str, Any]]:
        bound = self._p[name].bind(params)
        if fetch_size is not None:
            bound.fetch_size = fetch_size
        yield from rows(self._session.execute(bound))

    def _first(self, name: str, params: Sequence[Any]) -> dict[str, Any] | None:
        return next(self._execute(name, params), None)

    def _applied(self, name: str, params: Sequence[Any],
                 mine: Callable[[dict[str, Any]], bool] | None = None) -> bool:
        """Whether an LWT applied (sent by _lwt). If an earlier try's outcome was unknown and a
        later one finds the condition false, ``mine`` says whether the row it found is that try's
        own write (applied after all) or another writer's."""
        row, unknown = self._lwt(name, params)
        if row is None:
            return False
        if row["[applied]"]:
            return True
        return unknown and mine is not None and mine(row)

    def _lwt(self, name: str, params: Sequence[Any]) -> tuple[dict[str, Any] | None, bool]:
        """An LWT's result row, and whether a try before it came back unknown. A try whose
        outcome Cassandra could not learn is sent again (the condition makes that safe) up to
        _LWT_TRIES times; still unknown after the last, the error is raised (UNAVAILABLE at the
        API: the caller retries)."""
        backoff = _LWT_BACKOFF_S[0]
        for attempt in range(_LWT_TRIES):
            try:
                return self._first(name, params), attempt > 0
            except (WriteTimeout, ErrorMessage) as exc:
                if not _outcome_unknown(exc) or attempt == _LWT_TRIES - 1:
                    raise
                self._sleep(random.uniform(backoff / 2, backoff))
                backoff = min(backoff * 2, _LWT_BACKOFF_S[1])
        raise AssertionError("unreachable")  # the last try returns or raises

    _sleep = staticmethod(time.sleep)
