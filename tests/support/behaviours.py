"""What the recording receiver does with a request: answer, stall, misbehave.

Build behaviours with the lowercase constructors (`ok()`, `status(500)`, `retry_after(429, 3)`,
`gone()`, `redirect(301, "/new")`, `hang()`, `reset()`, `slow(0.5)`, `huge_body(10_000_000)`,
`when_header("webhook-object-version", "1", 500)`), or
parse a short script: `parse_script("500 then 429 then ok")`. A script is consumed one behaviour
per request and its last behaviour sticks.

Behaviours travel over the receiver's control API as JSON (`to_json` / `from_json`), so a test can
steer a receiver running in another process the same way it steers one in-process.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import socket
import struct
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

from aiohttp import web

_HUGE_CHUNK = 64 * 1024
# The request body, read by the receiver before the behaviour answers (the stream is consumed then).
BODY = web.RequestKey("body", bytes)


class Behaviour:
    """Base of every behaviour: a frozen dataclass that knows how to answer one request."""

    kind: ClassVar[str]

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, bytes):
                out[f.name + "_b64"] = base64.b64encode(value).decode()
            elif isinstance(value, Mapping):
                out[f.name] = dict(value)
            else:
                out[f.name] = value
        return out


@dataclass(frozen=True)
class Ok(Behaviour):
    kind: ClassVar[str] = "ok"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=200)


@dataclass(frozen=True)
class Status(Behaviour):
    code: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    kind: ClassVar[str] = "status"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=self.code, body=self.body, headers=dict(self.headers))


@dataclass(frozen=True)
class RetryAfter(Behaviour):
    code: int
    seconds: int | str  # delta-seconds, or an HTTP-date / garbage to test the parser
    kind: ClassVar[str] = "retry_after"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=self.code, headers={"Retry-After": str(self.seconds)})


@dataclass(frozen=True)
class Gone(Behaviour):
    kind: ClassVar[str] = "gone"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=410)


@dataclass(frozen=True)
class Redirect(Behaviour):
    code: int
    location: str
    kind: ClassVar[str] = "redirect"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        return web.Response(status=self.code, headers={"Location": self.location})


@dataclass(frozen=True)
class Hang(Behaviour):
    """Never answer. The handler is cancelled when the client gives up or the receiver stops."""

    kind: ClassVar[str] = "hang"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        await _wait_forever()


@dataclass(frozen=True)
class Reset(Behaviour):
    """Drop the TCP connection with an RST and no response at all."""

    kind: ClassVar[str] = "reset"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                # Linger 0 turns the close into an RST, like a crashed peer or a middlebox.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        await _wait_forever()  # the lost connection cancels this handler


@dataclass(frozen=True)
class Slow(Behaviour):
    seconds: float
    code: int = 200
    kind: ClassVar[str] = "slow"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        await asyncio.sleep(self.seconds)
        return web.Response(status=self.code)


@dataclass(frozen=True)
class HugeBody(Behaviour):
    """200 with an n-byte body, streamed chunked, for testing that the client caps what it reads."""

    n_bytes: int
    kind: ClassVar[str] = "huge_body"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/octet-stream"})
        await response.prepare(request)
        chunk = b"x" * min(_HUGE_CHUNK, self.n_bytes)
        remaining = self.n_bytes
        try:
            while remaining > 0:
                piece = chunk if remaining >= len(chunk) else chunk[:remaining]
                await response.write(piece)
                remaining -= len(piece)
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client stopped reading, which is what a bounded client should do
        return response


@dataclass(frozen=True)
class EchoChallenge(Behaviour):
    """What an endpoint that accepts ownership challenges answers: 200 echoing the challenge token
    of a `webhook.challenge` body (anything else: 200, empty)."""

    kind: ClassVar[str] = "echo_challenge"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        try:  # the receiver has read the body already (request["body"])
            token = json.loads(request.get(BODY) or b"{}").get("challenge")
        except (ValueError, AttributeError):
            token = None
        return web.json_response({"challenge": token} if token else {})


@dataclass(frozen=True)
class WhenHeader(Behaviour):
    """Answer ``code`` to requests whose ``header`` equals ``value``, 200 to the others: one
    failing delivery among many on the same path (an ordering key's head, say)."""

    header: str
    value: str
    code: int
    retry_after: int = 0  # seconds, sent with ``code`` when > 0
    kind: ClassVar[str] = "when_header"

    async def respond(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.headers.get(self.header) != self.value:
            return web.Response(status=200)
        return web.Response(status=self.code,
                            headers={"Retry-After": str(self.retry_after)} if self.retry_after else None)


async def _wait_forever() -> NoReturn:
    while True:
        await asyncio.sleep(3600)


def ok() -> Ok:
    return Ok()


def status(code: int, body: bytes = b"", headers: Mapping[str, str] | None = None) -> Status:
    return Status(code, body, dict(headers or {}))


def retry_after(code: int, seconds: int | str) -> RetryAfter:
    return RetryAfter(code, seconds)


def gone() -> Gone:
    return Gone()


def redirect(code: int, location: str) -> Redirect:
    return Redirect(code, location)


def hang() -> Hang:
    return Hang()


def reset() -> Reset:
    return Reset()


def slow(seconds: float, code: int = 200) -> Slow:
    return Slow(seconds, code)


def huge_body(n_bytes: int) -> HugeBody:
    return HugeBody(n_bytes)


def when_header(header: str, value: str, code: int, retry_after: int = 0) -> WhenHeader:
    return WhenHeader(header, value, code, retry_after)


_KINDS: dict[str, type[Behaviour]] = {
    cls.kind: cls for cls in (Ok, Status, RetryAfter, Gone, Redirect, Hang, Reset, Slow, HugeBody, EchoChallenge,
                                  WhenHeader)
}


def from_json(data: Mapping[str, Any]) -> Behaviour:
    """Inverse of `Behaviour.to_json`."""
    fields = dict(data)
    kind = fields.pop("kind", None)
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown behaviour kind {kind!r}; known: {sorted(_KINDS)}")
    for key in [k for k in fields if k.endswith("_b64")]:
        fields[key.removesuffix("_b64")] = base64.b64decode(fields.pop(key))
    return cls(**fields)


def parse_script(text: str) -> list[Behaviour]:
    """Parse "500 then retry_after 429 3 then ok" into behaviours.

    Each step is a status code alone, or a constructor name followed by its positional
    arguments: ok, status CODE, retry_after CODE SECONDS, gone, redirect CODE LOCATION, hang,
    reset, slow SECONDS [CODE], huge_body N_BYTES.
    """
    steps: list[list[str]] = [[]]
    for word in text.split():
        if word == "then":
            steps.append([])
        else:
            steps[-1].append(word)
    return [_build_step(words, text) for words in steps]


def _build_step(words: list[str], text: str) -> Behaviour:
    if not words:
        raise ValueError(f"empty step in behaviour script {text!r}")
    if words[0].isdigit():
        words = ["status", *words]
    cls = _KINDS.get(words[0])
    if cls is None:
        raise ValueError(f"unknown behaviour {words[0]!r} in {text!r}; known: {sorted(_KINDS)}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if len(words) - 1 > len(fields):
        raise ValueError(f"too many arguments for {words[0]!r} in {text!r}")
    args: list[int | float | str] = []
    for f, word in zip(fields, words[1:], strict=False):
        value = _number_or_text(word)
        if hints[f.name] is float and isinstance(value, int):
            value = float(value)
        # Bytes and header maps cannot be written in a script; use the constructors or JSON.
        if not isinstance(hints[f.name], type | types.UnionType) or not isinstance(value, hints[f.name]):
            raise ValueError(f"bad {f.name} {word!r} for {words[0]!r} in {text!r}")
        args.append(value)
    try:
        return cls(*args)
    except TypeError as e:
        raise ValueError(f"bad arguments for {words[0]!r} in {text!r}: {e}") from None


def _number_or_text(word: str) -> int | float | str:
    for convert in (int, float):
        try:
            return convert(word)
        except ValueError:
            pass
    return word
