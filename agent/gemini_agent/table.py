"""The kernel's destination table, compiled from the destination database and Booster's θ.

The module holds at most FUSION_MAX_PROFILES θ profiles and FUSION_MAX_RULES prefix rules
(gemini_api.fusion_genl mirrors fusion_uapi.h; tests/test_fusion_abi.py holds the two equal).
A real IP database has millions of networks and thousands of (region, ISP) places, so the table
is compiled, not copied:

1. Profiles. Places whose θ is the same share one profile; the default θ is the profile of the
   catch-all rules (0.0.0.0/0, ::/0). Places are taken in rank order (most flows first); a place
   whose θ would need a profile past the limit stays on the catch-all.

2. Rules. The prefixes become the smallest set of rules that gives every address the same
   profile under longest-prefix match: ORTC (Draves, King, Venkatachary and Zill, "Constructing
   optimal IP routing tables", INFOCOM 1999), three passes over the binary trie of the prefixes:
     - down: an address range no prefix splits takes the profile of its closest enclosing
       prefix (at the top, the catch-all's);
     - up: a node's candidate set is the intersection of its children's sets when that is not
       empty, else their union: the profiles that could cover the node with one rule;
     - down again: a node whose inherited profile is in its set needs no rule; otherwise it gets
       a rule to one profile of its set, which its children then inherit.
   Adjacent and nested prefixes of one profile fold into one rule, and an aggregate with a few
   exceptions becomes one rule plus the exceptions. Sets are bit masks over profile indices.
   A subtree holding a single prefix is not walked bit by bit: its answer is known at once.

3. Budget. Each place's cost, the rules it needs when installed alone, is computed once per
   database and charged against FUSION_MAX_RULES in rank order; a place past the budget stays
   on the catch-all. Should the joint table still exceed the limit (prefixes of different
   places nesting in a CSV table can make it so), the lowest-ranked places go until it fits.

A place left out runs the default θ: its flows are still reported under their own context, with
the θ they ran, so Booster learns nothing false; it only loses the chance to tune that place.
"""

from __future__ import annotations

import bisect
import ipaddress
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gemini_agent.context import ADDRESS_BITS, Network, Place, prefix_text
from gemini_api.fusion_genl import MAX_PROFILES, MAX_RULES, Rule

Theta = Mapping[str, int]
CATCH_ALL = {4: "0.0.0.0/0", 6: "::/0"}
DEFAULT_INDEX = 0  # the default θ's profile index; profile ids are index + 1 (id 0 is the sysctls)
LEFT_OUT_REASONS = ("profiles", "rules", "refused")  # why a place is on the catch-all

# Trie nodes of the ORTC passes, as tuples (candidate set, kind, ...):
LEAF = 0  # (set, LEAF, index): the whole range runs one profile
SINGLE = 1  # (set, SINGLE, gap, start, length, index): one prefix deeper than a child, rest gap
INNER = 2  # (set, INNER, left, right)
Slice = list[tuple[int, int, int]]  # (start, length, profile index), sorted by (start, length)


@dataclass(frozen=True)
class Limits:
    """What one table may hold; the module's own limits unless a test says otherwise."""

    max_profiles: int = MAX_PROFILES
    max_rules: int = MAX_RULES


@dataclass(frozen=True)
class CompiledTable:
    profiles: dict[int, dict[str, int]]  # profile id (> 0) → θ
    rules: list[Rule]
    installed: frozenset[Place]  # places whose own θ the table carries
    left_out: dict[str, int] = field(default_factory=dict)  # reason → places on the catch-all


def _ortc(nets: Slice, bits: int) -> list[tuple[int, int, int]]:
    """The fewest (start, length, index) rules, the root's first, that give every address the
    index of its longest matching prefix in `nets` (DEFAULT_INDEX where none matches)."""
    starts = [n[0] for n in nets]

    def build(lo: int, hi: int, start: int, depth: int, gap: int) -> tuple:
        if lo < hi and nets[lo][0] == start and nets[lo][1] == depth:
            gap = nets[lo][2]  # a prefix covering this whole node: the gap's new profile
            lo += 1
        if lo == hi:
            return (1 << gap, LEAF, gap)
        if hi - lo == 1 and nets[lo][1] > depth + 1:
            net_start, length, index = nets[lo]
            if index == gap:
                return (1 << gap, LEAF, gap)
            # {gap} meets {index, gap} on the way down: the node's set is {gap}
            return (1 << gap, SINGLE, gap, net_start, length, index)
        mid = start + (1 << (bits - depth - 1))
        split = bisect.bisect_left(starts, mid, lo, hi)
        left = build(lo, split, start, depth + 1, gap)
        right = build(split, hi, mid, depth + 1, gap)
        if left[1] == LEAF and right[1] == LEAF and left[2] == right[2]:
            return left
        return (left[0] & right[0] or left[0] | right[0], INNER, left, right)

    rules: list[tuple[int, int, int]] = []

    def choose(node: tuple, start: int, depth: int, inherited: int) -> int:
        if node[0] >> inherited & 1:
            return inherited
        chosen = (node[0] & -node[0]).bit_length() - 1
        rules.append((start, depth, chosen))
        return chosen

    def emit(node: tuple, start: int, depth: int, inherited: int) -> None:
        if node[1] == LEAF:
            if node[2] != inherited:
                rules.append((start, depth, node[2]))
            return
        chosen = choose(node, start, depth, inherited)
        if node[1] == SINGLE:
            rules.append((node[3], node[4], node[5]))
            return
        half = 1 << (bits - depth - 1)
        emit(node[2], start, depth + 1, chosen)
        emit(node[3], start + half, depth + 1, chosen)

    root = build(0, len(nets), 0, 0, DEFAULT_INDEX)
    # the root always gets a rule, the catch-all, so that the table alone decides every flow
    top = DEFAULT_INDEX if root[0] >> DEFAULT_INDEX & 1 else (root[0] & -root[0]).bit_length() - 1
    rules.append((0, 0, top))
    if root[1] != LEAF:
        emit(root, 0, 0, top)  # the root's own rule is already there: nothing more is chosen
    return rules


