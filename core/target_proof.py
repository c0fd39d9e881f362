"""Who may aim an event at one endpoint.

An event that names ``target_endpoint_id`` skips subscription matching: fan-out sends it to that
endpoint whatever its event-type filter. Only the control plane's own test events (`webhook.ping`)
may do that; a CDC record from any producer claiming a target would otherwise reach an endpoint
that never subscribed to its type. So the control plane attaches a proof -- HMAC-SHA256 over the
tenant, event id and endpoint id under a key derived from the master key -- and the job refuses
(dead-letters) a targeted event whose proof does not verify. The proof is bound to the event id,
so a captured one cannot aim another event.

The platform's operational events (``webhooks.*``, core.operational_events) carry a proof too,
over :data:`OPERATIONAL` in place of an endpoint id: a producer cannot make a tenant's receivers
believe the platform disabled or failed something.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from core.secrets import derive_key

_LABEL = b"webhooks.event-target/v1"
# What an operational event's proof is bound to instead of an endpoint (no endpoint id has a '*').
OPERATIONAL = "*operational*"


def target_key(master_key: bytes) -> bytes:
    """A key of its own for proofs (never the master key itself)."""
    return derive_key(master_key, _LABEL)


def _message(tenant_id: str, event_id: str, endpoint_id: str) -> bytes:
    return json.dumps([tenant_id, event_id, endpoint_id], separators=(",", ":")).encode()


def prove(key: bytes, tenant_id: str, event_id: str, endpoint_id: str) -> str:
    return hmac.new(key, _message(tenant_id, event_id, endpoint_id), hashlib.sha256).hexdigest()


def verify(key: bytes, tenant_id: str, event_id: str, endpoint_id: str, proof: str | None) -> bool:
    if not proof:
        return False
    return hmac.compare_digest(proof.encode(), prove(key, tenant_id, event_id, endpoint_id).encode())
