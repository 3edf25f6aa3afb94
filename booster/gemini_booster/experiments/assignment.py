"""Which arm a host runs: its group, fixed when it joins, and the day.

Each host has a position u in [0, 1) from SHA-256 of (experiment salt, host id). Groups are
drawn per region (the stratum), so that every region is split as the experiment says:

- **at creation**, a region's n hosts, ordered by position, are cut at the split's cumulative
  shares: each arm gets n·share hosts up to one, in every region, however small;
- **a host joining later** goes to the arm furthest below its share among the region's current
  hosts (ties: the lower arm), so churn does not wear the balance down; joiners are taken in
  order of position, and a host that left and comes back gets its old group;
- **a host leaving** keeps its group (its flows so far still count for that arm) and runs
  nothing from then on.

So the assignment is deterministic (the same population and salt give the same groups on every
replica: nothing depends on the order hosts are listed in) and stable: a join or a leave writes
only that host's group, and no other host's arm ever changes. The groups are stored with the
population (``experiment_hosts.grp``) because, unlike a bare hash split (each host alone
decides, and a region of 500 hosts is then off its split by more than 5 points in one arm of
one region out of a few dozen), a stratified cut depends on who else was there.

Crossover: the two groups swap arms from the crossover day's first instant (a UTC midnight, or
a compressed day's boundary: ``domain.Days``), so group g runs arm (g + period) mod 2. A host
whose current arm was stopped, which left, or whose experiment is not running, runs nothing
from the experiment: its own defaults are restored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime
from itertools import accumulate

from gemini_api.sums import Objective

from .domain import ArmSpec, Days, Experiment, Member

POSITION_BYTES = 8  # 64 bits of the digest: positions are distinct for any fleet size
_SCALE = float(1 << (8 * POSITION_BYTES))


def position(salt: str, host: str) -> float:
    """The host's place in [0, 1) for this salt (NUL-separated: no two pairs share a text)."""
    digest = hashlib.sha256(f"{salt}\0{host}".encode()).digest()
    return int.from_bytes(digest[:POSITION_BYTES], "big") / _SCALE


def _by_region(hosts: Mapping[str, str], salt: str) -> dict[str, list[str]]:
    """Region → its hosts in order of position (ties, never seen in practice, by id)."""
    out: dict[str, list[str]] = {}
    for host, region in hosts.items():
        out.setdefault(region, []).append(host)
    return {r: sorted(hs, key=lambda h: (position(salt, h), h)) for r, hs in out.items()}


def _cut(n: int, split: tuple[float, ...]) -> list[int]:
    """The group of each of n ordered hosts: rank r goes where (r + ½)/n falls in the split, so
    each group gets n·share hosts up to one."""
    bounds = list(accumulate(split))
    out, g = [], 0
    for r in range(n):
        while g < len(split) - 1 and (r + 0.5) / n >= bounds[g]:
            g += 1
        out.append(g)
    return out


def initial_groups(hosts: Mapping[str, str], split: tuple[float, ...], salt: str) -> dict[str, int]:
    """Host → group for a population declared at creation (host → region)."""
    out: dict[str, int] = {}
    for ordered in _by_region(hosts, salt).values():
        out.update(zip(ordered, _cut(len(ordered), split), strict=True))
    return out


def join_groups(
    members: Mapping[str, Member],
    joining: Mapping[str, str],
    split: tuple[float, ...],
    salt: str,
    at: datetime,
) -> dict[str, int]:
    """Host → group for ``joining`` (host → region), given the current ``members``: a returning
    host keeps its group; a new one fills its region's largest shortfall against the split."""
    counts: dict[str, list[int]] = {}
    for m in members.values():
        if m.present(at):
            counts.setdefault(m.region, [0] * len(split))[m.group] += 1
    out: dict[str, int] = {}
    for region, ordered in sorted(_by_region(joining, salt).items()):
        c = counts.setdefault(region, [0] * len(split))
        for host in ordered:
            old = members.get(host)
            if old is not None:
                out[host] = old.group
                if not old.present(at):
                    c[old.group] += 1
                continue
            n = sum(c) + 1
            g = max(range(len(split)), key=lambda i: (split[i] * n - c[i], -i))
            out[host] = g
            c[g] += 1
    return out


def host_group(experiment: Experiment, host: str) -> int | None:
    """The host's group (also after it left), or None when it never joined."""
    m = experiment.hosts.get(host)
    return None if m is None else m.group


def arm_index(experiment: Experiment, group: int, day: date) -> int:
    """The arm group ``group`` runs on ``day`` (after a crossover the two groups swap)."""
    return (group + experiment.period(day)) % len(experiment.arms)


@dataclass(frozen=True)
class Assignment:
    """What one host runs at an instant, and until when (the next time it may change: the
    crossover's instant, or the end); with the experiment's days, which its flows count by."""

    experiment: str
    experiment_id: int
    arm: ArmSpec
    group: int
    period: int
    region: str
    until: datetime
    calendar: Days
    objective: Objective  # the experiment's: its hosts send the sums it needs


def assignment(experiment: Experiment, host: str, at: datetime) -> Assignment | None:
    """The host's arm at ``at``; None when it is not (or no longer) in the population, the
    experiment is not running, or its arm was stopped (the host is restored to its defaults)."""
    m = experiment.hosts.get(host)
    if m is None or not m.present(at) or not experiment.live_at(at):
        return None
    day = experiment.day_of(at)
    arm = experiment.arms[arm_index(experiment, m.group, day)]
    if not experiment.arm_live_at(arm.name, at):
        return None
    crossover = experiment.crossover_at
    until = crossover if crossover is not None and at < crossover else experiment.end
    return Assignment(
        experiment.name,
        experiment.id,
        arm,
        m.group,
        experiment.period(day),
        m.region,
        until,
        experiment.calendar,
        experiment.objective,
    )


def balance(experiment: Experiment, at: datetime) -> dict[str, dict[str, int]]:
    """Region → arm → hosts present at ``at``, in the first period (groups swap at a
    crossover)."""
    out: dict[str, dict[str, int]] = {}
    names = experiment.arm_names
    for m in experiment.hosts.values():
        if m.present(at):
            out.setdefault(m.region, dict.fromkeys(names, 0))[names[m.group]] += 1
    return dict(sorted(out.items()))
