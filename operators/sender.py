"""Builds and sends one signed request: owns the endpoint secrets, the headers and the signing.

Secrets are decrypted here only, kept in memory by (endpoint, key version), and never logged;
so are the secret values of an endpoint's custom headers (core.custom_headers), kept by
(endpoint, config version). A key or a header value that does not decrypt raises
:class:`SigningKeyUnavailable` *before* anything is sent, so the dispatcher can hold that one
endpoint visibly instead of failing the task (or sending without a header its receiver expects).

Trace context: a delivery with a trace (NewDelivery.trace) sends a ``traceparent``. With tracing
on, each attempt is a step of the trace (a child span of fan-out's when sampled, whose id the
header names, exported once the answer is in); with tracing off the delivery's traceparent is
sent as it is, and nothing else is done.
"""

from __future__ import annotations

import time

from core import custom_headers, dispatch, spans
from core.dispatch import NotSent
from core.minimise import minimise
from core.outcomes import ErrorClass, HttpResult
from core.records import EndpointConfig
from core.secrets import Keyring, SecretDecryptError, decrypt_secret
from core.settings import DispatchSettings
from core.signing import SigningMaterial, build_headers, signing_material
from operators.http_sender import HttpSender

SigningKeys = list[tuple[int, SigningMaterial]]


class SigningKeyUnavailable(Exception):
    """No request can be signed for this endpoint (its message names versions, never secrets)."""


class Sender:
    def __init__(self, settings: DispatchSettings, http: HttpSender, master_key: Keyring,
                 tracer: spans.Tracer | None = None) -> None:
        self._settings = settings
        self._tracer = tracer
        self._http = http
        self._master_key = master_key
        self._keys: dict[tuple[str, int], SigningMaterial] = {}
        # endpoint -> (config version, custom headers opened): one entry per endpoint.
        self._headers: dict[str, tuple[int, dict[str, str]]] = {}

    def keys(self, cfg: EndpointConfig, now_ms: int) -> SigningKeys:
        """The live signing keys of ``cfg``, newest first (both sides of a rotation overlap)."""
        live = sorted((k for k in cfg.signing_keys if k.not_after_ms is None or k.not_after_ms > now_ms),
                      key=lambda k: -k.version)
        if not live:
            raise SigningKeyUnavailable(f"endpoint config v{cfg.config_version} has no live signing key")
        out = []
        for k in live:
            cache_key = (cfg.endpoint_id, k.version)
            if cache_key not in self._keys:
                try:
                    secret = decrypt_secret(self._master_key, k.ciphertext_b64, tenant_id=cfg.tenant_id,
                                            endpoint_id=cfg.endpoint_id, key_version=k.version)
                    self._keys[cache_key] = signing_material(secret)  # whsec_ (HMAC) or whsk_ (ed25519)
                except (SecretDecryptError, ValueError) as exc:
                    raise SigningKeyUnavailable(
                        f"signing key v{k.version} does not decrypt ({type(exc).__name__})") from None
            out.append((k.version, self._keys[cache_key]))
        self.custom_headers(cfg)
        return out

    def custom_headers(self, cfg: EndpointConfig) -> dict[str, str]:
        """The custom headers of ``cfg``, secret values opened."""
        cached = self._headers.get(cfg.endpoint_id)
        if cached is not None and cached[0] == cfg.config_version:
            return cached[1]
        try:
            opened = custom_headers.open_all(cfg.headers, self._master_key, tenant_id=cfg.tenant_id,
                                             endpoint_id=cfg.endpoint_id)
        except (SecretDecryptError, ValueError):
            failed = next((h.name for h in cfg.headers if h.secret and not _opens(self._master_key, cfg, h)), "?")
            raise SigningKeyUnavailable(f"custom header {failed!r} of endpoint config v{cfg.config_version} "
                                        "does not decrypt") from None
        self._headers[cfg.endpoint_id] = (cfg.config_version, opened)
        return opened

    async def send(self, p: dispatch.Pending, payload: bytes, cfg: EndpointConfig,
                   keys: SigningKeys) -> dispatch.SendReport:
        e = p.delivery.event
        traceparent = p.delivery.trace
        step = None
        try:
            if traceparent is not None and self._tracer is not None:
                step = self._tracer.begin(traceparent)
                traceparent = step.forward
            # What this endpoint may see of the event; the signature covers exactly these bytes.
            payload = minimise(payload, cfg.payload_mode, cfg.payload_fields, event_type=e.event_type,
                               event_id=e.event_id, object_id=e.object_id, object_version=e.object_version,
                               occurred_at_ms=e.occurred_at_ms)
            started = int(time.time() * 1000)
            headers = build_headers(
                p.delivery_id, started // 1000, payload, keys, event_type=e.event_type,
                event_id=e.event_id, occurred_at_ms=e.occurred_at_ms, schema_version=e.schema_version,
                object_id=e.object_id, object_version=e.object_version,
                attempt=p.intent.number if p.intent is not None else None, traceparent=traceparent)
            headers["user-agent"] = self._settings.user_agent
            headers = custom_headers.with_platform_headers(self.custom_headers(cfg), headers)
        except Exception as exc:
            # Nothing has left the process: not an attempt (core.dispatch.failed_before_leaving).
            # The type only: a message could carry the payload or a secret.
            raise NotSent(f"building the request failed: {type(exc).__name__}") from exc
        sent_ns = time.time_ns() if step is not None else 0
        r = await self._http.send(cfg.url, payload, headers)
        finished = int(time.time() * 1000)
        error = ErrorClass(r.error) if r.error else None
        report = dispatch.SendReport(
            result=HttpResult(status=r.status, error=error, retry_after=getattr(r, "retry_after", None),
                              detail=r.error_detail or ""),
            started_at_ms=started, finished_at_ms=finished, url=cfg.url,
            endpoint_config_version=cfg.config_version, latency_ms=r.latency_ms,
            response_sha256=r.response_sha256 or "", response_prefix=r.response_prefix or "",
            signing_key_versions=tuple(v for v, _ in keys))
        if step is not None and step.span is not None and self._tracer is not None:
            self._tracer.sink.export(spans.attempt_span(
                step.span, step.parent_span_id, delivery=p.delivery,
                attempt=p.intent.number if p.intent is not None else 0, manual=p.sending_manual is not None,
                config_version=cfg.config_version, result=report.result, latency_ms=r.latency_ms,
                start_ns=sent_ns, end_ns=time.time_ns()))
        return report

    async def close(self) -> None:
        await self._http.close()


def _opens(keyring: Keyring, cfg: EndpointConfig, header: custom_headers.SealedHeader) -> bool:
    try:
        custom_headers.open_all([header], keyring, tenant_id=cfg.tenant_id, endpoint_id=cfg.endpoint_id)
        return True
    except (SecretDecryptError, ValueError):
        return False
