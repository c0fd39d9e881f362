"""An endpoint, its versions and their JSON columns, to and from the rows of the ``endpoints``
and ``endpoint_config_versions`` tables (cassandra/schema/002_control_plane.cql and the later
columns). Pure: no session, so the round trips are tested without Cassandra.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from control_plane.domain import Challenge, Endpoint, EndpointSpec, EndpointVersion, StoredKey
from control_plane.store.cql import ms
from core.custom_headers import SealedHeader
from core.records import EndpointStatus

# A version's payload_policy is never null once written (011_version_delivery_settings.cql): null
# marks a row from before the column, whose payload mode and ordering key are not known.
FULL_POLICY = json.dumps({"mode": "full"})


def keys_to_json(keys: Sequence[StoredKey]) -> str:
    return json.dumps(
        [
            {
                "version": k.version,
                "ciphertext_b64": k.ciphertext_b64,
                "created_at_ms": k.created_at_ms,
                "not_after_ms": k.not_after_ms,
                **({"public_key": k.public_key} if k.public_key else {}),
            }
            for k in keys
        ]
    )


def keys_from_json(raw: str | None) -> tuple[StoredKey, ...]:
    return tuple(
        StoredKey(
            version=int(d["version"]),
            ciphertext_b64=str(d["ciphertext_b64"]),
            created_at_ms=int(d["created_at_ms"]),
            not_after_ms=None if d.get("not_after_ms") is None else int(d["not_after_ms"]),
            public_key=str(d.get("public_key") or ""),
        )
        for d in json.loads(raw or "[]")
    )


def spec_from_row(row: dict[str, Any]) -> EndpointSpec:
    policy = json.loads(row.get("payload_policy") or "{}")
    return EndpointSpec(
        url=row["url"] or "",
        description=row["description"] or "",
        event_types=tuple(row["event_types"] or ()),
        rate_limit_per_s=row["rate_limit_per_s"],
        max_in_flight=row["max_in_flight"],
        metadata=dict(row["metadata"] or {}),
        payload_mode=str(policy.get("mode") or "full"),
        payload_fields=tuple(policy.get("fields") or ()),
        ordering_key=str(row.get("ordering_key") or ""),  # null: written before ordering existed
        headers=tuple(SealedHeader.from_dict(h) for h in json.loads(row.get("headers") or "[]")),
    )


def headers_json(s: EndpointSpec) -> str | None:
    """Custom headers as one JSON column (secret values sealed); None (no column) for none."""
    return json.dumps([h.to_dict() for h in s.headers]) if s.headers else None


def payload_policy_json(s: EndpointSpec) -> str | None:
    """The payload mode and allow-list as one JSON column; None (no column) for full payloads."""
    if s.payload_mode == "full":
        return None
    return json.dumps({"mode": s.payload_mode, "fields": list(s.payload_fields)})


def endpoint_from_row(row: dict[str, Any]) -> Endpoint:
    return Endpoint(
        tenant_id=row["tenant_id"],
        endpoint_id=row["endpoint_id"],
        spec=spec_from_row(row),
        status=EndpointStatus(row["status"]),
        config_version=row["config_version"],
        published_version=row["published_version"] or 0,
        signing_keys=keys_from_json(row["signing_keys"]),
        created_at_ms=ms(row["created_at"]) or 0,
        updated_at_ms=ms(row["updated_at"]) or 0,
        changed_by=row["changed_by"] or "",
        change=row["change"] or "",
        challenge=challenge_from_json(row.get("challenge")),
    )


def version_from_row(r: dict[str, Any]) -> EndpointVersion:
    return EndpointVersion(
        tenant_id=r["tenant_id"],
        endpoint_id=r["endpoint_id"],
        config_version=r["config_version"],
        spec=spec_from_row(r),
        status=EndpointStatus(r["status"]),
        key_versions=tuple(r["key_versions"] or ()),
        changed_at_ms=ms(r["changed_at"]) or 0,
        changed_by=r["changed_by"] or "",
        change=r["change"] or "",
        delivery_settings_known=r["payload_policy"] is not None,
    )


def challenge_json(c: Challenge | None) -> str | None:
    return None if c is None else json.dumps({"event_id": c.event_id, "expires_at_ms": c.expires_at_ms})


def challenge_from_json(raw: str | None) -> Challenge | None:
    if not raw:
        return None
    d = json.loads(raw)
    return Challenge(str(d["event_id"]), int(d["expires_at_ms"]))
