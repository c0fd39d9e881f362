"""Targeted events are honoured only with the control plane's proof."""

from __future__ import annotations

import pytest

from core import target_proof as tp

KEY = tp.target_key(b"m" * 32)


def test_a_proof_verifies_for_exactly_what_it_was_made_for() -> None:
    proof = tp.prove(KEY, "t_1", "evt_1", "ep_1")
    assert tp.verify(KEY, "t_1", "evt_1", "ep_1", proof)


@pytest.mark.parametrize(("tenant", "event", "endpoint", "key"), [
    ("t_2", "evt_1", "ep_1", KEY),                       # another tenant
    ("t_1", "evt_2", "ep_1", KEY),                       # another event: a captured proof aims nothing else
    ("t_1", "evt_1", "ep_2", KEY),                       # another endpoint
    ("t_1", "evt_1", "ep_1", tp.target_key(b"n" * 32)),  # another master key
])
def test_anything_else_does_not(tenant: str, event: str, endpoint: str, key: bytes) -> None:
    assert not tp.verify(key, tenant, event, endpoint, tp.prove(KEY, "t_1", "evt_1", "ep_1"))


@pytest.mark.parametrize("proof", [None, "", "00" * 32, "not hex"])
def test_missing_or_made_up_proofs_do_not(proof: str | None) -> None:
    assert not tp.verify(KEY, "t_1", "evt_1", "ep_1", proof)


def test_fields_cannot_be_shifted_between_each_other() -> None:
    assert tp.prove(KEY, "t_1", "evt_1", "ep_1") != tp.prove(KEY, "t_1e", "vt_1", "ep_1")
    assert tp.target_key(b"m" * 32) != b"m" * 32
