"""W3C Trace Context's ``traceparent`` (https://www.w3.org/TR/trace-context/), pure: parsing,
formatting, new ids from an injected random source, and the head-sampling decision.

::

    traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
                 ^^ ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^ ^^^^^^^^^^^^^^^^ ^^
             version  trace-id (16 bytes)         parent-id (8 bytes) trace-flags (bit 0: sampled)

Parsing follows the specification's rules (section "Versioning of traceparent"):

* spaces and tabs around the value are ignored (a header value's optional whitespace);
* the version is two lowercase hex digits followed by ``-``; ``ff`` is forbidden;
* version ``00`` is exactly ``version-trace_id-parent_id-flags``, 55 characters; anything after
  the flags makes it invalid;
* a higher version is read as far as this one knows: at least 55 characters, the same three
  fields, the flags followed by the end or by ``-``; whatever follows is not read. Passed on, it
  is written as version ``00``, the highest this code knows;
* every id and the flags are lowercase hex; an all-zero trace-id or parent-id is invalid;
* only the ``sampled`` flag is read; the others are written as zero.

An invalid value is ignored -- the specification says a vendor MUST ignore it -- never held
against the event or the request that carried it (:func:`parse_or_none`).

Sampling is OpenTelemetry's ParentBased(TraceIdRatioBased): a context that has a parent keeps the
parent's decision; a new trace is sampled when the low 64 bits of its trace id fall below
``ratio * 2**64``, so every process that looks at the same trace id decides alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

HEADER = "traceparent"
VERSION = "00"
LENGTH = 55  # a version 00 value
# Longest value read at all: a future version may be longer than 55 characters, but a header of
# kilobytes is refused before it is looked at.
MAX_LENGTH = 512
SAMPLED_FLAG = 0x01
MASK_64 = (1 << 64) - 1
_HEX = frozenset("0123456789abcdef")


class InvalidTraceparent(ValueError):
    """Why a traceparent value cannot be used; the caller ignores the value and goes on."""


class RandomBits(Protocol):
    """The random source ids come from (``random.Random`` in production, a seeded one in tests)."""

    def getrandbits(self, k: int, /) -> int: ...


@dataclass(frozen=True, slots=True)
class TraceContext:
    """One position in a trace: the trace, the span at this position, and the sampled decision."""

    trace_id: int  # 128 bits, never 0
    span_id: int  # 64 bits, never 0 (a traceparent's parent-id)
    sampled: bool

    def __post_init__(self) -> None:
        if not 0 < self.trace_id <= (1 << 128) - 1:
            raise ValueError("trace_id must be a non-zero 128-bit integer")
        if not 0 < self.span_id <= MASK_64:
            raise ValueError("span_id must be a non-zero 64-bit integer")

    @property
    def traceparent(self) -> str:
        """The ``traceparent`` value naming this span as the parent of what follows."""
        return f"{VERSION}-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @property
    def span_id_hex(self) -> str:
        return f"{self.span_id:016x}"


def _hex(text: str, what: str) -> int:
    if not text or not _HEX.issuperset(text):
        raise InvalidTraceparent(f"{what} is not lowercase hex")
    return int(text, 16)


def parse(value: str) -> TraceContext:
    """The context a ``traceparent`` value carries; :class:`InvalidTraceparent` says why not."""
    if not isinstance(value, str):
        raise InvalidTraceparent(f"a traceparent is text, not {type(value).__name__}")
    if len(value) > MAX_LENGTH:
        raise InvalidTraceparent(f"longer than {MAX_LENGTH} characters")
    v = value.strip(" \t")
    if len(v) < 3 or v[2] != "-" or not _HEX.issuperset(v[:2]):
        raise InvalidTraceparent("the version is not two lowercase hex digits followed by '-'")
    version = v[:2]
    if version == "ff":
        raise InvalidTraceparent("version ff is forbidden")
    if version == VERSION:
        if len(v) != LENGTH:
            raise InvalidTraceparent(f"a version 00 traceparent is {LENGTH} characters, not {len(v)}")
    elif len(v) < LENGTH:
        raise InvalidTraceparent(f"version {version}: shorter than {LENGTH} characters")
    elif len(v) > LENGTH and v[LENGTH] != "-":
        raise InvalidTraceparent(f"version {version}: the flags are followed by neither the end nor '-'")
    if v[35] != "-" or v[52] != "-":
        raise InvalidTraceparent("the trace-id, parent-id and flags are not separated by '-'")
    trace_id = _hex(v[3:35], "the trace-id")
    span_id = _hex(v[36:52], "the parent-id")
    flags = _hex(v[53:55], "the trace-flags")
    if trace_id == 0:
        raise InvalidTraceparent("the trace-id is all zeroes")
    if span_id == 0:
        raise InvalidTraceparent("the parent-id is all zeroes")
    return TraceContext(trace_id, span_id, bool(flags & SAMPLED_FLAG))


def parse_or_none(value: object) -> TraceContext | None:
    """The context ``value`` carries, or None when it is absent or invalid (ignored, as the
    specification asks: an invalid traceparent only means no trace to continue)."""
    if value is None or not isinstance(value, str):
        return None
    try:
        return parse(value)
    except InvalidTraceparent:
        return None


def normalize(value: object) -> str | None:
    """``value`` as this code writes it (version 00, only the sampled flag), or None when absent
    or invalid. What the platform stores and passes on is always this form: a producer's text
    never reaches a header as it was given."""
    ctx = parse_or_none(value)
    return ctx.traceparent if ctx is not None else None


def new_trace_id(rng: RandomBits) -> int:
    while True:
        trace_id = rng.getrandbits(128)
        if trace_id:
            return trace_id


def new_span_id(rng: RandomBits) -> int:
    while True:
        span_id = rng.getrandbits(64)
        if span_id:
            return span_id


def child(parent: TraceContext, rng: RandomBits) -> TraceContext:
    """A new span in ``parent``'s trace, with its decision."""
    return TraceContext(parent.trace_id, new_span_id(rng), parent.sampled)


