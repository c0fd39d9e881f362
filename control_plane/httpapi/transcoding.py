"""HTTP+JSON <-> protobuf for the HTTP API: routes read from the protos' ``google.api.http`` options.

The protos stay the single source of the API: each RPC that has an HTTP form says so in its
``option (google.api.http)`` (verb, path template, which request field is the body), and this
module turns those options into routes and converts requests and responses. Nothing here knows
a method by name; control_plane.httpapi.server dispatches a route to the same servicer gRPC calls.

A request message is filled from three places, in this order, each a field at most once:

* the path: ``{endpoint_id}`` sets the string field of that name;
* the body: ``body: "*"`` is the whole message as proto3 JSON minus the path's fields;
  ``body: "endpoint"`` is that one message field (a PATCH: when the request has an
  ``update_mask`` the query does not give, the mask is the body's top-level keys);
* the query: any other scalar, enum, timestamp or field-mask field, by its proto name or its
  JSON name (``?limit=`` is ``page_size [json_name = "limit"]``); repeated ones repeat
  (``?status=failed&status=expired``); enum values by full name or without their prefix, any case.

Responses are proto3 JSON with the proto's field names (``endpoint_id``) and every field present.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

from protogen.google.api import annotations_pb2

_VERBS = ("get", "put", "post", "delete", "patch")
# The request field the If-Match header sets (the ETag of an endpoint is its config_version).
IF_MATCH_FIELD = "expected_config_version"
ETAG_FORM = re.compile(r'^(?:W/)?"([0-9]{1,18})"$')
_PARAM = re.compile(r"\{(\w+)\}")
_TIMESTAMP = "google.protobuf.Timestamp"
_FIELD_MASK = "google.protobuf.FieldMask"
_INTEGERS = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
             FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
             FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
             FieldDescriptor.TYPE_SFIXED64}
_FLOATS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


class BadRequest(ValueError):
    """The HTTP request cannot become the RPC's request message; the message says why."""


@dataclass(frozen=True)
class Route:
    verb: str  # upper case
    template: str  # /v1/webhook-endpoints/{endpoint_id}
    method: MethodDescriptor
    body: str  # "" (none), "*" (the whole message) or a field name
    path_fields: tuple[str, ...]
    pattern: re.Pattern[str]

    @property
    def service(self) -> str:
        return str(self.method.containing_service.full_name)

    @property
    def name(self) -> str:
        return str(self.method.name)

    @property
    def request(self) -> Descriptor:
        return self.method.input_type

    @property
    def response(self) -> Descriptor:
        return self.method.output_type

    @property
    def streams(self) -> bool:
        """A server-streaming RPC: HTTP answers its last message (a bulk operation's final count)."""
        return bool(self.method.server_streaming)

    def query_fields(self) -> list[FieldDescriptor]:
        """The request fields the query string may set: not bound by the path or the body."""
        if self.body == "*":
            return []
        return [f for f in self.request.fields if f.name not in self.path_fields and f.name != self.body
                and f.name != IF_MATCH_FIELD and _query_type(f)]

    def takes_if_match(self) -> bool:
        return IF_MATCH_FIELD in self.request.fields_by_name

    def body_fields(self) -> list[FieldDescriptor]:
        if self.body == "*":
            return [f for f in self.request.fields if f.name not in self.path_fields]
        return []


def _http_rule(method: MethodDescriptor) -> Any | None:
    options = method.GetOptions()
    if not options.HasExtension(annotations_pb2.http):
        return None
    return options.Extensions[annotations_pb2.http]


def routes(services: Iterable[ServiceDescriptor]) -> tuple[Route, ...]:
    """Every annotated method of ``services`` as a route, in declaration order."""
    found: list[Route] = []
    for service in services:
        for method in service.methods:
            rule = _http_rule(method)
            if rule is None:
                continue
            verb = rule.WhichOneof("pattern")
            if verb not in _VERBS:
                raise ValueError(f"{method.full_name}: only {', '.join(_VERBS)} rules are supported")
            template = getattr(rule, verb)
            params = tuple(_PARAM.findall(template))
            for name in params:
                field = method.input_type.fields_by_name.get(name)
                if field is None or field.type != FieldDescriptor.TYPE_STRING:
                    raise ValueError(f"{method.full_name}: path parameter {name} is not a string field")
            if rule.body not in ("", "*") and rule.body not in method.input_type.fields_by_name:
                raise ValueError(f"{method.full_name}: body {rule.body} is not a field")
            found.append(Route(verb.upper(), template, method, rule.body, params, _regex(template)))
    _check_unique(found)
    return tuple(found)


