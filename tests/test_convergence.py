"""Contextual BO finds each context's own optimum; context-blind BO cannot.

A simulated fleet (8 hosts per context, labelled as such in ``fleet.py``) talks to a real
Booster over gRPC with real PostgreSQL; the synthetic utility surface has a known optimum per
context, so "within 2 % of the optimum" is measured exactly.
"""

from __future__ import annotations

import pytest

from gemini_booster import simulation as sim
from gemini_booster.fleet import SyntheticFleet, theta_of
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import repository as repo

from .conftest import AGENT

ROUNDS = 20


def run(booster, mode: str) -> dict[str, float]:
    """Utility of the incumbent per context after ROUNDS reporting rounds, as a share of optimum."""
    repo.create_policy(
        booster.engine, PolicyCreate(name=mode, mode=mode, exploration_share=0.75), actor="test"
    )
    booster.booster.reload_policies()
    policy = booster.booster.policies[mode]
    fleet = SyntheticFleet(booster.grpc_target, AGENT, mode, hosts_per_context=8, seed=7)
    try:
        for r in range(ROUNDS):
            fleet.run_round(r)
            booster.booster.refit(policy)
    finally:
        fleet.close()
    snap = booster.booster.plan_snapshot(policy.id)
    return {
        c.key[3]: sim.true_utility(c, theta_of(snap[c.key].incumbent)) / sim.best_utility(c)
        for c in sim.DEFAULT_CONTEXTS
    }


@pytest.mark.slow
def test_contextual_converges_per_context_and_blind_is_worse(booster):
    contextual = run(booster, "contextual")
    blind = run(booster, "standard")
    print(f"\nshare of optimum after {ROUNDS} rounds: contextual {contextual}, blind {blind}")
    for ctx, share in contextual.items():
        assert share >= 0.98, f"{ctx}: incumbent at {share:.3f} of the optimum"
    assert any(contextual[c] - blind[c] > 0.02 for c in contextual), (contextual, blind)
