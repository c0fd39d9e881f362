"""When the dispatcher looks at an endpoint again, and whether a timer needs a pass at all.

Two kinds of reason share one Flink timer per endpoint: the wake its driver asked for (a retry
due, a breaker probe, a slot back-off...: :class:`core.endpoint_driver.Wake`) and the polls of
its I/O in flight (:meth:`IoTracker.poll_at`). They are kept apart so that a timer that was only
a poll, and finds nothing finished, costs a lookup and a re-armed timer instead of a pass.

A new delivery for an endpoint whose timer is due within one poll interval anyway (it has I/O
in flight under load; :meth:`IoTracker.poll_interval`) waits for that timer: it is in the driver
and in keyed state at once, and the timer's pass steps every delivery that arrived meanwhile
together (:meth:`Wakes.defer`), instead of a pass of its own each. An endpoint with nothing due
soon gets its pass at once: at light load waiting would only add latency.

Which timers are set is known in memory only: after a restore Flink re-fires the checkpointed
timers, and an endpoint this incarnation has made no pass for is not known to have nothing to do
(its driver is rebuilt from keyed state by a pass).
"""

from __future__ import annotations

from operators.io_tracker import IoTracker


class Wakes:
    def __init__(self) -> None:
        self._timers: dict[str, int] = {}  # the earliest timer set per endpoint
        self._driver: dict[str, int | None] = {}  # the wake each driver last asked for (None: none)
        self._deferred: set[str] = set()  # endpoints with input waiting for their timer's pass

    def fired(self, endpoint_id: str, timestamp: int) -> None:
        if self._timers.get(endpoint_id) == timestamp:
            del self._timers[endpoint_id]

    def asked(self, endpoint_id: str, at_ms: int | None) -> None:
        """The wake the endpoint's driver gave in the pass just made (which took any deferred input)."""
        self._driver[endpoint_id] = at_ms
        self._deferred.discard(endpoint_id)

    def defer(self, endpoint_id: str, now_ms: int, within_ms: int) -> bool:
        """Whether input that arrived now can wait for the endpoint's timer, set and due within
        ``within_ms``; if so that timer will make a pass."""
        current = self._timers.get(endpoint_id)
        if current is None or not now_ms < current <= now_ms + within_ms:
            return False
        self._deferred.add(endpoint_id)
        return True

    def forget(self, endpoint_id: str) -> None:
        """Its driver was dropped: the next timer for it makes a pass again."""
        self._driver.pop(endpoint_id, None)
        self._deferred.discard(endpoint_id)

    def held(self, endpoint_id: str, until_ms: int) -> None:
        """Held after an internal error: nothing before ``until_ms`` but the hold's end."""
        self._timers.pop(endpoint_id, None)
        self._driver[endpoint_id] = until_ms

    def needs_pass(self, endpoint_id: str, now_ms: int, io: IoTracker) -> bool:
        """Whether a timer firing now has a reason for a pass: I/O finished, the driver's wake is
        due, input waits for it (defer), or the endpoint is not known (no pass since its driver
        was built)."""
        if endpoint_id not in self._driver or endpoint_id in self._deferred:
            return True
        due = self._driver[endpoint_id]
        return (due is not None and due <= now_ms) or io.has_finished(endpoint_id)

    def next_timer(self, endpoint_id: str, poll_ms: int | None, now_ms: int) -> int | None:
        """The timer to register after a pass or a poll: the earlier of the driver's wake and the
        I/O poll, never at or before now; None when one at or before it is already set."""
        wake = self._driver.get(endpoint_id)
        if poll_ms is not None and (wake is None or poll_ms < wake):
            wake = poll_ms
        return self.timer_for(endpoint_id, wake, now_ms)

    def timer_for(self, endpoint_id: str, wake: int | None, now_ms: int) -> int | None:
        if wake is None:
            return None
        wake = max(wake, now_ms + 1)
        current = self._timers.get(endpoint_id)
        if current is not None and now_ms < current <= wake:
            return None
        self._timers[endpoint_id] = wake
        return wake
