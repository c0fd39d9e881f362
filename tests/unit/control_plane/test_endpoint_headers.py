"""Custom headers through the control-plane service: create, update, audit, publish, idempotency,
master-key re-encryption -- and a secret value never stored, published, audited or logged in clear."""

from __future__ import annotations

import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest

from control_plane import errors
from control_plane.domain import Endpoint, Tenant
from control_plane.endpoints.service import EndpointService
from core import custom_headers
from core.custom_headers import HeaderInput, HeaderView
from core.secrets import Keyring, sealed_with
from tests.unit.control_plane.endpoints.test_control_plane_service import (  # noqa: F401 (fixture w)
    ALICE,
    MASTER_KEY,
    NEW_MASTER,
    World,
    spec,
    w,
)

SECRET = "sk_live_do_not_leak_4711"
HEADERS = (HeaderInput("X-Tenant", "acme"), HeaderInput("Authorization", f"Bearer {SECRET}", secret=True))


def create(w: World, headers=HEADERS, request_id: str = "") -> Endpoint:  # noqa: F811
    return w.endpoints.create(ALICE, spec(), request_id, headers=headers).endpoint


RING = Keyring.single(MASTER_KEY)


def opened(w: World, e: Endpoint, ring: Keyring = RING) -> dict[str, str]:  # noqa: F811
    stored = w.store.endpoints[(e.tenant_id, e.endpoint_id)]
    return custom_headers.open_all(stored.spec.headers, ring, tenant_id=e.tenant_id, endpoint_id=e.endpoint_id)


def everything_kept(w: World) -> str:  # noqa: F811
    """Every stored row, audit row and published record, as text."""
    return " ".join([repr(w.store.endpoints), repr(w.store.versions), repr(w.store.requests),
                     *(c.to_json().decode() for c in w.publisher.configs)])


def test_headers_are_stored_published_and_audited_with_the_secret_value_sealed(
        w: World, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.DEBUG)
    e = create(w)
    assert custom_headers.views(e.spec.headers) == (HeaderView("X-Tenant", "acme", False),
                                                    HeaderView("Authorization", "", True))
    assert opened(w, e) == {"X-Tenant": "acme", "Authorization": f"Bearer {SECRET}"}
    assert w.publisher.configs[-1].headers == e.spec.headers  # the job gets them, sealed
    assert w.store.versions[("tenant-a", e.endpoint_id, 1)].spec.headers == e.spec.headers
    assert SECRET not in everything_kept(w)
    assert SECRET not in caplog.text


@pytest.mark.parametrize("headers, message", [
    ((HeaderInput("webhook-signature", "v1,x"),), "'webhook-signature' is reserved"),
    ((HeaderInput("Content-Type", "text/plain"),), "'Content-Type' is reserved"),
    ((HeaderInput("Connection", "close"),), "hop-by-hop"),
    ((HeaderInput("X-A", "a\r\nb"),), "visible ASCII"),
    ((HeaderInput("X-Key", "", secret=True),), "empty value"),
    (tuple(HeaderInput(f"X-{i}", "v") for i in range(custom_headers.MAX_HEADERS + 1)), "at most"),
])
def test_refused_headers_are_invalid_argument_before_anything_is_written(
        w: World, headers: tuple[HeaderInput, ...], message: str) -> None:  # noqa: F811
    with pytest.raises(errors.InvalidArgument, match=message):
        w.endpoints.create(ALICE, spec(), "req-h", headers=headers)
    assert not w.store.endpoints and not w.store.requests and not w.publisher.configs


