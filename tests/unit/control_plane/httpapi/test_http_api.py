"""The HTTP+JSON API over the real servicers and services on in-memory stores (no gRPC server, no
Cassandra): the route table read from the protos, transcoding, problem+json, Idempotency-Key,
ETag/If-Match, signed cursors and limits, tenant isolation; and one in-process aiohttp server
for what only HTTP shows (media types, headers)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from aiohttp import ClientSession

from control_plane.domain import DeliveryStatus
from control_plane.httpapi import openapi_doc
from control_plane.httpapi import problems as http_problems
from control_plane.httpapi import server as http_api
from control_plane.httpapi import transcoding as http_transcoding
from control_plane.httpapi.idempotency import InProgress, Kept, MemoryIdempotency, Replay, Reused, Run
from control_plane.httpapi.server import Answer, HttpApi, MethodRegistry
from control_plane.rpc.api import pb, rpc
from control_plane.rpc.servicer import ControlPlaneServicer
from tests.unit.control_plane.endpoints.test_control_plane_service import World, add_delivery, w  # noqa: F401 (fixture)

CONTROL_PLANE = pb.DESCRIPTOR.services_by_name["ControlPlane"]
E = "/v1/webhook-endpoints"


class _NoServer:
    """What MethodRegistry passes registrations on to: nothing serves gRPC in these tests."""

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        pass

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass


@dataclass
class Api:
    api: HttpApi
    w: World
    alice: str  # API keys
    bob: str

    def call(self, verb: str, path: str, body: Any = None, key: str | None = None, token: str | None = None,
             query: list[tuple[str, str]] | None = None, **headers: str) -> tuple[int, Any, dict[str, str]]:
        raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        sent = {"authorization": f"Bearer {token if token is not None else self.alice}"}
        if key is not None:
            sent["idempotency-key"] = key
        sent |= {k.replace("_", "-").lower(): v for k, v in headers.items()}
        answer: Answer = self.api.handle(verb, path, query or [], sent, raw)
        return answer.status, json.loads(answer.body), dict(answer.headers) | {"content-type": answer.content_type}


def make_api(w: World, idempotency: MemoryIdempotency | None = None) -> HttpApi:  # noqa: F811
    registry = MethodRegistry(_NoServer())  # type: ignore[arg-type]
    rpc.add_ControlPlaneServicer_to_server(
        ControlPlaneServicer(w.auth, w.endpoints, w.deliveries, w.ordering, w.clock), registry.as_server())
    table = http_transcoding.routes([CONTROL_PLANE])
    return HttpApi(table, registry.handlers, idempotency or MemoryIdempotency(3600, 1000, lambda: w.clock.now / 1000),
                   openapi_doc.document(table))


def _key(w: World, tenant: str) -> str:  # noqa: F811
    if w.store.get_tenant(tenant) is None:
        w.admin.create_tenant(tenant, tenant)
    return w.admin.create_api_key(tenant, "http", read_only=False).plaintext


@pytest.fixture
def api(w: World) -> Api:  # noqa: F811
    return Api(make_api(w), w, _key(w, "tenant-a"), _key(w, "tenant-b"))


NEW = {"url": "https://hooks.example.com/in", "description": "orders", "event_types": ["order.created"]}


def created(api: Api, **extra: Any) -> dict[str, Any]:
    status, body, _ = api.call("POST", E, {**NEW, **extra})
    assert status == 201, body
    return dict(body["endpoint"])


# -- the route table ---------------------------------------------------------------------------


def test_the_briefs_five_routes_are_read_from_the_protos_with_their_query_parameters() -> None:
    table = {(r.verb, r.template): r for r in http_transcoding.routes(openapi_doc.services())}
    assert {("POST", E), ("PATCH", E + "/{endpoint_id}"), ("POST", E + "/{endpoint_id}/rotate-secret"),
            ("GET", "/v1/webhook-deliveries"), ("POST", "/v1/webhook-deliveries/{delivery_id}/replay")} <= set(table)
    listing = table[("GET", "/v1/webhook-deliveries")]
    assert {"endpoint_id", "status", "cursor", "limit"} <= {http_transcoding.query_name(f)
                                                            for f in listing.query_fields()}
    assert table[("POST", E)].name == "CreateEndpoint" and table[("PATCH", E + "/{endpoint_id}")].body == "endpoint"


def test_every_route_has_its_registered_handler_or_the_api_does_not_start(w: World) -> None:  # noqa: F811
    with pytest.raises(ValueError, match="without a registered handler"):
        HttpApi(http_transcoding.routes(openapi_doc.services()), {}, MemoryIdempotency(60, 100, lambda: 0.0))


@pytest.mark.parametrize(("query", "message"), [
    ([("status", "exploded")], "status: 'exploded' is not one of pending, succeeded, failed, expired, skipped"),
    ([("limit", "ten")], "limit: 'ten' is not an integer"),
    ([("start_time", "yesterday")], "start_time: 'yesterday' is not an RFC 3339 time"),
    ([("colour", "red")], "unknown query parameter 'colour'"),
    ([("cursor", "a"), ("cursor", "b")], "cursor is given more than once"),
])
def test_query_parameters_that_do_not_fit_the_request_are_refused(query: list[tuple[str, str]],
                                                                 message: str) -> None:
    route = next(r for r in http_transcoding.routes([CONTROL_PLANE]) if r.name == "ListDeliveries")
    with pytest.raises(http_transcoding.BadRequest, match=message.replace("(", r"\(")):
        http_transcoding.build_request(route, {}, query, b"")


def test_a_query_takes_enum_values_by_short_or_full_name_and_repeats() -> None:
    route = next(r for r in http_transcoding.routes([CONTROL_PLANE]) if r.name == "ListDeliveries")
    request = http_transcoding.build_request(
        route, {}, [("status", "failed"), ("status", "DELIVERY_STATUS_EXPIRED"), ("limit", "7"),
                    ("endpoint_id", "ep_1"), ("start_time", "2026-01-01T00:00:00Z")], b"")
    assert list(request.statuses) == [pb.DELIVERY_STATUS_FAILED, pb.DELIVERY_STATUS_EXPIRED]  # type: ignore[attr-defined]
    assert (request.page_size, request.endpoint_id) == (7, "ep_1")  # type: ignore[attr-defined]
    assert request.start_time.seconds == 1767225600  # type: ignore[attr-defined]


def test_a_patch_body_is_the_named_field_and_its_keys_are_the_update_mask() -> None:
    route = next(r for r in http_transcoding.routes([CONTROL_PLANE]) if r.name == "UpdateEndpoint")
    request = http_transcoding.build_request(route, {"endpoint_id": "ep_1"}, [],
                                             b'{"url": "https://x.example.com/", "rate_limit_per_s": 3}')
    assert request.endpoint_id == "ep_1"  # type: ignore[attr-defined]
    assert list(request.update_mask.paths) == ["url", "rate_limit_per_s"]  # type: ignore[attr-defined]
    explicit = http_transcoding.build_request(route, {"endpoint_id": "ep_1"}, [("update_mask", "description")],
                                              b'{"description": ""}')
    assert list(explicit.update_mask.paths) == ["description"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("body", "message"), [
    (b'{"url": 1', "not JSON"),
    (b"[]", "must be a JSON object"),
    (b'{"eventTypes": ["a"]}', "eventTypes: no such field"),  # proto names only, as documented
    (b'{"headers": [{"name": "X-A", "colour": "red"}]}', r"headers\[0\].colour: no such field"),
    (b'{"endpoint_id": "ep_2"}', "no such field"),  # CreateEndpoint has none
])
def test_bodies_that_do_not_fit_the_message_are_refused(body: bytes, message: str) -> None:
    route = next(r for r in http_transcoding.routes([CONTROL_PLANE]) if r.name == "CreateEndpoint")
    with pytest.raises(http_transcoding.BadRequest, match=message):
        http_transcoding.build_request(route, {}, [], body)


def test_a_path_parameter_cannot_be_given_again_in_the_body() -> None:
    route = next(r for r in http_transcoding.routes([CONTROL_PLANE]) if r.name == "RotateSecret")
    with pytest.raises(http_transcoding.BadRequest, match="endpoint_id is given by the path"):
        http_transcoding.build_request(route, {"endpoint_id": "ep_1"}, [], b'{"endpoint_id": "ep_2"}')


# -- calls ------------------------------------------------------------------------------------


def test_create_get_and_list_answer_proto3_json_with_the_protos_field_names(api: Api) -> None:
    e = created(api)
    assert e["url"] == "https://hooks.example.com:443/in" and e["config_version"] == "1"
    status, got, headers = api.call("GET", f"{E}/{e['endpoint_id']}")
    assert (status, got["endpoint_id"], headers["ETag"]) == (200, e["endpoint_id"], '"1"')
    status, page, _ = api.call("GET", E, query=[("limit", "10")])
    assert status == 200 and [x["endpoint_id"] for x in page["endpoints"]] == [e["endpoint_id"]]


def test_errors_are_problem_json_with_a_type_per_class(api: Api) -> None:
    status, body, headers = api.call("GET", f"{E}/ep_nope")
    assert (status, headers["content-type"]) == (404, "application/problem+json")
    assert body == {"type": "/v1/problems/not-found", "title": "No such resource", "status": 404,
                    "detail": "endpoint ep_nope not found", "instance": f"{E}/ep_nope"}
    status, body, _ = api.call("GET", E, token="whk_forged")
    assert (status, body["type"]) == (401, "/v1/problems/unauthenticated")
    status, body, _ = api.call("POST", E, {**NEW, "url": "ftp://x"})
    assert (status, body["type"]) == (400, "/v1/problems/invalid-argument")


def test_another_tenants_ids_answer_404_like_ids_that_do_not_exist(api: Api) -> None:
    e = created(api)
    did = add_delivery(api.w, api.w.endpoints.get(_principal(api), e["endpoint_id"]), 1, DeliveryStatus.FAILED)
    for verb, path in [("GET", f"{E}/{e['endpoint_id']}"), ("PATCH", f"{E}/{e['endpoint_id']}"),
                       ("POST", f"{E}/{e['endpoint_id']}/rotate-secret"), ("DELETE", f"{E}/{e['endpoint_id']}"),
                       ("GET", f"/v1/webhook-deliveries/{did}"), ("POST", f"/v1/webhook-deliveries/{did}/replay")]:
        body = {"description": "bob's"} if verb == "PATCH" else None
        status, problem, _ = api.call(verb, path, body, token=api.bob)
        assert (status, problem["type"]) == (404, "/v1/problems/not-found"), (verb, path, problem)
    status, page, _ = api.call("GET", "/v1/webhook-deliveries", token=api.bob,
                               query=[("endpoint_id", e["endpoint_id"])])
    assert status == 404, page
    assert api.call("GET", f"{E}/{e['endpoint_id']}")[1]["description"] == "orders"  # untouched


def valid_body(rpc: str, delivery_id: str, now_ms: int) -> dict[str, Any] | None:
    """A body each route would take from the id's own tenant, so only the id decides the answer."""
    def rfc3339(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    window = {"start_time": rfc3339(now_ms - 3_600_000), "end_time": rfc3339(now_ms + 60_000)}
    return {"UpdateEndpoint": {"description": "bob"}, "RotateSecret": {}, "ReplayDelivery": {"reason": "bob"},
            "RecoverFailedDeliveries": {"reason": "bob", **window},
            "SkipOrderingHead": {"ordering_key": "k", "delivery_id": delivery_id, "reason": "bob"}}.get(rpc)


def test_another_tenants_ids_answer_404_on_every_route_that_takes_one(api: Api) -> None:
    e = created(api)
    did = add_delivery(api.w, api.w.endpoints.get(_principal(api), e["endpoint_id"]), 1, DeliveryStatus.FAILED)
    ids = {"endpoint_id": e["endpoint_id"], "delivery_id": did}
    tried = []
    for route in http_transcoding.routes([CONTROL_PLANE]):
        if route.path_fields and set(route.path_fields) <= ids.keys():
            status, body, _ = api.call(route.verb, route.template.format(**ids),
                                       valid_body(route.name, did, api.w.clock.now), token=api.bob)
            assert (status, body["type"]) == (404, "/v1/problems/not-found"), (route.template, body)
            tried.append(route.name)
    assert len(tried) == 15  # every ControlPlane route with an id in its path


def _principal(api: Api) -> Any:
    return api.w.auth.tenant([("authorization", f"Bearer {api.alice}")])


def test_no_route_is_404_and_another_verb_is_405_with_allow(api: Api) -> None:
    status, body, _ = api.call("GET", "/v1/nowhere")
    assert (status, body["type"]) == (404, "/v1/problems/no-route")
    status, body, headers = api.call("PUT", E)
    assert (status, body["type"], headers["Allow"]) == (405, "/v1/problems/method-not-allowed", "POST, GET")


@pytest.mark.parametrize("query", [[("limit", "-15605198215507")], [("limit", "99999999999999999999")]])
def test_integers_beyond_their_fields_range_are_refused_not_failed(api: Api, query: list[tuple[str, str]]) -> None:
    status, body, _ = api.call("GET", E, query=query)
    assert (status, body["type"]) == (400, "/v1/problems/invalid-argument")


def test_without_a_credential_the_answer_is_401_before_the_request_is_read(api: Api) -> None:
    answer = api.api.handle("PATCH", f"{E}/ep_1", [], {"if-match": "junk"}, b"not json")
    assert answer.status == 401 and json.loads(answer.body)["type"] == "/v1/problems/unauthenticated"
    assert dict(answer.headers)["WWW-Authenticate"] == "Bearer"


def test_requests_are_counted_by_rpc_and_status(api: Api) -> None:
    from control_plane import metrics

    def count(method: str, status: str) -> float:
        return metrics.HTTP_REQUESTS.labels(method, status)._value.get()  # type: ignore[attr-defined, no-any-return]

    before = (count("GetEndpoint", "404"), count("-", "404"))
    api.call("GET", f"{E}/ep_nope")
    api.call("GET", "/v1/nowhere")
    assert (count("GetEndpoint", "404"), count("-", "404")) == (before[0] + 1, before[1] + 1)


# -- Idempotency-Key ---------------------------------------------------------------------------


def test_the_same_key_and_body_answer_the_first_response_and_create_once(api: Api) -> None:
    first = api.call("POST", E, NEW, key="create-1")
    again = api.call("POST", E, NEW, key="create-1")
    assert first[0] == again[0] == 201 and first[1] == again[1]
    assert again[2]["Idempotency-Replayed"] == "true"
    assert len(api.call("GET", E)[1]["endpoints"]) == 1


def test_the_same_key_with_another_body_is_refused_with_422(api: Api) -> None:
    api.call("POST", E, NEW, key="create-1")
    status, body, _ = api.call("POST", E, {**NEW, "description": "other"}, key="create-1")
    assert (status, body["type"]) == (422, "/v1/problems/idempotency-key-reused")
    assert "was used for a different request" in body["detail"]
    assert len(api.call("GET", E)[1]["endpoints"]) == 1


def test_keys_are_per_credential(api: Api) -> None:
    assert api.call("POST", E, NEW, key="k")[0] == 201
    assert api.call("POST", E, NEW, key="k", token=api.bob)[0] == 201  # bob's own, not alice's answer
    assert len(api.call("GET", E, token=api.bob)[1]["endpoints"]) == 1


def test_a_key_is_the_request_id_so_a_replica_that_never_saw_it_still_creates_once(api: Api) -> None:
    first = api.call("POST", E, NEW, key="create-2")[1]
    other_replica = Api(make_api(api.w), api.w, api.alice, api.bob)  # a fresh memory
    again = other_replica.call("POST", E, NEW, key="create-2")[1]
    assert again["endpoint"]["endpoint_id"] == first["endpoint"]["endpoint_id"]
    # Another body under the key on a third replica: the service's durable request id refuses it.
    third = Api(make_api(api.w), api.w, api.alice, api.bob)
    status, body, _ = third.call("POST", E, {**NEW, "url": "https://other.example.com/"}, key="create-2")
    assert (status, body["type"]) == (409, "/v1/problems/already-exists")
    assert "already used for a different endpoint" in body["detail"]


def test_a_replay_with_a_key_is_done_once_and_audited_under_it(api: Api) -> None:
    e = created(api)
    did = add_delivery(api.w, api.w.endpoints.get(_principal(api), e["endpoint_id"]), 1, DeliveryStatus.FAILED)
    path = f"/v1/webhook-deliveries/{did}/replay"
    status, body, _ = api.call("POST", path, {"reason": "receiver fixed"}, key="replay-1")
    assert (status, body) == (200, {"delivery_id": did, "request_id": "replay-1"})
    assert api.call("POST", path, {"reason": "receiver fixed"}, key="replay-1")[1] == body
    detail = api.call("GET", f"/v1/webhook-deliveries/{did}")[1]
    assert [r["request_id"] for r in detail["replays"]] == ["replay-1"]


def test_answers_that_a_retry_may_change_are_not_kept(api: Api) -> None:
    assert api.call("POST", E, NEW, key="k1", token="whk_wrong")[0] == 401
    assert api.call("POST", E, NEW, key="k1")[0] == 201  # the 401 did not take the key


def test_a_malformed_key_is_refused(api: Api) -> None:
    status, body, _ = api.call("POST", E, NEW, key="has space")
    assert (status, body["type"]) == (400, "/v1/problems/invalid-argument")


def test_memory_keeps_answers_for_the_ttl_and_a_bounded_number() -> None:
    now = [0.0]
    memory = MemoryIdempotency(ttl_s=60, max_entries=100, now_s=lambda: now[0])
    assert memory.begin("s", "k", "p1") == Run()
    assert memory.begin("s", "k", "p1") == InProgress()
    memory.finish("s", "k", Kept(201, (), b"{}"))
    assert memory.begin("s", "k", "p1") == Replay(Kept(201, (), b"{}"))
    assert memory.begin("s", "k", "p2") == Reused()
    assert memory.begin("other-credential", "k", "p2") == Run()
    memory.abandon("other-credential", "k")
    assert memory.begin("other-credential", "k", "p3") == Run()
    now[0] = 61
    assert memory.begin("s", "k", "p2") == Run()  # forgotten after the TTL
    for i in range(150):
        memory.begin("s", f"many-{i}", "p")
    assert len(memory) == 100


# -- ETag / If-Match ---------------------------------------------------------------------------


def test_a_patch_with_a_stale_if_match_is_refused_and_changes_nothing(api: Api) -> None:
    e = created(api)
    path = f"{E}/{e['endpoint_id']}"
    status, one, headers = api.call("PATCH", path, {"description": "first"}, If_Match='"1"')
    assert (status, one["config_version"], headers["ETag"]) == (200, "2", '"2"')
    status, body, _ = api.call("PATCH", path, {"description": "lost update"}, If_Match='"1"')
    assert (status, body["type"]) == (412, "/v1/problems/stale-version")
    assert "config_version 2, not 1" in body["detail"]
    assert api.call("GET", path)[1]["description"] == "first"
    assert api.call("PATCH", path, {"description": "second"}, If_Match='W/"2"')[0] == 200
    assert api.call("PATCH", path, {"description": "any"}, If_Match="*")[0] == 200


@pytest.mark.parametrize("value", ['1', '"one"', '"1", "2"', '"-1"', '"9480894584746934169"'])
def test_a_malformed_if_match_is_refused(api: Api, value: str) -> None:
    e = created(api)
    status, body, _ = api.call("PATCH", f"{E}/{e['endpoint_id']}", {"description": "x"}, If_Match=value)
    assert (status, body["type"]) == (400, "/v1/problems/invalid-argument")


def test_if_match_on_a_route_without_versions_is_refused(api: Api) -> None:
    e = created(api)
    status, body, _ = api.call("POST", f"{E}/{e['endpoint_id']}/disable", If_Match='"1"')
    assert (status, body["type"]) == (400, "/v1/problems/invalid-argument")


# -- lists: signed cursors and limits ----------------------------------------------------------


def test_delivery_pages_follow_signed_cursors_and_refuse_forged_ones(api: Api) -> None:
    e = created(api)
    endpoint = api.w.endpoints.get(_principal(api), e["endpoint_id"])
    failed = [add_delivery(api.w, endpoint, n, DeliveryStatus.FAILED) for n in range(1, 6)]
    add_delivery(api.w, endpoint, 10, DeliveryStatus.SUCCEEDED)
    query = [("endpoint_id", e["endpoint_id"]), ("status", "failed"), ("limit", "3")]
    status, first, _ = api.call("GET", "/v1/webhook-deliveries", query=query)
    assert status == 200 and first["next_cursor"]
    second = api.call("GET", "/v1/webhook-deliveries", query=[*query, ("cursor", first["next_cursor"])])[1]
    assert [d["delivery_id"] for d in first["deliveries"] + second["deliveries"]] == failed
    assert {d["status"] for d in first["deliveries"]} == {"DELIVERY_STATUS_FAILED"}
    forged = first["next_cursor"][:-2] + ("AA" if not first["next_cursor"].endswith("AA") else "BB")
    status, body, _ = api.call("GET", "/v1/webhook-deliveries", query=[*query, ("cursor", forged)])
    assert (status, body["type"]) == (400, "/v1/problems/invalid-argument")


@pytest.mark.parametrize("limit", ["-1", "201"])
def test_a_limit_out_of_bounds_is_refused(api: Api, limit: str) -> None:
    status, body, _ = api.call("GET", "/v1/webhook-deliveries", query=[("limit", limit)])
    assert (status, body["type"]) == (400, "/v1/problems/invalid-argument")


# -- problem types -----------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "error_class", "status", "slug"), [
    (grpc.StatusCode.INVALID_ARGUMENT, "InvalidArgument", 400, "invalid-argument"),
    (grpc.StatusCode.UNAUTHENTICATED, "Unauthenticated", 401, "unauthenticated"),
    (grpc.StatusCode.PERMISSION_DENIED, "PermissionDenied", 403, "permission-denied"),
    (grpc.StatusCode.NOT_FOUND, "NotFound", 404, "not-found"),
    (grpc.StatusCode.ALREADY_EXISTS, "AlreadyExists", 409, "already-exists"),
    (grpc.StatusCode.FAILED_PRECONDITION, "FailedPrecondition", 409, "failed-precondition"),
    (grpc.StatusCode.FAILED_PRECONDITION, "StaleVersion", 412, "stale-version"),
    (grpc.StatusCode.ABORTED, "Aborted", 409, "aborted"),
    (grpc.StatusCode.UNAVAILABLE, "Unavailable", 503, "unavailable"),
    (grpc.StatusCode.INTERNAL, None, 500, "internal"),
    (grpc.StatusCode.NOT_FOUND, None, 404, "not-found"),  # a code without a class: by the code
])
def test_each_error_class_has_one_status_and_type(code: grpc.StatusCode, error_class: str | None, status: int,
                                                  slug: str) -> None:
    t = http_problems.of_rpc(code, error_class)
    assert (t.status, t.uri) == (status, f"/v1/problems/{slug}")


