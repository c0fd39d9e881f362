"""control_plane.catalog.service.FilterCheck: subscription filters against the tenant's catalog."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.catalog.service import EventTypeEntry, FilterCheck
from control_plane.errors import InvalidArgument


class Catalog:
    def __init__(self, *names: str) -> None:
        self.names = names

    def list_types(self, tenant_id: str, after_name: str, limit: int | None) -> list[EventTypeEntry]:
        return [EventTypeEntry(tenant_id, n, "", "", "active", None, "reject", 0, 0, "", 1) for n in self.names]


def check(filters: list[str], *names: str) -> None:
    FilterCheck(Catalog(*names))("acme", filters)  # type: ignore[arg-type]


@pytest.mark.parametrize("filters", [
    ["invoice.paid"], ["invoice.*"], ["*"], ["webhook.ping"], ["invoice.paid", "order.*"],
    ["webhooks.*"], ["webhooks.endpoint.*"], ["webhooks.delivery.exhausted"],  # the platform's operational events
])
def test_filters_matching_a_catalogued_type_pass(filters: list[str]) -> None:
    check(filters, "invoice.paid", "order.created")


def test_a_tenant_without_a_catalog_is_not_checked() -> None:
    check(["anything.at.all"])


@pytest.mark.parametrize(("filters", "message"), [
    (["invoice.payed"], "'invoice.payed' matches no type in the tenant's event-type catalog (close: invoice.paid"),
    (["invoices.*"], "'invoices.*' matches no type in the tenant's event-type catalog (close: invoice.*"),
    (["shipment.sent"], "'shipment.sent' matches no type in the tenant's event-type catalog (catalogued: "
                        "invoice.paid, order.created)"),
])
def test_a_filter_matching_nothing_is_refused_with_the_close_names(filters: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        check(filters, "invoice.paid", "order.created")
    assert message in info.value.message


def test_a_filter_under_the_reserved_prefix_naming_no_operational_event_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="webhooks.endpoint.failng"):
        check(["webhooks.endpoint.failng"], "invoice.paid")


def test_every_refused_filter_is_named() -> None:
    with pytest.raises(InvalidArgument) as info:
        check(["invoice.payed", "invoice.paid", "ordr.created"], "invoice.paid", "order.created")
    text: Any = info.value.message
    assert "'invoice.payed'" in text and "'ordr.created'" in text and "'invoice.paid' matches" not in text