def _top_level(nets: list[tuple[int, int, Place]], bits: int) -> list[bool]:
    """For each prefix (sorted by start, then length): is it inside no other prefix?"""
    flags: list[bool] = []
    open_ends: list[int] = []  # ends of the enclosing prefixes still open
    for start, length, _ in nets:
        while open_ends and open_ends[-1] <= start:
            open_ends.pop()
        flags.append(not open_ends)
        open_ends.append(start + (1 << (bits - length)))
    return flags


class Destinations:
    """The destination database's prefixes, per IP version, ready to compile: sorted, checked
    for duplicates, each place's cost in rules worked out once."""

    def __init__(self, networks: Iterable[Network]) -> None:
        by_version: dict[int, list[tuple[int, int, Place]]] = {4: [], 6: []}
        for net in networks:
            by_version[net.version].append((net.start, net.length, net.place))
        self.nets: dict[int, list[tuple[int, int, Place]]] = {}
        self.top_level: dict[int, list[bool]] = {}
        per_place: dict[tuple[Place, int], Slice] = {}
        for version, nets in by_version.items():
            nets.sort(key=lambda n: (n[0], n[1]))
            for a, b in itertools.pairwise(nets):
                if a[:2] == b[:2]:
                    raise ValueError(f"prefix {Network(version, *a)} given twice")
            self.nets[version] = nets
            self.top_level[version] = _top_level(nets, ADDRESS_BITS[version])
            for start, length, place in nets:
                per_place.setdefault((place, version), []).append((start, length, 1))
        self.prefix_count: Counter[Place] = Counter()
        self.cost: Counter[Place] = Counter()
        for (place, version), own in per_place.items():
            self.prefix_count[place] += len(own)
            self.cost[place] += len(_ortc(own, ADDRESS_BITS[version])) - 1  # less the root's
        self.places = sorted(self.prefix_count)

    @classmethod
    def from_prefixes(cls, prefixes: Iterable[tuple[str, Place]]) -> Destinations:
        return cls(Network.of(ipaddress.ip_network(p), place) for p, place in prefixes)

    def rules_for(self, index_of: Mapping[Place, int]) -> list[tuple[int, int, int, int]]:
        """(version, start, length, profile index) rules for places → profile indices; places
        not in `index_of` run the default."""
        out = []
        for version, nets in self.nets.items():
            sliced = [
                (start, length, index_of.get(place, DEFAULT_INDEX))
                for (start, length, place), top in zip(nets, self.top_level[version], strict=True)
                # a top-level prefix that runs the default changes nothing under it: skip it
                if not top or index_of.get(place, DEFAULT_INDEX) != DEFAULT_INDEX
            ]
            out += [(version, *rule) for rule in _ortc(sliced, ADDRESS_BITS[version])]
        return out


def _key(theta: Theta) -> tuple:
    return tuple(sorted(theta.items()))


def compile_table(
    dest: Destinations,
    default: Theta,
    per_place: Mapping[Place, Theta],
    rank: Sequence[Place] = (),
    limits: Limits = Limits(),
) -> CompiledTable:
    """The table to install: every place of `per_place` that fits, in `rank` order (places not
    ranked come after, in name order), the rest on the catch-all."""
    order = [p for p in rank if p in per_place]
    order += sorted(set(per_place) - set(order))
    thetas: dict[tuple, int] = {_key(default): DEFAULT_INDEX}
    index_of: dict[Place, int] = {}
    left_out: Counter[str] = Counter()
    budget = limits.max_rules - len(CATCH_ALL)
    for place in order:
        key = _key(per_place[place])
        if thetas.get(key) == DEFAULT_INDEX:  # runs what the catch-all runs: costs nothing
            index_of[place] = DEFAULT_INDEX
            continue
        if key not in thetas and len(thetas) == limits.max_profiles:
            left_out["profiles"] += 1
            continue
        if dest.cost[place] > budget:
            left_out["rules"] += 1
            continue
        budget -= dest.cost[place]
        index_of[place] = thetas.setdefault(key, len(thetas))
    rules = dest.rules_for(index_of)
    while len(rules) > limits.max_rules:  # nesting across places defeated the estimate
        left_out["rules"] += _drop_last(index_of, dest, len(rules) - limits.max_rules)
        rules = dest.rules_for(index_of)
    theta_of = {index: dict(key) for key, index in thetas.items()}
    return CompiledTable(
        profiles={i + 1: theta_of[i] for i in sorted({DEFAULT_INDEX, *index_of.values()})},
        rules=[Rule(prefix_text(v, start, length), i + 1) for v, start, length, i in rules],
        installed=frozenset(index_of),
        left_out={reason: left_out[reason] for reason in LEFT_OUT_REASONS},
    )


def _drop_last(index_of: dict[Place, int], dest: Destinations, excess: int) -> int:
    """Take the lowest-ranked places out until their cost covers `excess` rules, at least one;
    returns how many went. With none left the table is the catch-alls alone, which fits."""
    dropped, freed = 0, 0
    for place in reversed(list(index_of)):
        if freed >= excess and dropped:
            break
        del index_of[place]
        freed += max(dest.cost[place], 1)
        dropped += 1
    return dropped