def test_every_problem_type_is_described_at_its_uri(api: Api) -> None:
    for t in http_problems.TYPES.values():
        status, body, _ = api.call("GET", t.uri)
        assert (status, body["status"], body["title"]) == (200, t.status, t.title)


# -- over HTTP ---------------------------------------------------------------------------------


def test_over_a_real_http_server_media_types_headers_and_the_document(api: Api) -> None:
    server = http_api.serve(api.api, "127.0.0.1", 0)

    async def run() -> None:
        base = f"http://127.0.0.1:{server.port}"
        auth = {"Authorization": f"Bearer {api.alice}"}
        async with ClientSession() as s:
            async with s.post(base + E, json=NEW, headers={**auth, "Idempotency-Key": "h1"}) as r:
                assert r.status == 201 and r.content_type == "application/json"
                endpoint = (await r.json())["endpoint"]
            async with s.get(f"{base}{E}/{endpoint['endpoint_id']}", headers=auth) as r:
                assert r.headers["ETag"] == '"1"' and r.headers["Cache-Control"] == "no-store"
            async with s.post(base + E, data=b"url=x", headers={**auth, "Content-Type": "text/plain"}) as r:
                assert (r.status, r.content_type) == (415, "application/problem+json")
            async with s.post(base + "/v1/webhook-endpoints/%0A/enable", headers=auth) as r:  # a newline in the id
                assert (r.status, r.content_type) == (400, "application/problem+json")
            async with s.post(base + E, data=b"x" * (1024 * 1024 + 1), headers=auth) as r:  # aiohttp's own refusal
                assert (r.status, r.content_type) == (413, "application/problem+json")
            async with s.get(base + "/v1/openapi.json") as r:
                assert r.status == 200 and (await r.json())["openapi"] == "3.1.0"

    try:
        asyncio.run(run())
    finally:
        server.stop()


