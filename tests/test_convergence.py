"""Contextual BO finds each context's own optimum; context-blind BO cannot.

A simulated fleet (8 hosts per context, labelled as such in ``fleet.py``) talks to a real
Booster over gRPC with real PostgreSQL; the synthetic utility surface has a known optimum per
context, so the distance to the optimum is measured exactly.

Booster refits once per round here, explicitly, so the run is the same on every machine. The
bar comes from eight fleet seeds run that way (share of the optimum of the worse context):
after 20 rounds 96.3–98.7 % (four seeds under 98 %), after 30 rounds 97.7–99.4 % (two under
98 %: the incumbent still moves between near-equal θ, see the optimiser issue's stable
incumbent). The test asserts every context within 3 % after 30 rounds, for seed 7. (Before,
a refit worker could add a refit of its own at an uncontrolled moment; with it, seed 7 passed
2 % at 20 rounds, without it 97.8 %.)
"""

from __future__ import annotations

import pytest

from gemini_booster import simulation as sim
from gemini_booster.fleet import SyntheticFleet, theta_of
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store

from .conftest import AGENT

ROUNDS = 30
MIN_SHARE = 0.97  # of each context's optimum, after ROUNDS (see the module docstring)


def run(booster, mode: str) -> dict[str, float]:
    """Utility of the incumbent per context after ROUNDS reporting rounds, as a share of optimum."""
    policy_store.create_policy(
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
        assert share >= MIN_SHARE, f"{ctx}: incumbent at {share:.3f} of the optimum"
    assert any(contextual[c] - blind[c] > 0.02 for c in contextual), (contextual, blind)