def test_an_update_replaces_the_headers_as_an_audited_version_keeping_an_unsent_secret(
        w: World, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    caplog.set_level(logging.DEBUG)
    e = create(w)
    u = w.endpoints.update(ALICE, e.endpoint_id, spec(), ["headers"],
                           headers=(HeaderInput("X-Tenant", "acme-2"), HeaderInput("Authorization", "", secret=True)))
    assert (u.config_version, u.change) == (2, "update headers")
    assert opened(w, u) == {"X-Tenant": "acme-2", "Authorization": f"Bearer {SECRET}"}
    assert w.publisher.configs[-1].headers == u.spec.headers
    versions = w.endpoints.versions(ALICE, e.endpoint_id)
    assert [custom_headers.views(v.spec.headers)[0].value for v in versions] == ["acme-2", "acme"]
    # The same headers again, the secret re-sent in full: no change, no version.
    same = w.endpoints.update(ALICE, e.endpoint_id, spec(), ["headers"],
                              headers=(HeaderInput("X-Tenant", "acme-2"),
                                       HeaderInput("Authorization", f"Bearer {SECRET}", secret=True)))
    assert same.config_version == 2
    # Other updates leave the headers alone; an empty list clears them.
    described = w.endpoints.update(ALICE, e.endpoint_id, spec(description="d"), ["description"])
    assert described.spec.headers == u.spec.headers
    cleared = w.endpoints.update(ALICE, e.endpoint_id, spec(), ["headers"], headers=())
    assert cleared.spec.headers == () and w.publisher.configs[-1].headers == ()
    assert SECRET not in everything_kept(w) and SECRET not in caplog.text


def test_a_new_secret_value_replaces_the_old_one(w: World) -> None:  # noqa: F811
    e = create(w)
    u = w.endpoints.update(ALICE, e.endpoint_id, spec(), ["headers"],
                           headers=(HeaderInput("Authorization", "Bearer new", secret=True),))
    assert opened(w, u) == {"Authorization": "Bearer new"}


def test_an_update_with_a_reserved_name_changes_nothing(w: World) -> None:  # noqa: F811
    e = create(w)
    with pytest.raises(errors.InvalidArgument, match="'Host' is reserved"):
        w.endpoints.update(ALICE, e.endpoint_id, spec(), ["headers"], headers=(HeaderInput("Host", "evil"),))
    with pytest.raises(errors.InvalidArgument, match="has no secret header of that name"):
        w.endpoints.update(ALICE, e.endpoint_id, spec(), ["headers"], headers=(HeaderInput("X-New", "", secret=True),))
    assert w.store.endpoints[("tenant-a", e.endpoint_id)].config_version == 1


def test_a_retried_create_must_carry_the_same_headers(w: World) -> None:  # noqa: F811
    first = create(w, request_id="req-1")
    assert create(w, request_id="req-1").endpoint_id == first.endpoint_id
    other_secret = (HEADERS[0], replace(HEADERS[1], value="Bearer other"))
    with pytest.raises(errors.AlreadyExists):
        create(w, headers=other_secret, request_id="req-1")
    with pytest.raises(errors.AlreadyExists):
        create(w, headers=(), request_id="req-1")


def test_creates_without_headers_keep_their_idempotency_fingerprints() -> None:
    from control_plane.endpoints.service import _fingerprint

    assert _fingerprint(spec()) == _fingerprint(spec(), headers_print=())


def test_reencryption_moves_secret_header_values_too(w: World) -> None:  # noqa: F811
    w.store.tenants["tenant-a"] = Tenant("tenant-a", "a", 0)
    e = create(w)
    ring = Keyring("k2", {"k2": NEW_MASTER, "k1": MASTER_KEY})
    service = EndpointService(replace(w.endpoints._d, master_key=ring))
    dry = service.reencrypt_keys(None, dry_run=True)
    assert dry.keys_by_master_key == {"k1": 2}  # the signing key and the secret header value
    report = service.reencrypt_keys(None, dry_run=False)
    assert report.endpoints_reencrypted == 1 and report.keys_by_master_key == {"k2": 2}
    stored = w.store.endpoints[(e.tenant_id, e.endpoint_id)]
    assert sealed_with(stored.spec.headers[1].sealed) == "k2"
    assert opened(w, e, Keyring.single(NEW_MASTER, "k2"))["Authorization"] == f"Bearer {SECRET}"
    assert w.publisher.configs[-1].headers == stored.spec.headers


def test_the_stored_column_round_trips_and_null_means_none() -> None:
    from control_plane.store.endpoint_rows import headers_json, spec_from_row

    sealed = spec(headers=(custom_headers.SealedHeader("X-Tenant", value="acme"),
                           custom_headers.SealedHeader("Authorization", sealed="AQID")))
    row = {"url": sealed.url, "description": sealed.description, "event_types": list(sealed.event_types),
           "rate_limit_per_s": None, "max_in_flight": None, "metadata": dict(sealed.metadata),
           "headers": headers_json(sealed)}
    assert spec_from_row(row).headers == sealed.headers
    assert headers_json(spec()) is None
    assert spec_from_row({**row, "headers": None}).headers == ()


def test_api_answers_show_names_and_plain_values_never_a_secret_value_sealed_or_not(w: World) -> None:  # noqa: F811
    from control_plane.rpc.servicer import endpoint_pb, headers_of, version_pb
    from protogen.webhooks.v1 import control_plane_pb2 as pb

    request = pb.CreateEndpointRequest(headers=[pb.CustomHeader(name="X-Tenant", value="acme"),
                                                pb.CustomHeader(name="Authorization", value=SECRET, secret=True)])
    assert headers_of(request.headers) == (HeaderInput("X-Tenant", "acme"), HeaderInput("Authorization", SECRET, True))
    e = create(w, headers=headers_of(request.headers))
    stored = w.store.endpoints[(e.tenant_id, e.endpoint_id)]
    answers = [endpoint_pb(e, 0), *(version_pb(v) for v in w.endpoints.versions(ALICE, e.endpoint_id))]
    for answer in answers:
        assert [(h.name, h.value, h.secret) for h in answer.headers] == [("X-Tenant", "acme", False),
                                                                          ("Authorization", "", True)]
        raw = answer.SerializeToString()
        assert SECRET.encode() not in raw and stored.spec.headers[1].sealed.encode() not in raw


# -- webhookctl ----------------------------------------------------------------------------------


def test_cli_create_sends_plain_and_secret_headers_the_secret_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.unit.control_plane.cli.test_control_plane_cli import run

    monkeypatch.setenv("GATEWAY_KEY", SECRET)
    stub, shown = run(["endpoints", "create", "--url", "https://h.example.com/", "--event-type", "a.b",
                       "--header", "X-Tenant: acme", "--secret-header", "X-Other: inline-secret",
                       "--secret-header-env", "Authorization=GATEWAY_KEY"])
    request = stub.calls[0][1]
    assert [(h.name, h.value, h.secret) for h in request.headers] == [
        ("X-Tenant", "acme", False), ("X-Other", "inline-secret", True), ("Authorization", SECRET, True)]
    assert SECRET not in "".join(shown)


@pytest.mark.parametrize("argv, headers", [
    (["--header", "X-Tenant: acme-2", "--secret-header", "Authorization:"],
     [("X-Tenant", "acme-2", False), ("Authorization", "", True)]),  # keep the secret
    (["--clear-headers"], []),
])
def test_cli_update_replaces_the_headers_with_the_path_headers(argv: list[str], headers: list) -> None:
    from tests.unit.control_plane.cli.test_control_plane_cli import run

    stub, _ = run(["endpoints", "update", "ep_1", *argv])
    request = stub.calls[0][1]
    assert list(request.update_mask.paths) == ["headers"]
    assert [(h.name, h.value, h.secret) for h in request.endpoint.headers] == headers


def test_cli_update_without_header_flags_leaves_them_alone() -> None:
    from tests.unit.control_plane.cli.test_control_plane_cli import run

    stub, _ = run(["endpoints", "update", "ep_1", "--description", "d"])
    assert "headers" not in stub.calls[0][1].update_mask.paths


@pytest.mark.parametrize("argv, message", [
    (["--header", "X-Tenant"], "'X-Tenant' has no ':'"),
    (["--secret-header", "only-the-secret"], "a secret header has no ':'"),
    (["--secret-header-env", "Authorization=NOT_SET_ANYWHERE"], "NOT_SET_ANYWHERE is not set"),
    (["--secret-header-env", "Authorization"], "NAME=ENV_VAR"),
])
def test_cli_header_flags_that_cannot_be_read_are_usage_errors(argv: list[str], message: str) -> None:
    from tests.unit.control_plane.cli.test_control_plane_cli import run

    with pytest.raises(SystemExit, match=message) as info:
        run(["endpoints", "update", "ep_1", *argv])
    assert "only-the-secret" not in str(info.value)


def test_cli_shows_headers_with_secret_values_masked() -> None:
    from control_plane.cli import endpoints as endpoints_cli
    from protogen.webhooks.v1 import control_plane_pb2 as pb

    e = pb.Endpoint(headers=[pb.CustomHeader(name="X-Tenant", value="acme"),
                             pb.CustomHeader(name="Authorization", secret=True)])
    assert "headers:        X-Tenant: acme, Authorization: (secret)" in endpoints_cli.endpoint_detail(e)
    assert "headers:        none" in endpoints_cli.endpoint_detail(pb.Endpoint())


def test_cli_versions_name_each_versions_headers_secret_ones_starred(monkeypatch: pytest.MonkeyPatch) -> None:
    from protogen.webhooks.v1 import control_plane_pb2 as pb
    from tests.unit.control_plane.cli.test_control_plane_cli import RecordingStub, run

    versions = pb.ListEndpointVersionsResponse(versions=[
        pb.EndpointVersion(config_version=2, change="update headers", payload_mode="full",
                           headers=[pb.CustomHeader(name="X-Tenant", value="acme"),
                                    pb.CustomHeader(name="Authorization", secret=True)]),
        pb.EndpointVersion(config_version=1, change="create", payload_mode="full")])
    original = RecordingStub.__getattr__
    monkeypatch.setattr(RecordingStub, "__getattr__", lambda self, name: (lambda request, **_: versions)
                        if name == "ListEndpointVersions" else original(self, name))
    _, shown = run(["endpoints", "versions", "ep_1"])
    header, v2, v1 = shown[0].splitlines()
    assert "HEADERS" in header and "X-Tenant,Authorization*" in v2 and "acme" not in v2


# -- the console -----------------------------------------------------------------------------------


class _ConsoleEndpoints:
    """The service calls the console makes for headers, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def update(self, *args: object, **kwargs: object) -> object:
        from types import SimpleNamespace

        self.calls.append(("update", args, kwargs))
        return SimpleNamespace(config_version=2)


@pytest.mark.parametrize("form, headers", [
    ({"headers": "X-Tenant: acme\r\n\r\nX-Region: eu\r\n", "secret_headers": "Authorization:\r\n"},
     (HeaderInput("X-Tenant", "acme"), HeaderInput("X-Region", "eu"), HeaderInput("Authorization", "", True))),
    ({"headers": "", "secret_headers": ""}, ()),  # clears them
])
def test_the_console_form_replaces_the_headers(form: dict[str, str], headers: tuple) -> None:
    import asyncio

    from control_plane.console.sessions import Kind, SessionCodec
    from tests.unit.control_plane.console.test_console import KEY, _get, _session

    codec, endpoints = SessionCodec(KEY), _ConsoleEndpoints()
    portal = _session(kind=Kind.PORTAL)
    path = f"/s/{codec.encode(portal)}/endpoints/ep_1/headers"
    status, _, _ = asyncio.run(_get(codec, endpoints, "POST", path,  # type: ignore[arg-type]
                                    data={"csrf_token": codec.csrf_token(portal), **form}))
    assert status == 303
    [(_, args, kwargs)] = endpoints.calls
    assert args[1:] == ("ep_1", args[2], ["headers"]) and kwargs == {"headers": headers}


def test_a_console_line_without_a_colon_is_refused_without_echoing_a_secret() -> None:
    import asyncio

    from control_plane.console.sessions import Kind, SessionCodec
    from tests.unit.control_plane.console.test_console import KEY, _get, _session

    codec, endpoints = SessionCodec(KEY), _ConsoleEndpoints()
    portal = _session(kind=Kind.PORTAL)
    path = f"/s/{codec.encode(portal)}/endpoints/ep_1/headers"
    status, _, html = asyncio.run(_get(codec, endpoints, "POST", path,  # type: ignore[arg-type]
                                       data={"csrf_token": codec.csrf_token(portal), "secret_headers": SECRET}))
    assert status == 400 and SECRET not in html and "no &#39;:&#39;" in html
    assert endpoints.calls == []


def test_the_endpoint_page_shows_headers_never_a_secret_value_nor_its_ciphertext(w: World) -> None:  # noqa: F811
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from control_plane.console.app import Console, build_app
    from control_plane.console.sessions import Kind, SessionCodec
    from control_plane.domain import Page
    from control_plane.endpoints.health import EndpointHealthService
    from tests.unit.control_plane.console.test_console import KEY, T0, _Reports, _session

    e = create(w)
    sealed = e.spec.headers[1].sealed
    pages = SimpleNamespace(get=lambda principal, endpoint_id: e,
                            versions=lambda principal, endpoint_id: w.endpoints.versions(ALICE, e.endpoint_id))
    codec = SessionCodec(KEY)
    path = f"/s/{codec.encode(_session(kind=Kind.PORTAL))}/endpoints/{e.endpoint_id}"
    services = SimpleNamespace(now_ms=lambda: T0, endpoints=pages, random_bytes=lambda n: b"r" * n,
                               deliveries=SimpleNamespace(list=lambda *args: Page((), "")),
                               health=EndpointHealthService(_Reports([]), lambda: T0))

    async def get() -> tuple[int, str]:
        app = build_app(Console(services, codec, secure_cookies=False))  # type: ignore[arg-type]
        async with TestClient(TestServer(app)) as client:
            response = await client.get(path, allow_redirects=False)
            return response.status, await response.text()

    status, html = asyncio.run(get())
    assert status == 200
    assert "<code>X-Tenant</code>: <code>acme</code>" in html
    assert "<code>Authorization</code>: <em>secret (never shown)</em>" in html
    assert "X-Tenant: acme\n</textarea>" in html and "Authorization:\n</textarea>" in html
    assert SECRET not in html and sealed not in html
