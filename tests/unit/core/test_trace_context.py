"""core/trace_context.py: the W3C traceparent's parsing and writing (cases after the W3C test
suite's), ids from an injected random source, and ParentBased(TraceIdRatioBased) sampling."""

from __future__ import annotations

import random

import pytest

from core.trace_context import (
    MASK_64,
    HeadSampler,
    InvalidTraceparent,
    TraceContext,
    begin,
    child,
    new_span_id,
    new_trace_id,
    normalize,
    parse,
    parse_or_none,
)

TRACE = "12345678901234567890123456789012"
PARENT = "1234567890123456"
V00 = f"00-{TRACE}-{PARENT}-01"

VALID = [
    # value                                                   trace  parent  sampled
    (V00, TRACE, PARENT, True),
    (f"00-{TRACE}-{PARENT}-00", TRACE, PARENT, False),
    (f"00-{TRACE}-{PARENT}-09", TRACE, PARENT, True),  # unknown flags: only bit 0 is read
    (f"00-{TRACE}-{PARENT}-02", TRACE, PARENT, False),
    (f" 00-{TRACE}-{PARENT}-01", TRACE, PARENT, True),  # optional whitespace around a header value
    (f"\t00-{TRACE}-{PARENT}-01 \t", TRACE, PARENT, True),
    (f"cc-{TRACE}-{PARENT}-01", TRACE, PARENT, True),  # a future version: read as far as 00 goes
    (f"cc-{TRACE}-{PARENT}-01-what-the-future-will-be-like", TRACE, PARENT, True),
    (f"fe-{TRACE}-{PARENT}-00-x", TRACE, PARENT, False),
]


@pytest.mark.parametrize(("value", "trace_id", "parent_id", "sampled"), VALID)
def test_valid_traceparents(value: str, trace_id: str, parent_id: str, sampled: bool) -> None:
    ctx = parse(value)
    assert (ctx.trace_id_hex, ctx.span_id_hex, ctx.sampled) == (trace_id, parent_id, sampled)
    # Written back as version 00 with the sampled flag alone, whatever came in.
    assert normalize(value) == f"00-{trace_id}-{parent_id}-{'01' if sampled else '00'}"


INVALID = [
    # value                                                              why
    ("", "version"),
    ("00", "version"),
    (f"00-{TRACE}-{PARENT}-01.", "55 characters"),  # version 00: nothing after the flags
    (f"00-{TRACE}-{PARENT}-01-what-the-future-will-be-like", "55 characters"),
    (f"cc-{TRACE}-{PARENT}-01.what-the-future-will-be-like", "neither the end nor"),
    (f"ff-{TRACE}-{PARENT}-01", "ff is forbidden"),
    (f".0-{TRACE}-{PARENT}-01", "version"),
    (f"0.-{TRACE}-{PARENT}-01", "version"),
    (f"000-{TRACE}-{PARENT}-01", "version"),
    (f"0-{TRACE}-{PARENT}-01", "version"),
    (f"0A-{TRACE}-{PARENT}-01", "version"),  # upper case hex
    (f"00-{'0' * 32}-{PARENT}-01", "trace-id is all zeroes"),
    (f"00-.{TRACE[1:]}-{PARENT}-01", "trace-id is not lowercase hex"),
    (f"00-{TRACE[:-1]}.-{PARENT}-01", "trace-id is not lowercase hex"),
    (f"00-{TRACE.upper()[:-1]}A-{PARENT}-01", "trace-id"),
    (f"00-{TRACE}3-{PARENT}-01", "55 characters"),  # trace-id too long
    (f"00-{TRACE[:-1]}-{PARENT}-01", "55 characters"),  # too short
    (f"00-{TRACE}-{'0' * 16}-01", "parent-id is all zeroes"),
    (f"00-{TRACE}-.{PARENT[1:]}-01", "parent-id is not lowercase hex"),
    (f"00-{TRACE}-{PARENT}7-01", "55 characters"),
    (f"00-{TRACE}-{PARENT[:-1]}-01", "55 characters"),
    (f"00-{TRACE}-{PARENT}-.0", "trace-flags"),
    (f"00-{TRACE}-{PARENT}-0.", "trace-flags"),
    (f"00-{TRACE}-{PARENT}-001", "55 characters"),
    (f"00-{TRACE}-{PARENT}-1", "55 characters"),
    (f"00_{TRACE}_{PARENT}_01", "version"),
    (f"00-{TRACE}_{PARENT}-01", "separated"),
    (f"cc-{TRACE}-{PARENT}", "shorter than 55"),
    ("00-" + "a" * 600, "longer than 512"),
]


@pytest.mark.parametrize(("value", "why"), INVALID)
def test_invalid_traceparents_are_refused_with_the_reason_and_ignored_by_the_tolerant_readers(
        value: str, why: str) -> None:
    with pytest.raises(InvalidTraceparent, match=why):
        parse(value)
    assert parse_or_none(value) is None
    assert normalize(value) is None


@pytest.mark.parametrize("value", [None, 42, b"00-" + TRACE.encode() + b"-" + PARENT.encode() + b"-01"])
def test_what_is_not_text_is_no_traceparent(value: object) -> None:
    assert parse_or_none(value) is None


