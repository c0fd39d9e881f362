"""The replay window rule of core/replay_policy.py, as tables: parsing, which rule governs a
type, when its window opens and closes, and the decision at a fixed clock."""

from __future__ import annotations

import pytest

from core.replay_policy import (
    CATALOG,
    HISTORY_MS,
    TENANT,
    ReplayRule,
    ReplayWindow,
    TypeRule,
    WindowError,
    check_pattern,
    decide,
    is_open,
    parse_window,
    rule_for,
    window_start_ms,
)

NOW = 1_700_000_000_000  # 2023-11-14T22:13:20Z
S, M, H, D = 1000, 60_000, 3_600_000, 86_400_000


@pytest.mark.parametrize(("text", "canonical", "ms"), [
    ("2s", "2s", 2 * S),
    ("90s", "90s", 90 * S),
    ("15m", "15m", 15 * M),
    ("1h", "1h", H),
    ("7d", "7d", 7 * D),
    ("30d", "30d", 30 * D),
    (" 1H ", "1h", H),
    ("never", "never", None),
    ("NEVER", "never", None),
])
def test_windows_that_parse(text: str, canonical: str, ms: int | None) -> None:
    assert parse_window(text) == ReplayWindow(canonical, ms)


@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_window_is_unset(text: str) -> None:
    assert parse_window(text) is None


@pytest.mark.parametrize(("text", "says"), [
    ("0s", "must be never or a duration"),
    ("1", "must be never or a duration"),
    ("1w", "must be never or a duration"),
    ("-1h", "must be never or a duration"),
    ("1.5h", "must be never or a duration"),
    ("01h", "must be never or a duration"),
    ("1h30m", "must be never or a duration"),
    ("forever", "must be never or a duration"),
    ("31d", "longer than the 30-day history"),
    ("721h", "longer than the 30-day history"),
])
def test_windows_that_are_refused(text: str, says: str) -> None:
    with pytest.raises(WindowError, match=says):
        parse_window(text)


@pytest.mark.parametrize("pattern", ["user.disabled", "user.*", "a.b.*", "*", "account-x.deleted"])
def test_patterns_accepted(pattern: str) -> None:
    assert check_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern", ["", "User.*", "user.", "user.**", "*.deleted", ".*", "user *", "x" * 201])
def test_patterns_refused(pattern: str) -> None:
    with pytest.raises(WindowError, match="must be an event type"):
        check_pattern(pattern)


ONE_HOUR = ReplayWindow("1h", H)
TWO_S = ReplayWindow("2s", 2 * S)
NEVER_W = ReplayWindow("never", None)
DAY = ReplayWindow("1d", D)
TENANT_RULES = (
    TypeRule("*", ReplayWindow("7d", 7 * D)),
    TypeRule("user.*", ONE_HOUR),
    TypeRule("user.admin.*", TWO_S),
    TypeRule("user.deleted", NEVER_W),
)


@pytest.mark.parametrize(("event_type", "catalog", "rules", "expected"), [
    # the catalogued type's own window wins over any tenant rule
    ("user.deleted", DAY, TENANT_RULES, ReplayRule(CATALOG, "user.deleted", DAY)),
    ("invoice.paid", TWO_S, (), ReplayRule(CATALOG, "invoice.paid", TWO_S)),
    # no window of its own: the most specific tenant rule
    ("user.deleted", None, TENANT_RULES, ReplayRule(TENANT, "user.deleted", NEVER_W)),
    ("user.disabled", None, TENANT_RULES, ReplayRule(TENANT, "user.*", ONE_HOUR)),
    ("user.admin.removed", None, TENANT_RULES, ReplayRule(TENANT, "user.admin.*", TWO_S)),
    ("invoice.paid", None, TENANT_RULES, ReplayRule(TENANT, "*", ReplayWindow("7d", 7 * D))),
    # order of the rules does not matter
    ("user.disabled", None, tuple(reversed(TENANT_RULES)), ReplayRule(TENANT, "user.*", ONE_HOUR)),
    # a prefix matches below it only, never the bare prefix nor a lookalike
    ("user", None, TENANT_RULES[1:], None),
    ("users.disabled", None, TENANT_RULES[1:], None),
    # nothing set: the 30-day history
    ("invoice.paid", None, (), None),
])
def test_which_rule_governs(event_type: str, catalog: ReplayWindow | None, rules: tuple[TypeRule, ...],
                            expected: ReplayRule | None) -> None:
    assert rule_for(event_type, catalog, rules) == expected


@pytest.mark.parametrize(("occurred", "created", "start"), [
    (NOW - H, NOW, NOW - H),   # the occurrence, as a rule
    (NOW + H, NOW, NOW),       # a producer clock ahead cannot lengthen the window
    (None, NOW, NOW),          # occurrence unknown (event row gone): the delivery's creation
])
def test_the_window_opens_at_the_occurrence(occurred: int | None, created: int, start: int) -> None:
    assert window_start_ms(occurred, created) == start


RULE_2S = ReplayRule(CATALOG, "user.disabled", TWO_S)
RULE_NEVER = ReplayRule(TENANT, "account.*", NEVER_W)


@pytest.mark.parametrize(("rule", "start", "allowed", "closes"), [
    (None, NOW - 29 * D, True, None),                 # no rule: only the history limits it
    (RULE_2S, NOW, True, NOW + 2 * S),
    (RULE_2S, NOW - 2 * S + 1, True, NOW + 1),        # one ms left
    (RULE_2S, NOW - 2 * S, False, NOW),               # closes at exactly now: closed
    (RULE_2S, NOW - H, False, NOW - H + 2 * S),
    (RULE_NEVER, NOW, False, NOW),                    # never: closed from the start
    (RULE_NEVER, NOW + S, True, NOW + S),             # (a start in the future has not begun)
])
def test_decision(rule: ReplayRule | None, start: int, allowed: bool, closes: int | None) -> None:
    d = decide(rule, start, NOW)
    assert (d.allowed, d.rule, d.closes_at_ms) == (allowed, rule, closes)
    assert bool(d.refusal) is not allowed


def test_a_refusal_names_the_rule_and_when_it_closed() -> None:
    d = decide(RULE_2S, NOW - H, NOW)
    assert d.refusal == ("replay not allowed: catalog user.disabled: replay window 2s "
                         "(closed at 2023-11-14T21:13:22.000Z)")
    assert decide(RULE_NEVER, NOW, NOW).refusal.startswith("replay not allowed: tenant rule account.*: "
                                                           "replay window never (closed at ")


@pytest.mark.parametrize(("closes", "now", "open_"), [
    (None, NOW, True),          # a request without a window (or queued by an older control plane)
    (NOW + 1, NOW, True),
    (NOW, NOW, False),
    (NOW - HISTORY_MS, NOW, False),
])
def test_the_jobs_question(closes: int | None, now: int, open_: bool) -> None:
    assert is_open(closes, now) is open_