def test_the_registry_passes_every_registration_on_so_grpc_serves_what_http_serves(w: World) -> None:  # noqa: F811
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection

    real = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    registry = MethodRegistry(real)
    server = registry.as_server()
    rpc.add_ControlPlaneServicer_to_server(
        ControlPlaneServicer(w.auth, w.endpoints, w.deliveries, w.ordering, w.clock), server)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    reflection.enable_server_reflection((CONTROL_PLANE.full_name, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        key = _key(w, "tenant-a")
        api = Api(HttpApi(http_transcoding.routes([CONTROL_PLANE]), registry.handlers,
                          MemoryIdempotency(60, 100, lambda: 0.0)), w, key, key)
        over_http = created(api)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            got = rpc.ControlPlaneStub(channel).GetEndpoint(pb.GetEndpointRequest(endpoint_id=over_http["endpoint_id"]),
                                                            metadata=[("authorization", f"Bearer {key}")], timeout=10)
            assert got.url == over_http["url"]
            assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status == 1
        assert (CONTROL_PLANE.full_name, "CreateEndpoint") in registry.handlers
    finally:
        server.stop(0)


# -- tracing ------------------------------------------------------------------------------------


def test_with_tracing_on_each_request_is_a_span_of_the_callers_trace_named_by_its_route(api: Api) -> None:
    import random

    from core.spans import Span, Tracer
    from core.trace_context import HeadSampler, parse

    class Spans:
        def __init__(self) -> None:
            self.got: list[Span] = []

        def export(self, span: Span) -> None:
            self.got.append(span)

    spans = Spans()
    api.api.tracer = Tracer(spans, HeadSampler(1.0), random.Random(1))
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    endpoint_id = created(api)["endpoint_id"]
    api.call("GET", f"{E}/{endpoint_id}", traceparent=caller)
    api.call("GET", "/v1/nowhere")
    create, get, nowhere = spans.got
    assert (create.name, create.parent_span_id) == ("POST /v1/webhook-endpoints", None)
    assert create.attributes["http.response.status_code"] == 201
    assert get.name == "GET /v1/webhook-endpoints/{endpoint_id}"
    assert get.context.trace_id == parse(caller).trace_id and get.parent_span_id == parse(caller).span_id
    assert nowhere.name == "GET" and nowhere.attributes["http.response.status_code"] == 404
