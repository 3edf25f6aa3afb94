"""θ from Booster into a table module: checked against the θ spec, installed atomically, kept
when Booster fails, replaced by the spec's safe default once Booster has been silent too long,
and once when the host stops running that datapath's θ (its policy tunes another datapath: the
table is then left alone, and a host without the module is never asked).

One ThetaApplier per ``apply = "profile_table"`` datapath of the registry (Fusion, GEMINI,
DC-Vegas): each module carries the same table (fusion-kmod/cc_table.h) under its own generic
netlink family and net.<datapath>.* sysctls, so what follows holds for each alike; Booster's θ
comes in the answer's field the datapath's ``message`` names (``theta`` for Fusion,
``datapath_theta`` for the others).

Everything goes into the module's netlink table in one message that replaces the whole table:
per-context profiles by destination prefix, compiled to fit the module's limits
(gemini_agent.table), and the default as catch-all rules (0.0.0.0/0, ::/0). A flow that starts
during an update sees either the old θ or the new one, never a mix of the two, which writing
seven sysctls one by one could not promise. The sysctls are written afterwards, so that
net.fusion.* shows the default and holds it should the table ever be cleared. A θ that fails
the spec's check reaches neither.

Should the module refuse a table all the same, the agent does not stop: it installs the
catch-alls alone (every destination on the default θ), counts the refusal, logs one line, and
tries the full table again at the next plan."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gemini_agent.config import SYSCTL_ROOT
from gemini_agent.context import Place
from gemini_agent.metrics import AgentMetrics
from gemini_agent.table import (
    CATCH_ALL,
    LEFT_OUT_REASONS,
    CompiledTable,
    Destinations,
    Limits,
    compile_table,
)
from gemini_api.datapaths import Apply, Datapath, Message, datapath, registry
from gemini_api.fusion_genl import FusionError, FusionNetlink, Rule, TableFamily
from gemini_api.theta import ThetaError, ThetaSpec
from gemini_api.v1 import booster_pb2 as pb

log = logging.getLogger(__name__)
CATCH_ALL_PROFILE = 1


def table_datapaths() -> list[Datapath]:
    """The datapaths whose θ goes into a per-destination profile table, the default first."""
    return [d for d in registry() if d.apply is Apply.PROFILE_TABLE]


def table_datapath() -> Datapath:
    """The first of them (the default datapath's, Fusion's module)."""
    return table_datapaths()[0]


def sysctl_root_of(d: Datapath, default_root: Path) -> Path:
    """Where table datapath ``d``'s net.<name>.* are, the default datapath's being at
    ``default_root`` (the agent's sysctl_root): the others beside it, as /proc/sys/net has
    them (the Helm chart mounts that directory)."""
    return default_root if d == registry().default else d.sysctl_root(default_root.parent)


def answered_default(resp: pb.GetParametersResponse, d: Datapath) -> dict[str, int] | None:
    """The default θ Booster's answer gives datapath ``d``, from the field of its message;
    None when the answer carries none for it."""
    if d.message is Message.THETA:
        return d.spec.from_message(resp.default_theta)
    msg = resp.default_datapath_theta
    found = resp.HasField("default_datapath_theta") and msg.datapath == d.name
    return dict(msg.values) if found else None


def answered_context(params: pb.ContextParameters, d: Datapath) -> dict[str, int] | None:
    """A context's θ for datapath ``d`` in Booster's answer, as ``answered_default``."""
    if d.message is Message.THETA:
        return d.spec.from_message(params.theta)
    msg = params.datapath_theta
    found = params.HasField("datapath_theta") and msg.datapath == d.name
    return dict(msg.values) if found else None


@dataclass(frozen=True)
class Plan:
    """What the kernel should run: a default θ and a θ per destination place."""

    default: dict[str, int]
    per_place: dict[Place, dict[str, int]]


class Kernel:
    """The two ways into a table module (``family``; tcp_fusion's by default): its sysctls
    under ``sysctl_root`` and its netlink family. Tests of the agent's own checks may point
    sysctl_root at a directory; the lab exercises the real modules."""

    def __init__(
        self,
        sysctl_root: Path = SYSCTL_ROOT,
        use_netlink: bool = True,
        family: TableFamily | None = None,
    ) -> None:
        self.sysctl_root, self.use_netlink, self.family = sysctl_root, use_netlink, family

    @classmethod
    def of(cls, d: Datapath, default_root: Path, use_netlink: bool = True) -> Kernel:
        """The kernel side of table datapath ``d`` (its sysctls: ``sysctl_root_of``)."""
        return cls(sysctl_root_of(d, default_root), use_netlink, TableFamily.of(d))

    def write_default(self, theta: Mapping[str, int]) -> None:
        for name, value in theta.items():
            path = self.sysctl_root / name
            if path.read_text().strip() != str(value):
                path.write_text(f"{value}\n")

    def write_table(self, profiles: dict[int, dict[str, int]], rules: Sequence[Rule]) -> None:
        if self.use_netlink:
            with FusionNetlink(self.family) as nl:
                nl.set_profiles(profiles, rules)

    def record_drops(self) -> dict[str, int]:
        """The module's counts of flow records lost (no room or memory: kernel; no listener:
        unheard) since it loaded; empty when it cannot be asked. Not asked while the module
        is not loaded: a host that never loads it (one that tunes its stock CUBIC) would log
        a warning every interval."""
        if not self.use_netlink or not self.present():
            return {}
        try:
            with FusionNetlink(self.family) as nl:
                stats = nl.stats()
        except (FusionError, OSError) as exc:
            log.warning("cannot read the module's counters: %s", exc)
            return {}
        return {"kernel": stats["dropped"], "unheard": stats["unheard"]}

    def present(self) -> bool:
        """Is the module loaded? Its sysctls are there exactly while it is."""
        return self.sysctl_root.is_dir()

    def version(self) -> int:
        path = self.sysctl_root / "version"
        return int(path.read_text()) if path.exists() else 0


class ThetaApplier:
    def __init__(
        self,
        kernel: Kernel,
        metrics: AgentMetrics,
        staleness_s: float,
        spec: ThetaSpec | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.kernel, self.metrics, self.staleness_s = kernel, metrics, staleness_s
        self.limits = limits or Limits()
        self.spec = spec or table_datapath().spec
        self.datapath = datapath(self.spec.datapath)  # whose θ the table holds
        self.safe_default = self.spec.default()
        self.last_ok = time.monotonic()
        self.applied: Plan | None = None
        self.installed: CompiledTable | None = None  # what the module holds, as far as known
        self._compiled: tuple[tuple, CompiledTable] | None = None  # the last compile, by input
        self.fell_back = False
        self.released = False  # the table left alone since: see release()

    def checked(self, theta: dict[str, int] | None) -> dict[str, int] | None:
        """``theta`` when it is in Θ'; None, logged and counted, when it is not or is missing."""
        try:
            if theta is None:
                raise ThetaError(f"the answer carries no {self.spec.datapath} θ")
            self.spec.validate(theta, self.spec.region_bounds("wide"))
        except ThetaError as exc:
            log.error("refusing θ from Booster: %s", exc)
            self.metrics.theta_refused.inc()
            return None
        return theta

    def plan_from(self, resp: pb.GetParametersResponse, places: Sequence[Place]) -> Plan:
        """Booster's answer, each θ checked; a refused θ keeps what that context ran before.
        An answer for a policy of another datapath (CUBIC's) carries that datapath's θ and
        none of this spec's: nothing here to check or refuse, the kernel keeps its plan."""
        previous = self.applied or Plan(self.safe_default, {})
        if registry().answered(resp.target_cc) != self.datapath:
            return previous
        default = self.checked(answered_default(resp, self.datapath))
        per_place = dict(previous.per_place)
        for params, place in zip(resp.parameters, places, strict=True):
            theta = self.checked(answered_context(params, self.datapath))
            if theta is not None:
                per_place[place] = theta
        return Plan(default or previous.default, per_place)

    def apply(
        self,
        plan: Plan,
        destinations: Destinations | Sequence[tuple[str, Place]],
        rank: Sequence[Place] = (),
    ) -> CompiledTable:
        """Install `plan`: places in `rank` order until the module's limits are reached."""
        if not isinstance(destinations, Destinations):
            destinations = Destinations.from_prefixes(destinations)
        table = self._compile(plan, destinations, rank)
        try:
            if not self._holds(table):
                self.installed = None
                self.kernel.write_table(table.profiles, table.rules)
                self.installed = table
        except (FusionError, OSError) as exc:
            table = self._catch_all_only(plan, destinations, exc)
        self.kernel.write_default(plan.default)
        self.applied, self.released = plan, False
        self.metrics.theta_version.set(self.kernel.version())
        self.metrics.table_rules.set(len(table.rules))
        self.metrics.table_profiles.set(len(table.profiles))
        for reason, places in table.left_out.items():
            self.metrics.contexts_on_catch_all.labels(reason).set(places)
        return table

    def _compile(
        self, plan: Plan, destinations: Destinations, rank: Sequence[Place]
    ) -> CompiledTable:
        """Compiling a large database takes seconds: the same plan, places and ranking as
        last time give the same table, so it is compiled once."""
        inputs = (plan, tuple(rank), id(destinations), self.limits)
        if self._compiled is not None and self._compiled[0] == inputs:
            return self._compiled[1]
        table = compile_table(destinations, plan.default, plan.per_place, rank, self.limits)
        self._compiled = (inputs, table)
        return table

    def _holds(self, table: CompiledTable) -> bool:
        """Is `table` what the module holds already? Then writing it again would only bump
        the θ version, which splits the interval's aggregates for nothing."""
        held = self.installed
        return held is not None and (held.profiles, held.rules) == (table.profiles, table.rules)

    def _catch_all_only(
        self, plan: Plan, destinations: Destinations, exc: Exception
    ) -> CompiledTable:
        """The module refused the table: every destination on the default θ, one log line."""
        self.metrics.tables_refused.inc()
        self.metrics.fallbacks.labels("table_refused").inc()
        left_out = len(set(plan.per_place) & set(destinations.places))
        log.error(
            "the module refused the destination table (%s): all %d contexts run the default θ "
            "until the next plan",
            exc,
            left_out,
        )
        rules = [Rule(prefix, CATCH_ALL_PROFILE) for prefix in CATCH_ALL.values()]
        try:
            self.kernel.write_table({CATCH_ALL_PROFILE: plan.default}, rules)
        except (FusionError, OSError) as again:
            log.error("the module refused the catch-all table too (%s)", again)
        left = dict.fromkeys(LEFT_OUT_REASONS, 0) | {"refused": left_out}
        return CompiledTable({CATCH_ALL_PROFILE: plan.default}, rules, frozenset(), left)

    def release(self, destinations: Destinations | Sequence[tuple[str, Place]]) -> None:
        """The host runs no θ of this spec any longer (its policy tunes another datapath and
        no arm runs Fusion): every destination back on the safe default, once, and the table
        is then left alone until a θ of this spec is applied again. Once also after a start
        (the module may hold the θ of the policy the host ran before). Never more than once,
        and not at all without the module (no net.fusion sysctls: no table holds a θ, and the
        module loads with its own defaults), because a host that never loads it (a fleet
        tuning its stock CUBIC) would otherwise log and count a refused table nobody asked
        for on every refresh. OSError when the kernel refuses; not tried again."""
        if self.released:
            return
        self.applied = None
        try:
            if self.kernel.present():
                log.info(
                    "no %s θ to run: every destination back on the safe default",
                    self.spec.datapath,
                )
                self.apply(Plan(self.safe_default, {}), destinations)
        finally:
            self.released = True

    def booster_answered(self) -> None:
        self.last_ok = time.monotonic()
        self.fell_back = False
        self.metrics.staleness.set(0)

    def went_stale(self) -> bool:
        """True once per silence of Booster: when it first lasts longer than staleness_s
        (until Booster answers again). Every datapath the agent set then falls back."""
        age = time.monotonic() - self.last_ok
        self.metrics.staleness.set(age)
        if age <= self.staleness_s or self.fell_back:
            return False
        self.fell_back = True
        return True

    def fall_back(self, destinations: Destinations | Sequence[tuple[str, Place]]) -> None:
        """Every destination on the spec's safe default; OSError when the kernel refuses."""
        age = time.monotonic() - self.last_ok
        log.warning("no θ from Booster for %.0f s: falling back to the safe default", age)
        self.apply(Plan(self.safe_default, {}), destinations)
        self.metrics.fallbacks.labels("stale").inc()

    def check_staleness(self, destinations: Destinations | Sequence[tuple[str, Place]]) -> None:
        """Keep the last good θ while Booster is away, up to the staleness limit."""
        if self.went_stale():
            self.fall_back(destinations)