def _regex(template: str) -> re.Pattern[str]:
    """``/v1/x/{id}/y`` -> ``^/v1/x/(?P<id>[^/]+)/y$``: a parameter is one non-empty segment."""
    parts = _PARAM.split(template)  # literal, name, literal, name, ..., literal
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
    return re.compile(f"^{regex}$")


def _check_unique(found: Sequence[Route]) -> None:
    seen: dict[tuple[str, str], str] = {}
    for r in found:
        key = (r.verb, _PARAM.sub("{}", r.template))
        if key in seen:
            raise ValueError(f"{r.method.full_name} and {seen[key]} share {r.verb} {r.template}")
        seen[key] = str(r.method.full_name)


def match(table: Sequence[Route], verb: str, path: str) -> tuple[Route | None, dict[str, str], list[str]]:
    """The route of ``verb path`` and its path parameters; else None and the verbs the path has
    (empty: no such path, 404; some: 405 with Allow)."""
    allowed: list[str] = []
    for route in table:
        m = route.pattern.match(path)
        if m is None:
            continue
        if route.verb == verb:
            return route, m.groupdict(), []
        allowed.append(route.verb)
    return None, {}, allowed


# -- requests ----------------------------------------------------------------------------------


def _query_type(field: FieldDescriptor) -> bool:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return field.message_type.full_name in (_TIMESTAMP, _FIELD_MASK) and not _is_repeated(field)
    return field.type != FieldDescriptor.TYPE_BYTES


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def enum_value(field: FieldDescriptor, text: str) -> int:
    """An enum value by full name (DELIVERY_STATUS_FAILED) or without its prefix (failed)."""
    wanted = text.strip().upper()
    values = field.enum_type.values
    prefix = _enum_prefix([v.name for v in values])
    for v in values:
        if v.number != 0 and wanted in (v.name, v.name[len(prefix):]):
            return int(v.number)
    names = ", ".join(v.name[len(prefix):].lower() for v in values if v.number != 0)
    raise BadRequest(f"{query_name(field)}: {text!r} is not one of {names}")


def _enum_prefix(names: Sequence[str]) -> str:
    unspecified = next((n for n in names if n.endswith("_UNSPECIFIED")), "")
    return unspecified[: -len("UNSPECIFIED")] if unspecified else ""


def short_enum_names(field: FieldDescriptor) -> list[str]:
    names = [v.name for v in field.enum_type.values]
    prefix = _enum_prefix(names)
    return [n[len(prefix):].lower() for n, v in zip(names, field.enum_type.values, strict=True) if v.number != 0]


def integer_range(field: FieldDescriptor) -> tuple[int, int]:
    """The values an integer field holds (its wire type's)."""
    bits = 64 if field.cpp_type in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64) else 32
    if field.cpp_type in (FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64):
        return 0, 2**bits - 1
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def _scalar(field: FieldDescriptor, text: str) -> Any:
    name = query_name(field)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_value(field, text)
    if field.type in _INTEGERS:
        if not re.fullmatch(r"-?[0-9]{1,20}", text):
            raise BadRequest(f"{name}: {text!r} is not an integer")
        low, high = integer_range(field)
        if not low <= int(text) <= high:
            raise BadRequest(f"{name}: {text} is out of range")
        return int(text)
    if field.type in _FLOATS:
        try:
            return float(text)
        except ValueError:
            raise BadRequest(f"{name}: {text!r} is not a number") from None
    if field.type == FieldDescriptor.TYPE_BOOL:
        if text not in ("true", "false"):
            raise BadRequest(f"{name}: {text!r} is not true or false")
        return text == "true"
    return text


def query_name(field: FieldDescriptor) -> str:
    """The documented query name: the proto's (endpoint_id), or its JSON name when the proto
    sets one (``page_size [json_name = "limit"]`` -> limit). Both are accepted."""
    camel = re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), field.name)
    return str(field.json_name) if field.json_name != camel else str(field.name)


