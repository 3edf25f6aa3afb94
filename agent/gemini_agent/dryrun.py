"""What a dry run (``apply_to_kernel = false``) shows: the agent's start banner, and after each
answer from Booster that changes it, exactly what the agent would have written.

The θ shown is the θ the agent would install: Booster's answer after the agent's own checks
against the spec (``ThetaApplier.plan_from``), compiled into the destination table the module
would receive (``table.compile_table``: profiles, then prefix rules), the sysctls that would
hold the default, a host-wide datapath's module parameters, and the CC an experiment arm would
set. Nothing is written; the text goes to stdout, where an operator running
``gemini-agent run`` by hand reads it. The banner never shows a secret: where the token comes
from, not what it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gemini_agent.config import AgentSettings
from gemini_agent.context import Place
from gemini_agent.table import Destinations, Limits, compile_table
from gemini_agent.writeback import Plan, sysctl_root_of
from gemini_api.datapaths import registry
from gemini_api.theta import ThetaError, ThetaSpec
from gemini_api.v1 import booster_pb2 as pb

if TYPE_CHECKING:
    from gemini_agent.daemon import Agent

SHOWN_PLACES = 20  # destinations listed one by one; the rest counted
SHOWN_RULES = 10


def theta_text(theta: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in theta.items())


def token_source(s: AgentSettings) -> str:
    """Where the agent's credential comes from, never the credential."""
    if s.token_file is not None:
        return f"from file {s.token_file}"
    if s.token.get_secret_value():
        return "set (GEMINI_AGENT_TOKEN or the settings file)"
    return "NONE: Booster refuses every call; set token_file (booster token create --host)"


def _transport(s: AgentSettings) -> str:
    if s.tls_ca_file is None:
        return "plaintext"
    mutual = f", client certificate {s.tls_cert_file}" if s.tls_cert_file is not None else ""
    return f"TLS, CA {s.tls_ca_file}{mutual}"


def _datapaths(s: AgentSettings) -> str:
    """The datapaths this agent can run, by how it applies θ."""
    parts = []
    for d in registry():
        where = sysctl_root_of(d, s.sysctl_root) if d.per_destination else d.spec.target
        how = "θ per destination" if d.per_destination else "one θ per host"
        parts.append(f"{d.name} ({how}, {where})")
    return "; ".join(parts)


def banner(s: AgentSettings, version: str) -> list[str]:
    """The start banner: what this agent is, whom it speaks to, as whom, and what it will do."""
    mode = (
        "DRY RUN: asks Booster and prints the θ it would write; writes nothing"
        if not s.apply_to_kernel
        else "applies θ to the kernel"
    )
    sources = "module flow records" + (" and socket diagnostics" if s.sockdiag else "")
    return [
        f"gemini-agent {version} starting",
        f"  host id     {s.host_id}",
        f"  policy      {s.policy}",
        f"  booster     {s.booster_address} ({_transport(s)})",
        f"  token       {token_source(s)}",
        f"  datapaths   {_datapaths(s)}",
        f"  mode        {mode}",
        f"  flows from  {sources}; a report every {s.interval_s:g} s, spool {s.spool_dir}",
        f"  metrics     http://{s.metrics_listen}/metrics",
    ]


def _place(p: Place) -> str:
    return f"{p.region}/{p.isp}"


def table_lines(
    spec: ThetaSpec,
    plan: Plan,
    destinations: Destinations,
    rank: Sequence[Place],
    sysctl_root: str,
    limits: Limits | None = None,
) -> list[str]:
    """The destination table and sysctls a per-destination datapath would receive."""
    table = compile_table(destinations, plan.default, plan.per_place, rank, limits or Limits())
    lines = [f"{spec.datapath}: default θ → sysctls under {sysctl_root}:"]
    lines += [f"  {sysctl_root}/{k} = {v}" for k, v in plan.default.items()]
    placed = [p for p in rank if p in plan.per_place]
    lines.append(
        f"{spec.datapath}: θ per destination ({len(placed)} places, {len(table.profiles)} "
        f"profiles, {len(table.rules)} prefix rules; "
        f"{len(placed) - len(table.installed & set(placed))} on the default θ):"
    )
    for p in placed[:SHOWN_PLACES]:
        where = "" if p in table.installed else "  (left on the default: table full)"
        lines.append(f"  {_place(p):<28} {theta_text(plan.per_place[p])}{where}")
    if len(placed) > SHOWN_PLACES:
        lines.append(f"  … and {len(placed) - SHOWN_PLACES} more places")
    for profile, theta in sorted(table.profiles.items()):
        lines.append(f"  profile {profile}: {theta_text(theta)}")
    for rule in table.rules[:SHOWN_RULES]:
        lines.append(f"  rule {rule.prefix} → profile {rule.profile_id}")
    if len(table.rules) > SHOWN_RULES:
        lines.append(f"  … and {len(table.rules) - SHOWN_RULES} more rules")
    return lines


def host_lines(datapath: str, theta: Mapping[str, int] | None) -> list[str]:
    """A host-wide datapath's module parameters, or its kernel defaults put back."""
    if not datapath:
        return []
    spec = registry().get(datapath).spec
    if theta is None:
        return [f"{datapath}: module parameters back to the kernel's values ({spec.target})"]
    return [f"{datapath}: module parameters:"] + [
        f"  {spec.target}/{k} = {v}" for k, v in theta.items()
    ]


def arm_lines(arm: pb.ExperimentArm | None) -> list[str]:
    if arm is None:
        return ["experiment: none (the host's own CC settings)"]
    where = ", ".join(arm.destination_prefixes) or "host-wide"
    return [f"experiment {arm.experiment!r}, arm {arm.arm!r}: CC {arm.cc} ({where})"]


def would_write(
    agent: Agent, resp: pb.GetParametersResponse, asked: Sequence[Place], rank: Sequence[Place]
) -> list[str]:
    """Everything the agent would write for Booster's answer ``resp`` (to GetParameters for
    the places ``asked``), by the same choices the applying agent makes
    (Agent.table_plans)."""
    try:
        arm_plan = agent.fixed_plan(agent.arm)
    except ThetaError as exc:
        arm_plan = None
        lines = [f"the arm's fixed θ is refused ({exc}): the host's own settings stay"]
    else:
        lines = arm_lines(agent.arm)
    datapath, theta = agent.host_choice(resp)
    if datapath in agent.module_params:  # a host-wide datapath: its module parameters
        lines += host_lines(datapath, theta)
    plans = agent.table_plans(resp, registry().answered(resp.target_cc), asked, arm_plan)
    for name, applier in agent.tables.items():
        shown = plans[name]
        if shown is not None:
            root = str(applier.kernel.sysctl_root)
            lines += table_lines(
                applier.spec, shown, agent.destinations, rank, root, applier.limits
            )
    return lines


class DryRun:
    """Prints what would be written, once per change (Booster answers every interval)."""

    def __init__(self) -> None:
        self.last: list[str] | None = None

    def show(self, lines: list[str]) -> bool:
        """Print ``lines`` unless they are what was printed last; True when printed."""
        if lines == self.last:
            return False
        self.last = lines
        print("dry run: would write", flush=True)
        for line in lines:
            print(f"  {line}", flush=True)
        return True
