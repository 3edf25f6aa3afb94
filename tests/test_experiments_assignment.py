"""Assignment of hosts to experiment arms: deterministic, balanced within ±5 % per region on
10,000 simulated hosts (also after churn), stable when hosts join or leave, swapped at a
crossover, and restored (no arm) outside the experiment, after a stop or a leave."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import pytest

from gemini_booster.experiments.assignment import (
    assignment,
    balance,
    initial_groups,
    join_groups,
    position,
)
from gemini_booster.experiments.domain import ArmSpec, ArmStop, Experiment, Member

FLEET = 10_000
# Unequal regions, as a fleet has, from 101 to 2,503 hosts (no split divides them evenly).
REGION_SIZES = {
    "eu": 2503,
    "us": 2499,
    "asia": 1901,
    "sa": 1249,
    "af": 751,
    "oc": 499,
    "me": 497,
    "ant": 101,
}
BALANCE_TOLERANCE = 0.05
SALTS = [f"salt-{i}" for i in range(20)]
SPLITS = [(0.5, 0.5), (0.1, 0.9), (0.2, 0.3, 0.5)]
CHURN = 1000
START = datetime(2026, 12, 1, tzinfo=UTC)
END = START + timedelta(days=14)
DURING = START + timedelta(days=2)


def fleet() -> dict[str, str]:
    """host id → region, FLEET hosts in all."""
    return {f"{r}-{i:05d}": r for r, n in REGION_SIZES.items() for i in range(n)}


def experiment(
    members: dict[str, Member],
    split: tuple[float, ...] = (0.5, 0.5),
    salt: str = "exp-1",
    crossover: date | None = None,
) -> Experiment:
    arms = tuple(
        ArmSpec(name=f"arm{i}", cc="cubic" if i == 0 else "bbr") for i in range(len(split))
    )
    return Experiment(
        id=1,
        name="exp",
        description="",
        salt=salt,
        arms=arms,
        control="arm0",
        split=split,
        hosts=members,
        start=START,
        end=END,
        crossover_day=crossover,
        sigma=1.0,
        guardrail=None,
        created_at=START,
        created_by="test",
    )


def enrol(hosts: dict[str, str], split: tuple[float, ...], salt: str) -> dict[str, Member]:
    groups = initial_groups(hosts, split, salt)
    return {h: Member(r, groups[h]) for h, r in hosts.items()}


def worst_deviation(members: dict[str, Member], split: tuple[float, ...], at: datetime) -> float:
    """The largest |share of an arm in a region − its split| among hosts present at ``at``."""
    worst = 0.0
    for per_arm in balance(experiment(members, split), at).values():
        n = sum(per_arm.values())
        for share, count in zip(split, per_arm.values(), strict=True):
            worst = max(worst, abs(count / n - share))
    return worst


def churn(
    members: dict[str, Member], split: tuple[float, ...], salt: str, seed: int
) -> tuple[dict[str, Member], set[str]]:
    """CHURN random hosts leave, then CHURN new ones join; the members after, and who stayed."""
    rng = random.Random(seed)
    leaving = set(rng.sample(sorted(members), CHURN))
    left = {h: (replace(m, left_at=DURING) if h in leaving else m) for h, m in members.items()}
    joining = {f"new-{seed}-{i:05d}": rng.choice(sorted(REGION_SIZES)) for i in range(CHURN)}
    later = DURING + timedelta(hours=1)
    groups = join_groups(left, joining, split, salt, later)
    assert set(groups) == set(joining)  # only the joiners get a group
    return left | {h: Member(r, groups[h]) for h, r in joining.items()}, set(members) - leaving


def test_fleet_is_ten_thousand_hosts() -> None:
    assert len(fleet()) == FLEET


def test_assignment_is_deterministic() -> None:
    hosts = fleet()
    first = initial_groups(hosts, (0.5, 0.5), "exp-1")
    # Hosts listed in another order: the same groups (nothing depends on the order).
    shuffled = dict(sorted(hosts.items(), key=lambda kv: position("x", kv[0])))
    assert initial_groups(shuffled, (0.5, 0.5), "exp-1") == first
    assert 0 <= position("exp-1", "eu-00001") < 1
    # Another experiment's salt draws a fresh split: about half the hosts change arm.
    other = initial_groups(hosts, (0.5, 0.5), "exp-2")
    changed = sum(first[h] != other[h] for h in hosts) / FLEET
    assert 0.45 < changed < 0.55


@pytest.mark.parametrize("split", SPLITS)
def test_balanced_within_5_percent_per_region(split: tuple[float, ...]) -> None:
    """Every region's share of every arm is within 5 points of the split, for 20 salts, at
    creation and after 1,000 hosts left and 1,000 joined."""
    hosts = fleet()
    at_creation = after_churn = 0.0
    for i, salt in enumerate(SALTS):
        members = enrol(hosts, split, salt)
        assert {
            r: sum(c.values()) for r, c in balance(experiment(members, split), START).items()
        } == (dict(sorted(REGION_SIZES.items())))
        at_creation = max(at_creation, worst_deviation(members, split, START))
        churned, _ = churn(members, split, salt, seed=i)
        after_churn = max(after_churn, worst_deviation(churned, split, DURING + timedelta(days=1)))
    print(
        f"split {split}: largest deviation of an arm's share in a region "
        f"{at_creation:.4f} at creation, {after_churn:.4f} after churn"
    )
    assert at_creation <= BALANCE_TOLERANCE
    assert after_churn <= BALANCE_TOLERANCE


def test_stable_when_hosts_join_or_leave() -> None:
    """1,000 hosts leaving and 1,000 joining change no other host's group (so no arm), nor
    does one host joining or leaving alone; a host that comes back has its old group."""
    split = (0.3, 0.7)
    members = enrol(fleet(), split, "exp-1")
    churned, stayed = churn(members, split, "exp-1", seed=3)
    assert len(stayed) == FLEET - CHURN
    assert {h: churned[h].group for h in stayed} == {h: members[h].group for h in stayed}
    for h in stayed:
        a, b = (
            assignment(experiment(m, split), h, DURING + timedelta(days=1))
            for m in (
                members,
                churned,
            )
        )
        assert a is not None and b is not None and a.arm == b.arm
    one = join_groups(members, {"web-17": "eu"}, split, "exp-1", DURING)
    assert set(one) == {"web-17"}
    gone = next(iter(members))
    back = join_groups(
        churned | {gone: replace(members[gone], left_at=DURING)},
        {gone: "eu"},
        split,
        "exp-1",
        DURING + timedelta(days=1),
    )
    assert back == {gone: members[gone].group}


def test_crossover_swaps_the_groups() -> None:
    crossover = date(2026, 12, 8)
    e = experiment(enrol(fleet(), (0.5, 0.5), "exp-1"), crossover=crossover)
    before, after = datetime(2026, 12, 7, 23, 59, tzinfo=UTC), datetime(2026, 12, 8, tzinfo=UTC)
    swapped = 0
    for host in list(e.hosts)[:2000]:
        a, b = assignment(e, host, before), assignment(e, host, after)
        assert a is not None and b is not None
        assert a.arm.name == f"arm{a.group}" and a.period == 0
        assert b.arm.name == f"arm{1 - a.group}" and b.period == 1 and b.group == a.group
        assert a.until == datetime(2026, 12, 8, tzinfo=UTC) and b.until == END
        swapped += a.arm != b.arm
    assert swapped == 2000


def test_no_arm_outside_the_experiment_after_a_stop_or_a_leave() -> None:
    members = enrol(fleet(), (0.5, 0.5), "exp-1")
    e = experiment(members)
    host = "eu-00042"
    found = assignment(e, host, DURING)
    assert found is not None and found.region == "eu" and found.until == END
    assert assignment(e, host, START - timedelta(seconds=1)) is None
    assert assignment(e, host, END) is None
    assert assignment(e, "not-in-the-population", DURING) is None
    stopped = replace(e, stopped_at=DURING - timedelta(hours=1), stopped_by="op", stop_reason="x")
    assert assignment(stopped, host, DURING) is None
    left = experiment(members | {host: replace(members[host], left_at=DURING)})
    assert assignment(left, host, DURING - timedelta(seconds=1)) is not None
    assert assignment(left, host, DURING) is None
    # A stopped arm restores its hosts; the other arm's hosts carry on.
    arm_stopped = replace(e, arm_stops={found.arm.name: ArmStop(START, "guardrail", "harm")})
    assert assignment(arm_stopped, host, DURING) is None
    other = next(h for h, m in members.items() if m.group != found.group)
    assert assignment(arm_stopped, other, DURING) is not None