def test_a_context_writes_itself_as_version_00() -> None:
    ctx = TraceContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True)
    assert ctx.traceparent == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse(ctx.traceparent) == ctx
    assert TraceContext(1, 1, False).traceparent == f"00-{1:032x}-{1:016x}-00"


@pytest.mark.parametrize(("trace_id", "span_id"), [(0, 1), (1, 0), (1 << 128, 1), (1, 1 << 64), (-1, 1)])
def test_a_context_refuses_ids_the_format_cannot_carry(trace_id: int, span_id: int) -> None:
    with pytest.raises(ValueError):
        TraceContext(trace_id, span_id, True)


class Bits:
    """A random source that answers the values it was given, in order."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)
        self.asked: list[int] = []

    def getrandbits(self, k: int) -> int:
        self.asked.append(k)
        return self.values.pop(0)


def test_ids_come_from_the_injected_source_and_are_never_zero() -> None:
    bits = Bits(0, 7, 0, 0, 9)
    assert new_trace_id(bits) == 7
    assert new_span_id(bits) == 9
    assert bits.asked == [128, 128, 64, 64, 64]


def test_a_seeded_source_gives_the_same_ids_again() -> None:
    a, b = random.Random(3), random.Random(3)
    assert HeadSampler(1.0).root(a) == HeadSampler(1.0).root(b)


def test_a_child_keeps_the_trace_and_the_decision_with_a_span_id_of_its_own() -> None:
    parent = parse(V00)
    kid = child(parent, Bits(5))
    assert (kid.trace_id, kid.span_id, kid.sampled) == (parent.trace_id, 5, True)
    assert child(parse(f"00-{TRACE}-{PARENT}-00"), Bits(5)).sampled is False


# The ratio's bound is OpenTelemetry's TraceIdRatioBased: round(ratio * 2**64), compared with the
# trace id's low 64 bits, so each process deciding on the same trace id decides alike.
SAMPLING = [
    # ratio  low 64 bits of the trace id        sampled
    (0.0, 0, False),
    (1.0, MASK_64, True),
    (0.5, (1 << 63) - 1, True),
    (0.5, 1 << 63, False),
    (0.01, round(0.01 * 2**64) - 1, True),
    (0.01, round(0.01 * 2**64), False),
]


@pytest.mark.parametrize(("ratio", "low_bits", "sampled"), SAMPLING)
def test_the_ratio_decides_from_the_trace_ids_low_64_bits(ratio: float, low_bits: int, sampled: bool) -> None:
    sampler = HeadSampler(ratio)
    assert sampler.bound == round(ratio * 2**64)
    high = 0xABCDEF << 64  # the high bits never count
    assert sampler.samples(high | low_bits) is sampled
    root = sampler.root(Bits(high | low_bits, 1))
    assert root.sampled is sampled


@pytest.mark.parametrize("ratio", [-0.1, 1.01])
def test_a_ratio_outside_0_1_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError):
        HeadSampler(ratio)


def test_over_many_traces_the_ratio_is_the_share_recorded() -> None:
    rng = random.Random(11)
    sampler = HeadSampler(0.1)
    recorded = sum(sampler.root(rng).sampled for _ in range(20_000))
    assert 1_800 < recorded < 2_200


def test_a_parent_decides_over_the_ratio() -> None:
    never, always = HeadSampler(0.0), HeadSampler(1.0)
    assert never.start(parse(V00), Bits(3)).sampled is True
    assert always.start(parse(f"00-{TRACE}-{PARENT}-00"), Bits(3)).sampled is False
    assert never.start(None, Bits(1, 3)).sampled is False


UNSAMPLED = f"00-{TRACE}-{PARENT}-00"
BEGIN = [
    # incoming        ratio  records  parent span       forwards
    (V00, 0.0, True, int(PARENT, 16), f"00-{TRACE}-{5:016x}-01"),  # the child's id goes on
    (UNSAMPLED, 1.0, False, None, UNSAMPLED),  # the decision made upstream travels unchanged
    (f"cc-{TRACE}-{PARENT}-00-x", 1.0, False, None, UNSAMPLED),  # ... in the form this code writes
    (None, 1.0, True, None, f"00-{7:032x}-{5:016x}-01"),  # a new trace, recorded
    (None, 0.0, False, None, f"00-{7:032x}-{5:016x}-00"),  # a new trace, not recorded: still passed on
    ("garbage", 1.0, True, None, f"00-{7:032x}-{5:016x}-01"),  # invalid: ignored, a new trace
]


@pytest.mark.parametrize(("incoming", "ratio", "records", "parent_span_id", "forward"), BEGIN)
def test_begin_a_step_of_a_trace(incoming: str | None, ratio: float, records: bool, parent_span_id: int | None,
                                 forward: str) -> None:
    step = begin(incoming, HeadSampler(ratio), Bits(7, 5) if incoming in (None, "garbage") else Bits(5))
    assert (step.span is not None) is records
    assert step.parent_span_id == parent_span_id
    assert step.forward == forward
    if step.span is not None:
        assert step.span.traceparent == forward
