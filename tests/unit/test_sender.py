"""The Sender's part of a request: what it raises when the request cannot be built."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core import dispatch
from core.fanout import NewDelivery
from core.records import EndpointConfig, EndpointStatus, EventRecord
from core.settings import DispatchSettings
from operators import sender as sender_module
from operators.sender import Sender

T0 = 1_700_000_000_000


class RecordingHttp:
    def __init__(self) -> None:
        self.calls = 0

    async def send(self, *_: Any) -> None:
        self.calls += 1


def _broken(*_: Any, **__: Any) -> None:
    raise ValueError("secret-looking value whsec_abc")


@pytest.mark.parametrize("step", ["minimise", "build_headers"])
def test_a_request_that_cannot_be_built_raises_not_sent_and_nothing_leaves(
        monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    # Such an error escaped as itself and was recorded as a sent attempt (class internal).
    monkeypatch.setattr(sender_module, step, _broken)
    http = RecordingHttp()
    s = Sender(DispatchSettings(), http, None)  # type: ignore[arg-type]
    e = EventRecord(event_id="evt_1", tenant_id="t_1", event_type="invoice.paid", schema_version="1",
                    object_id="", object_version=0, occurred_at_ms=T0, payload=b"{}")
    p = dispatch.Pending(
        delivery=NewDelivery(delivery_id="dlv_1", event=e, endpoint_id="ep_1", tenant_id="t_1",
                             endpoint_config_version=1, created_at_ms=T0, expires_at_ms=T0 + 86_400_000),
        stage=dispatch.Stage.SENDING, intent=dispatch.Intent(1, "att_1"))
    cfg = EndpointConfig(endpoint_id="ep_1", tenant_id="t_1", url="https://example.com/", status=EndpointStatus.ACTIVE,
                         event_types=("*",), config_version=1, published_at_ms=T0, signing_keys=())
    with pytest.raises(dispatch.NotSent) as raised:
        asyncio.run(s.send(p, b"{}", cfg, []))
    assert http.calls == 0
    assert "whsec" not in str(raised.value)  # the type only, never the message
