"""One endpoint's dispatch, as a pure driver: plain data in, decisions out.

The Flink operator (:mod:`operators.dispatcher`) owns one driver per endpoint key. It feeds the
driver what happened (a new delivery, a replay request, a config, finished I/O) and asks it to
:meth:`EndpointDriver.step`; the step returns a :class:`Decision` -- the I/O to start (check,
persist, reserve, send, record, load) and when to be woken again *and why*. The driver never
does I/O, never reads a clock and never sleeps; ``now_ms`` and the random source come in, keyed
state goes through :class:`core.endpoint_store.EndpointStore` (whose docstring is the durability
policy), and tenant slots come from the operator-wide :class:`core.fairness.FairScheduler`.

Wake times are reasons, never polls: the earliest of the next retry, the breaker's probe time,
the token bucket's refill, a slot back-off (short for the keys next in line for a slot), the
earliest deadline, a manual request's wait, a write retry, or the end of a hold after an
internal error. An endpoint that is blocked (open breaker, disabled, waiting for its config) is
woken O(1) times per second at most. Work that only an input can unblock (a config, finished
I/O) is not polled for: the input drives the endpoint.

On an ordered endpoint (:mod:`core.ordering`, applied by :mod:`core.key_order`) only a key's head
is indexed as due; the rest of the key waits unindexed (no timer, no poll) until the head's final
record, which indexes the next.

Slots are conserved: the driver asks for slots only when breaker, bucket and its own in-flight
cap would let a request go, gives back every grant it cannot use in the same step, and cancels
its ticket whenever it stops wanting one. ``in_flight`` is exactly the slots it holds.

The package, by seam:

* :mod:`~core.endpoint_driver.decision` -- what a step returns: the actions, ``Wake(at_ms, reason)``.
* :mod:`~core.endpoint_driver.policy` -- :class:`DriverPolicy`, the bounds and waits, as data.
* :mod:`~core.endpoint_driver.backlog` -- the memory window, the overflow queue and the retry queue.
* :mod:`~core.endpoint_driver.sending` -- the send path, in named steps.
* :mod:`~core.endpoint_driver.driver` -- :class:`EndpointDriver`: the inputs, the step, the index.

Import from here (``core.endpoint_driver``): the modules behind it may move.
"""

from core.endpoint_driver.decision import (
    Action,
    Check,
    Decision,
    IoKind,
    Load,
    Persist,
    Record,
    Reserve,
    Send,
    Wake,
)
from core.endpoint_driver.driver import EndpointDriver, light
from core.endpoint_driver.policy import DriverPolicy, StorageHealth

__all__ = ["Action", "Check", "Decision", "DriverPolicy", "EndpointDriver", "IoKind", "Load", "Persist", "Record",
           "Reserve", "Send", "StorageHealth", "Wake", "light"]