def _by_query_name(route: Route) -> dict[str, FieldDescriptor]:
    names: dict[str, FieldDescriptor] = {}
    for f in route.query_fields():
        names[f.name] = f
        names[f.json_name] = f
    return names


def _set_query(message: Message, route: Route, query: Sequence[tuple[str, str]]) -> set[str]:
    fields = _by_query_name(route)
    seen: set[str] = set()
    for key, value in query:
        field = fields.get(key)
        if field is None:
            accepted = sorted({query_name(f) for f in route.query_fields()})
            raise BadRequest(f"unknown query parameter {key!r}" +
                             (f"; accepted: {', '.join(accepted)}" if accepted else "; this route takes none"))
        if field.name in seen and not _is_repeated(field):
            raise BadRequest(f"{query_name(field)} is given more than once")
        seen.add(field.name)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            target = getattr(message, field.name)
            try:
                target.FromJsonString(value)
            except ValueError:
                what = "an RFC 3339 time" if field.message_type.full_name == _TIMESTAMP else "comma-separated paths"
                raise BadRequest(f"{query_name(field)}: {value!r} is not {what}") from None
        elif _is_repeated(field):
            getattr(message, field.name).append(_scalar(field, value))
        else:
            setattr(message, field.name, _scalar(field, value))
    return seen


def _json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest("the body must be a JSON object")
    return value


def _known_keys(value: Any, descriptor: Descriptor, where: str) -> None:
    """Only the proto's field names (as the document names them): the JSON names proto3 JSON
    would also take are refused, so the document's ``additionalProperties: false`` is the truth."""
    if not isinstance(value, dict):
        return
    fields = descriptor.fields_by_name
    for key, item in value.items():
        f = fields.get(key)
        if f is None:
            raise BadRequest(f"{where}{key}: no such field; accepted: {', '.join(sorted(fields))}")
        if f.type != FieldDescriptor.TYPE_MESSAGE or f.message_type.full_name in (_TIMESTAMP, _FIELD_MASK):
            continue
        if f.message_type.GetOptions().map_entry:
            value_field = f.message_type.fields_by_name["value"]
            if value_field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(item, dict):
                for k, v in item.items():
                    _known_keys(v, value_field.message_type, f"{where}{key}.{k}.")
        elif f.label == FieldDescriptor.LABEL_REPEATED and isinstance(item, list):
            for i, element in enumerate(item):
                _known_keys(element, f.message_type, f"{where}{key}[{i}].")
        else:
            _known_keys(item, f.message_type, f"{where}{key}.")


def _parse(value: dict[str, Any], message: Message) -> None:
    _known_keys(value, message.DESCRIPTOR, "")
    try:
        json_format.ParseDict(value, message)
    except json_format.ParseError as exc:
        raise BadRequest(str(exc)) from None


def _proto_names(descriptor: Descriptor, keys: Iterable[str]) -> list[str]:
    by_json = {f.json_name: f.name for f in descriptor.fields} | {f.name: f.name for f in descriptor.fields}
    return [by_json.get(k, k) for k in keys]


def build_request(route: Route, path_params: dict[str, str], query: Sequence[tuple[str, str]],
                  body: bytes) -> Message:
    """The request message of ``route``; BadRequest if the HTTP request does not fit it."""
    message = message_factory.GetMessageClass(route.request)()
    if route.body == "*":
        data = _json_object(body)
        bound = [k for k in data if k in path_params]
        if bound:
            raise BadRequest(f"{', '.join(bound)} is given by the path, not the body")
        _parse(data, message)
    elif route.body:
        data = _json_object(body)
        _parse(data, getattr(message, route.body))
    elif body.strip():
        raise BadRequest(f"{route.verb} {route.template} takes no body")
    given = _set_query(message, route, query)
    if route.body not in ("", "*"):
        mask = route.request.fields_by_name.get("update_mask")
        if mask is not None and mask.message_type.full_name == _FIELD_MASK and "update_mask" not in given:
            inner = route.request.fields_by_name[route.body].message_type
            message.update_mask.paths.extend(_proto_names(inner, data.keys()))  # type: ignore[attr-defined]
    for name, value in path_params.items():
        setattr(message, name, value)
    return message


# -- responses ---------------------------------------------------------------------------------


def to_json(message: Message) -> dict[str, Any]:
    """Proto3 JSON with proto field names and every field present (int64 as a string)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