@dataclass(frozen=True, slots=True)
class HeadSampler:
    """ParentBased(TraceIdRatioBased(``ratio``)): where a trace starts, the ratio decides from the
    trace id; everywhere else the parent's sampled flag does."""

    ratio: float
    bound: int = field(init=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"a sampling ratio is within 0..1, got {self.ratio}")
        # OpenTelemetry's TraceIdRatioBased.get_bound_for_rate.
        object.__setattr__(self, "bound", round(self.ratio * (MASK_64 + 1)))

    def samples(self, trace_id: int) -> bool:
        """The ratio's decision for a new trace with this id."""
        return (trace_id & MASK_64) < self.bound

    def root(self, rng: RandomBits) -> TraceContext:
        """The first span of a new trace, sampled or not by the ratio."""
        trace_id = new_trace_id(rng)
        return TraceContext(trace_id, new_span_id(rng), self.samples(trace_id))

    def start(self, parent: TraceContext | None, rng: RandomBits) -> TraceContext:
        """The context of a span that starts here: a child of ``parent`` with its decision, or the
        root of a new trace when there is no parent."""
        return self.root(rng) if parent is None else child(parent, rng)


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a trace (the outbox write, fan-out, an attempt): the span it records, if any,
    and the traceparent it passes on."""

    span: TraceContext | None  # this step's span, when it is recorded (sampled)
    parent_span_id: int | None  # the span it is a child of; None for the root of a trace
    forward: str | None  # what the next hop is given (None: nothing)


def begin(incoming: str | None, sampler: HeadSampler, rng: RandomBits) -> Step:
    """Take part in the trace ``incoming`` names, or start one.

    * sampled parent: a child span, recorded, and its traceparent passed on;
    * parent not sampled: nothing recorded and no new id: the parent's value is passed on
      unchanged, so every later hop keeps the decision already made;
    * no (valid) parent: a new trace decided by the ratio; recorded when sampled, and passed on
      either way, so the decision travels with it and nothing downstream samples it again.
    """
    parent = parse_or_none(incoming)
    if parent is not None and not parent.sampled:
        return Step(None, None, parent.traceparent)
    ctx = sampler.start(parent, rng)
    if not ctx.sampled:
        return Step(None, None, ctx.traceparent)
    return Step(ctx, parent.span_id if parent is not None else None, ctx.traceparent)
