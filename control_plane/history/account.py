"""A tenant's account of every event in a window (core/account.py adds up; this reads).

Three sources, each read for the calling tenant only:

* reconciliation's inputs and report for the tenant (``Reconciler.tenant_window``: the events
  topic, fan-out snapshots, the deliveries' history);
* the dead-letter topic: letters that name one of the window's events of this tenant, by event
  id, with their reason (a letter names its event in ``extra`` or in the original record it
  carries; a record the job could not parse names no tenant and is in nobody's account --
  reconciliation counts those for the operator);
* the history's ``skipped`` rows of the tenant's endpoints created in the window, with their reason.

The API (TenantAccount.GetAccount), ``webhookctl account`` and the console's account page call
``TenantAccountService.account`` with the caller's principal; the tenant is always the principal's.
The cost is reconciliation's for the window plus one read of the dead-letter topic from the
window's start, so the window is bounded (``MAX_WINDOW_MS``).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from control_plane.domain import DeliveryStatus, Principal
from control_plane.endpoints.service import EndpointService
from control_plane.errors import Unavailable
from control_plane.history import topic_window
from control_plane.history.deliveries import DeliveryService
from control_plane.history.reconcile import check_window
from core import account as acc
from core import reconcile as rc
from core.ingest import IngestError, parse_event
from core.settings import Settings

log = logging.getLogger(__name__)

MAX_WINDOW_MS = 7 * 24 * 3_600_000
ENDPOINTS_READ = 500  # the tenant's endpoints whose skipped rows are read
SKIPPED_READ = 5000  # skipped rows at most, over all of them


class Window(Protocol):
    def tenant_window(self, since_ms: int, until_ms: int,
                      tenant_id: str) -> tuple[rc.Inputs, rc.Report, dict[str, str]]: ...


DeadLetters = Callable[[str, int, int], dict[str, str]]  # (tenant, since, until) -> event id -> reason


def letter_event(value: bytes, max_payload_bytes: int) -> tuple[str, str, str] | None:
    """(event id, tenant id, reason) of one dead letter, None when it names no tenant's event."""
    try:
        letter = json.loads(value)
    except ValueError:
        return None
    if not isinstance(letter, dict) or not isinstance(letter.get("reason"), str):
        return None
    extra = letter.get("extra")
    if not isinstance(extra, dict):
        extra = {}
    event_id, tenant_id = str(extra.get("event_id", "")), str(extra.get("tenant_id", ""))
    if not (event_id and tenant_id):
        try:
            event = parse_event(base64.b64decode(str(letter.get("original_base64", ""))), max_payload_bytes,
                                check_payload=False)
        except (IngestError, ValueError):
            return None
        event_id, tenant_id = event.event_id, event.tenant_id
    return event_id, tenant_id, letter["reason"]


class TenantAccountService:
    def __init__(self, window: Window, endpoints: EndpointService, deliveries: DeliveryService,
                 dead_letters: DeadLetters) -> None:
        self._window = window
        self._endpoints = endpoints
        self._deliveries = deliveries
        self._dead_letters = dead_letters

    def account(self, principal: Principal, since_ms: int | None, until_ms: int | None) -> acc.Account:
        since_ms, until_ms = check_window(since_ms, until_ms, MAX_WINDOW_MS,
                                          "the window is longer than 7 days: ask for it in parts")
        tenant = principal.tenant_id  # never a tenant the caller names
        inputs, report, types = self._window.tenant_window(since_ms, until_ms, tenant)
        letters = self._dead_letters(tenant, since_ms, until_ms)
        return acc.build(tenant, inputs, report, types, letters, self._skipped(principal, since_ms, until_ms))

    def _skipped(self, principal: Principal, since_ms: int, until_ms: int) -> list[acc.Skipped]:
        out: list[acc.Skipped] = []
        for endpoint_id in self._endpoint_ids(principal):
            cursor = ""
            while len(out) < SKIPPED_READ:
                page = self._deliveries.list(principal, endpoint_id, [DeliveryStatus.SKIPPED], since_ms, until_ms,
                                             200, cursor)
                for d in page.items:
                    reason = self._deliveries.get(principal, d.delivery_id).last_error_class or "skipped"
                    out.append(acc.Skipped(d.delivery_id, d.event_id, endpoint_id, reason))
                cursor = page.next_cursor
                if not cursor:
                    break
        return out

    def _endpoint_ids(self, principal: Principal) -> Iterable[str]:
        cursor, seen = "", 0
        while seen < ENDPOINTS_READ:
            page = self._endpoints.list(principal, 100, cursor)
            for e in page.items:
                seen += 1
                yield e.endpoint_id
            cursor = page.next_cursor
            if not cursor:
                return


class KafkaDeadLetters:
    """The dead-letter topic's letters about a tenant's events, read by offsets for times from the
    window's start to ``slack_ms`` past its end (a letter is written right after its event
    arrives: the slack catches the letters of the window's last events)."""

    def __init__(self, settings: Settings, slack_ms: int = 60_000) -> None:
        self._settings = settings
        self._slack_ms = slack_ms

    def __call__(self, tenant_id: str, since_ms: int, until_ms: int) -> dict[str, str]:
        topic = self._settings.kafka.dlq_topic
        limit = self._settings.ingest.max_payload_bytes
        out: dict[str, str] = {}
        try:
            for msg in topic_window.records(self._settings.kafka.bootstrap_servers, topic, since_ms,
                                            until_ms + self._slack_ms, "webhooks-account"):
                found = letter_event(msg.value() or b"", limit)
                if found is not None and found[1] == tenant_id:
                    out.setdefault(found[0], found[2])
        except topic_window.TopicMissing:
            return {}  # no dead-letter topic yet: no letters
        except topic_window.WindowShort as short:
            # an account missing letters would show refused events as merely unsubscribed
            raise Unavailable(f"dead-letter topic {topic}: partitions {short.partitions} stopped short of the "
                              "window's end; retry") from None
        return out


def as_dict(a: acc.Account) -> dict[str, Any]:
    """The account as plain data (the CLI's --json, the tests)."""
    def one(t: acc.TypeAccount) -> dict[str, Any]:
        return {"event_type": t.event_type, "accepted": t.accepted, "fanned_out": t.fanned_out,
                "no_subscriber": t.no_subscriber, "dead_lettered": dict(t.dead_lettered),
                "not_accounted": t.not_accounted, "deliveries": {s: t.deliveries[s] for s in acc.DELIVERY_STATUSES},
                "skipped": dict(t.skipped)}
    return {"tenant_id": a.tenant_id, "since_ms": a.since_ms, "until_ms": a.until_ms, "balanced": a.balanced,
            "types": [one(t) for t in a.types], "total": one(a.total),
            "unaccounted": [vars(u) for u in a.unaccounted]}
