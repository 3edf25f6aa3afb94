"""Exploration reaches every context: the exploring window rotates over hosts with the clock
(``policy.assignment``), at the policy's share, the same for every replica within a slot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gemini_booster.domain import ContextKey
from gemini_booster.policy import assignment
from gemini_booster.policy.assignment import (
    ROTATION_HOURS,
    assign,
    exploration_position,
    explores,
    rotation_slot,
)

T0 = datetime(2026, 3, 2, tzinfo=UTC)
SHARE = 0.5
KEYS = [ContextKey("eu-west", "cdn-a", f"r{i}", "mobile", 15) for i in range(200)]
HOSTS = [f"host-{i}" for i in range(400)]
WAIT_SLOTS = 4  # with the golden-ratio step and share 0.5, no host waits longer than this


def test_without_a_clock_the_assignment_is_the_fixed_one():
    key = KEYS[0]
    for h in HOSTS:
        fixed = exploration_position(h, key) < SHARE
        assert assign(h, key, "inc", ["cand"], SHARE) == (
            ("cand", True) if fixed else ("inc", False)
        )


def test_every_single_host_context_explores_within_a_few_slots():
    """Each context of one host: under the fixed assignment about half never explore."""
    never_fixed = sum(not explores("host-0", k, SHARE, 0) for k in KEYS)
    assert never_fixed > len(KEYS) // 4
    for key in KEYS:
        slots = [s for s in range(WAIT_SLOTS) if explores("host-0", key, SHARE, s)]
        assert slots, key


def test_a_context_seen_only_in_one_time_block_still_gets_explorers():
    """A context (hour 15's block) whose one host is asked only 12:00–23:59 each day: the
    window's period is no divisor of a day, so the host explores within three days."""
    hours = [T0 + timedelta(days=d, hours=h) for d in range(3) for h in range(12, 24)]
    for key in KEYS:
        answers = [assign("host-0", key, "inc", ["cand"], SHARE, now=t)[1] for t in hours]
        assert any(answers), key


def test_the_exploring_share_stays_the_policys_in_every_slot():
    """The cost the exploration cap bounds: in every slot about ``share`` of the hosts
    explore, and every host explores about ``share`` of the slots."""
    key = KEYS[0]
    for slot in range(40):
        exploring = sum(explores(h, key, SHARE, slot) for h in HOSTS) / len(HOSTS)
        assert abs(exploring - SHARE) < 0.08, slot
    for h in HOSTS[:50]:
        part = sum(explores(h, key, SHARE, s) for s in range(200)) / 200
        assert abs(part - SHARE) < 0.05, h


def test_replicas_agree_within_a_slot_and_the_slot_follows_the_clock():
    start = T0 + timedelta(hours=ROTATION_HOURS * 1000)  # a slot boundary of the epoch's count
    slot = rotation_slot(start)
    assert rotation_slot(start + timedelta(hours=ROTATION_HOURS) - timedelta(seconds=1)) == slot
    assert rotation_slot(start + timedelta(hours=ROTATION_HOURS)) == slot + 1
    assert rotation_slot(None) == 0
    key = KEYS[1]
    late = start + timedelta(hours=ROTATION_HOURS, seconds=-1)
    for h in HOSTS:
        assert assign(h, key, "i", ["a", "b"], SHARE, now=start) == assign(
            h, key, "i", ["a", "b"], SHARE, now=late
        )


def test_an_explorer_keeps_its_candidate_slot_when_the_window_moves():
    key = KEYS[2]
    cands = ["a", "b", "c"]
    for h in HOSTS:
        picked = {
            assign(h, key, "inc", cands, SHARE, now=T0 + timedelta(hours=ROTATION_HOURS * s))[0]
            for s in range(12)
        } - {"inc"}
        assert picked <= {cands[assignment.candidate_slot(h, key, len(cands))]}


def test_the_serving_path_rotates_its_explorers_with_its_clock():
    """GetParameters' answers (``PlanCache.answer``): the one host of a context that does not
    explore in slot 0 runs a candidate in a later slot, as the clock the cache reads moves."""
    from gemini_api.theta import load_spec
    from gemini_api.v1 import booster_pb2 as pb
    from gemini_booster.models import Policy
    from gemini_booster.service.plan_cache import PlanCache, theta_message
    from gemini_booster.storage.plans import PlanRecord

    spec = load_spec()
    key = next(k for k in KEYS if not explores("host-0", k, SHARE, rotation_slot(T0)))
    candidate = dict(spec.default(), init_cwnd=spec.default()["init_cwnd"] + 1)
    now = [T0]
    cache = PlanCache(spec, clock=lambda: now[0])
    record = PlanRecord(1, 7, 1, spec.key(spec.default()), 1.0, (spec.key(candidate),))
    cache.replace(1, [record], {7: key}, generation=1)
    policy = Policy(id=1, name="p", revision=1, exploration_share=SHARE)
    default = theta_message(spec, spec.default())

    def answer() -> pb.ContextParameters:
        return cache.answer(policy, default, "host-0", pb.Context(), key)

    assert not answer().exploratory
    for _ in range(WAIT_SLOTS):
        now[0] += timedelta(hours=ROTATION_HOURS)
        if answer().exploratory:
            break
    got = answer()
    assert got.exploratory and spec.from_message(got.theta) == candidate
