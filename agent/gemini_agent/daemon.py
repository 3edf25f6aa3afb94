"""The agent's main loop: every interval, close the aggregates into a report, spool it, drain
the spool to Booster, ask Booster for θ and write it into the kernel. Booster's errors are
logged and counted, never fatal: the kernel keeps its last good θ, until Booster has been
silent longer than `staleness_s`; then every datapath the agent set falls back to its spec's
default (Fusion's safe default; CUBIC's kernel defaults), once, until Booster answers again.
Nor is a refusal by the module fatal: every destination then runs the default θ until the next
plan.

The destination places are ranked by the flows seen to them recently, then by how many
prefixes they hold: the agent asks Booster about the first `max_contexts`, and the kernel's
table holds as many of those as its limits allow, in that order (gemini_agent.table).

When Booster's answer carries an experiment arm, the agent runs it (gemini_agent.congestion):
its CC host-wide or on some routes, and for Fusion its fixed θ or the spec's default instead of
the plan; an arm tuned by a policy makes the agent ask, and report, under that policy. An answer
without an arm, an arm past its end while Booster is away, or a clean exit restores the host.

Each table datapath's table (Fusion's, GEMINI's, DC-Vegas's: gemini_agent.writeback) is written
only while the host runs a θ of it: its policy tunes that datapath, or an arm runs it. A policy
of another datapath (CUBIC) leaves the table alone, so a host that never loads the module logs
and counts nothing about it; when a host stops running its θ, the table goes back to the safe
default once, as CUBIC's parameters go back to the kernel's values when its policy no longer
targets CUBIC. Before Booster's first answer the host is taken to run the default datapath
(Fusion), as an answer without a target_cc says."""

from __future__ import annotations

import datetime as dt
import logging
import socket
import threading
import time
from collections.abc import Sequence

import grpc
from prometheus_client import start_http_server

from gemini_agent.aggregator import Aggregator
from gemini_agent.config import AgentSettings
from gemini_agent.congestion import ArmApplier, NetKernel
from gemini_agent.context import ContextResolver, MmdbTable, Place, PrefixTable
from gemini_agent.datapath import HostTheta, datapath_message, host_theta, host_writer
from gemini_agent.dryrun import DryRun, would_write
from gemini_agent.flowlog import flow_log_sources
from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter
from gemini_agent.sources import RecordSource, SockDiagSource, Source, recorded_datapaths
from gemini_agent.spool import Spool
from gemini_agent.table import Destinations
from gemini_agent.writeback import Kernel, Plan, ThetaApplier, table_datapaths
from gemini_api.datapaths import Datapath, registry
from gemini_api.fusion_genl import FusionError
from gemini_api.theta import ThetaError
from gemini_api.v1 import booster_pb2 as pb

log = logging.getLogger(__name__)
MIN_REFRESH_S = 1.0  # whatever Booster says, at most one GetParameters per second
ARM_JOURNAL = "experiment-arm.json"  # what an applied arm changed, to undo after a crash


def make_resolver(s: AgentSettings) -> ContextResolver:
    table: PrefixTable | MmdbTable | None = None
    if s.geo_mmdb:
        table = MmdbTable(s.geo_mmdb, s.mmdb_region_field, s.mmdb_isp_field)
    elif s.geo_csv:
        table = PrefixTable(s.geo_csv)
    return ContextResolver(Place(s.src_region, s.src_isp), table)


def booster_peers(s: AgentSettings) -> frozenset[tuple[str, int]]:
    """(address, port) of Booster as the kernel will name it in a socket's destination: its
    agent port and, when set, its read port (parameters_address)."""
    addresses = [s.booster_address, *([s.parameters_address] if s.parameters_address else [])]
    return frozenset().union(*(_peers(a) for a in addresses))


def _peers(address: str) -> frozenset[tuple[str, int]]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), proto=socket.IPPROTO_TCP)
    except (OSError, ValueError) as exc:
        log.warning(
            "cannot resolve Booster at %s (%s): its connection may count as a flow", address, exc
        )
        return frozenset()
    return frozenset((str(info[4][0]), int(port)) for info in infos)


def host_datapaths() -> dict[str, HostTheta]:
    """A writer for each datapath whose θ is host-wide, by its apply kind (CUBIC's module
    parameters, FlashPass's θ file); the profile table's datapath has none."""
    return {d.name: w for d in registry() if (w := host_writer(d)) is not None}


def table_appliers(
    s: AgentSettings,
    metrics: AgentMetrics,
    default: Kernel,
    kernels: dict[str, Kernel] | None = None,
) -> dict[str, ThetaApplier]:
    """An applier for each table datapath: the default's through ``default``, any other's
    through ``kernels`` or its own sysctls beside the default's (net.<name>.* under the
    directory holding sysctl_root, which the Helm chart mounts) and its own family."""
    kernels = kernels or {}
    out = {}
    for d in table_datapaths():
        if d == registry().default:
            kernel = default
        else:
            kernel = kernels.get(d.name) or Kernel.of(d, s.sysctl_root, default.use_netlink)
        out[d.name] = ThetaApplier(kernel, metrics, s.staleness_s, d.spec)
    return out


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        kernel: Kernel | None = None,
        net: NetKernel | None = None,
        module_params: dict[str, HostTheta] | None = None,
        table_kernels: dict[str, Kernel] | None = None,
    ) -> None:
        self.s = settings
        self.metrics = AgentMetrics()
        self.resolver = make_resolver(settings)
        self.aggregator = Aggregator(self.resolver, settings.host_id, settings.policy)
        self.spool = Spool(settings.spool_dir, settings.spool_max_bytes)
        self.reporter = Reporter(settings, self.spool, self.metrics)
        self.kernel = kernel or Kernel(sysctl_root=settings.sysctl_root)
        self.tables = table_appliers(settings, self.metrics, self.kernel, table_kernels)
        self.applier = self.tables[registry().default.name]  # Fusion's; its clock is Booster's
        # The journal sits with the spool: state the agent keeps across its own restarts.
        journal = settings.spool_dir.parent / ARM_JOURNAL
        self.arms = ArmApplier(net or NetKernel(settings.net_ipv4_root), self.metrics, journal)
        self.arm: pb.ExperimentArm | None = None  # Booster's last word on this host's arm
        self.module_params = module_params if module_params is not None else host_datapaths()
        self.destinations = Destinations(self.resolver.networks())
        # without flows seen yet, the places holding the most prefixes first
        self.by_size = sorted(
            self.destinations.places, key=lambda p: (-self.destinations.prefix_count[p], p)
        )
        self.kernel_drops = self.record_drops()
        self.stopped = threading.Event()
        self.interval_start_ms = int(time.time() * 1000)
        self.refresh_after_s = settings.interval_s  # until Booster says otherwise
        # Per table datapath: Booster's last answer gave it nothing to run here (a policy of
        # another datapath, no arm of its CC): its table is left alone, also when Booster goes
        # stale. Until an answer says otherwise, the host runs the default datapath.
        self.leaves = {name: a.datapath != registry().default for name, a in self.tables.items()}
        # The last GetParameters failed: the first report that gets through after it shows
        # Booster is back, and θ is asked for then, not at the interval's end.
        self.booster_silent = False
        self.dry_run = DryRun()  # apply_to_kernel false: what would be written, printed

    @property
    def leaves_fusion(self) -> bool:
        """Does the default datapath's table stay alone (see ``leaves``)?"""
        return self.leaves[self.applier.datapath.name]

    def record_drops(self) -> dict[str, int]:
        """The table modules' counts of records lost, summed over the modules loaded."""
        out: dict[str, int] = {}
        for applier in self.tables.values():
            for where, count in applier.kernel.record_drops().items():
                out[where] = out.get(where, 0) + count
        return out

    def ranked_places(self) -> list[Place]:
        """Every place of the destination table, the busiest first."""
        known = set(self.destinations.places)
        busy = [p for p in self.aggregator.busiest_places() if p in known]
        seen = set(busy)
        return busy + [p for p in self.by_size if p not in seen]

    @property
    def policy(self) -> str:
        """The policy asked and reported under: the arm's when a policy tunes it."""
        arm = self.arm
        if arm is not None and arm.params == pb.ExperimentArm.POLICY and arm.policy:
            return arm.policy
        return self.s.policy

    def arm_table(self, arm: pb.ExperimentArm | None) -> ThetaApplier | None:
        """The applier of the table datapath whose CC the arm runs; None for another CC."""
        ran = registry().for_cc(arm.cc) if arm is not None else None
        return self.tables.get(ran.name) if ran is not None else None

    def fixed_plan(self, arm: pb.ExperimentArm | None) -> Plan | None:
        """The θ an arm of a table datapath fixes (its θ, or the spec's default); None when the
        plan holds. Raises ThetaError for a fixed θ outside the spec's wide region."""
        applier = self.arm_table(arm)
        if arm is None or applier is None:
            return None
        spec = applier.spec
        if arm.params == pb.ExperimentArm.KERNEL_DEFAULT:
            return Plan(spec.default(), {})
        if arm.params == pb.ExperimentArm.FIXED:
            theta = spec.validate(dict(arm.fixed_theta.values), spec.limits)
            return Plan(theta, {})
        return None

    def follow_arm(self, resp: pb.GetParametersResponse) -> bool:
        """Take the answer's arm; True when the policy to ask under changed with it. The
        flows so far are reported under the policy they ran for before it changes: a report
        under the new policy holding the old one's θ (another datapath's) is refused whole."""
        arm = resp.experiment_arm if resp.HasField("experiment_arm") else None
        before = self.policy
        self.arm = arm
        if self.policy != before:
            self.close_interval()  # the aggregator still reports under the policy before
        self.aggregator.policy = self.policy
        return self.policy != before

    def apply_arm(self) -> Plan | None:
        """Run the current arm (or restore the host without one); the θ the arm runs in its
        table datapath instead of the plan, None when the plan holds."""
        arm = self.arm
        try:
            fixed = self.fixed_plan(arm)
        except ThetaError as exc:
            log.error("refusing the arm's fixed θ: %s; the host runs its own settings", exc)
            self.metrics.arm_failures.labels("theta_refused").inc()
            arm, fixed = None, None
        return fixed if self.arms.apply(arm) else None

    def apply_tables(
        self,
        resp: pb.GetParametersResponse,
        tuned: Datapath | None,
        asked: list[Place],
        arm_plan: Plan | None,
        rank: list[Place],
    ) -> None:
        """Each table datapath's table: the arm's θ when an arm runs its CC, else the plan when
        the policy tunes it. A datapath neither runs is left alone: no table and no sysctl
        written, so a host without its module (one that tunes its stock CUBIC only) logs no
        error and counts no refused table on every refresh. Its table goes back to the safe
        default once (ThetaApplier.release): when the policy turns from it, its arm ends, or
        the agent starts on such a policy, no tuned θ is left running for flows nobody plans.
        ``tuned``: the datapath the answer's policy tunes (None for a CC no datapath runs)."""
        plans = self.table_plans(resp, tuned, asked, arm_plan)
        for name, applier in self.tables.items():
            self.leaves[name] = plans[name] is None
            self._apply_table(applier, plans[name], rank)

    def table_plans(
        self,
        resp: pb.GetParametersResponse,
        tuned: Datapath | None,
        asked: Sequence[Place],
        arm_plan: Plan | None,
    ) -> dict[str, Plan | None]:
        """What each table datapath runs for Booster's answer: the arm's fixed θ in the table
        whose CC the arm runs, the policy's plan in the table it tunes, None (left alone) in
        the rest. The applying agent and its dry run (gemini_agent.dryrun) both follow it."""
        armed = self.arm_table(self.arm) if arm_plan is not None else None
        plans: dict[str, Plan | None] = {}
        for name, applier in self.tables.items():
            if applier is armed:
                plans[name] = arm_plan
            elif applier.datapath == tuned:
                plans[name] = applier.plan_from(resp, asked)
            else:
                plans[name] = None
        return plans

    def _apply_table(self, applier: ThetaApplier, plan: Plan | None, rank: list[Place]) -> None:
        try:
            if plan is None:
                applier.release(self.destinations)
            else:
                applier.apply(plan, self.destinations, rank)
        except OSError as exc:  # the sysctls are gone: the module was unloaded
            log.error("cannot write %s θ into the kernel: %s", applier.spec.datapath, exc)

    def expire_arm(self, unknown_policy: bool = False) -> None:
        """Booster did not answer: an arm past its end (or crossover) is not run any longer,
        nor one whose policy Booster no longer knows (the host's own policy is asked next)."""
        arm = self.arm
        if arm is None:
            return
        over = arm.until_unix_ms <= time.time() * 1000
        if over or (unknown_policy and self.policy != self.s.policy):
            log.warning("arm %r is over or its policy is gone: restoring the host", arm.arm)
            before = self.policy
            self.arm = None
            if self.policy != before:
                self.close_interval()  # the flows so far ran for the arm's policy
            self.aggregator.policy = self.policy
            if self.s.apply_to_kernel:
                self.arms.apply(None)

    def host_choice(self, resp: pb.GetParametersResponse) -> tuple[str, dict[str, int] | None]:
        """(datapath, θ) the host-wide datapaths should run: an arm of a CC with a host-wide
        spec decides (its fixed θ; None for the kernel's own values), else the policy's plan."""
        arm = self.arm
        ran = registry().for_cc(arm.cc) if arm is not None else None
        if arm is not None and ran is not None and ran.name in self.module_params:
            if arm.params == pb.ExperimentArm.FIXED:
                return ran.name, dict(arm.fixed_theta.values)
            if arm.params == pb.ExperimentArm.KERNEL_DEFAULT:
                return ran.name, None
        tuned = registry().answered(resp.target_cc)
        if tuned is None:  # a CC no datapath of this agent's runs: none is set
            return "", None
        return tuned.name, host_theta(resp, tuned.name)

    def apply_host_theta(self, resp: pb.GetParametersResponse) -> None:
        """Write the θ of the host-wide datapath chosen (gemini_agent.datapath); put back the
        kernel's own values of any other one this agent changed."""
        target, theta = self.host_choice(resp)
        for datapath, params in self.module_params.items():
            if datapath != target or theta is None:
                self._restore_params(params)
                continue
            if not params.available():
                continue
            ran = self.aggregator.datapath_theta  # None after a fallback: baselines
            if params.written is not None and (ran is None or dict(ran.values) != theta):
                self.close_interval()  # each report's flows of this CC ran one θ
            try:
                written = params.write(theta)
            except ThetaError as exc:
                log.error("refusing %s θ: %s", datapath, exc)
                self.metrics.theta_refused.inc()
                continue
            except OSError as exc:
                log.error("cannot write %s θ into the kernel: %s", datapath, exc)
                continue
            self.aggregator.datapath_theta = datapath_message(params.spec, written)

    def check_staleness(self) -> None:
        """Booster has been silent longer than staleness_s: each datapath falls back to its
        spec's default, once per silence (counted and logged per datapath), until Booster
        answers again and its θ is applied as usual. A table datapath's table takes the safe
        default, unless Booster's last answer left it alone (a policy of another datapath, no
        arm of its CC: the table went back to the safe default then, and a host without the
        module would log and count a refused table once per silence); a host-wide datapath
        this agent set (CUBIC's module parameters) takes its spec's default, which for CUBIC
        is the kernel's own defaults."""
        if not self.applier.went_stale():
            return
        for name, applier in self.tables.items():
            if self.leaves[name]:
                continue
            try:
                applier.fall_back(self.destinations)
            except OSError as exc:  # no module on this host: its sysctls are not there
                log.error("cannot write %s's safe default into the kernel: %s", name, exc)
        for params in self.module_params.values():
            if params.written is not None:
                self._fall_back_params(params)

    def _fall_back_params(self, params: HostTheta) -> None:
        """The spec's default into a host-wide datapath, through its usual checked write.
        Its flows from then on ran the kernel's defaults, not Booster's θ: they are reported
        as baselines of that CC (as under a kernel-default arm) until Booster answers."""
        datapath, default = params.spec.datapath, params.spec.default()
        self.close_interval()  # the flows so far ran Booster's θ
        try:
            params.write(default)
        except OSError as exc:
            log.error("cannot write %s's default parameters into the kernel: %s", datapath, exc)
            return
        ran = self.aggregator.datapath_theta
        if ran is not None and ran.datapath == datapath:
            self.aggregator.datapath_theta = None
        log.warning(
            "no θ from Booster for %.0f s: %s falls back to its spec's default %s",
            time.monotonic() - self.applier.last_ok,
            datapath,
            default,
        )
        self.metrics.fallbacks.labels("stale").inc()

    def _restore_params(self, params: HostTheta) -> None:
        """The kernel's own values back in a host-wide datapath this agent set (its policy no
        longer targets it, a kernel-default arm of its CC, a clean exit). The interval closes
        first, as before any change of θ: its flows of that CC ran the θ being taken back and
        are reported as trials of it; only the flows after are that CC's baselines."""
        if params.saved is not None:
            self.close_interval()
        try:
            params.restore()
        except OSError as exc:
            log.error("cannot restore %s's parameters: %s", params.spec.datapath, exc)
        ran = self.aggregator.datapath_theta
        if ran is not None and ran.datapath == params.spec.datapath:
            self.aggregator.datapath_theta = None

    def refresh_theta(self, _retry: bool = False) -> None:
        now = dt.datetime.now(dt.UTC)
        rank = self.ranked_places()
        asked = rank[: self.s.max_contexts]
        self.metrics.contexts_on_catch_all.labels("unasked").set(len(rank) - len(asked))
        req = pb.GetParametersRequest(
            host_id=self.s.host_id,
            policy=self.policy,
            contexts=[self.resolver.message(p, now.hour) for p in asked],
        )
        try:
            resp = self.reporter.get_parameters(req, self.s.rpc_deadline_s)
        except grpc.RpcError as err:
            log.warning("GetParameters failed (%s): keeping the last good θ", err.code().name)
            self.booster_silent = True
            self.expire_arm(unknown_policy=err.code() == grpc.StatusCode.NOT_FOUND)
            if self.s.apply_to_kernel:
                self.check_staleness()
            return
        for applier in self.tables.values():
            applier.booster_answered()
        self.booster_silent = False
        if resp.refresh_after_seconds:
            self.refresh_after_s = max(float(resp.refresh_after_seconds), MIN_REFRESH_S)
        if self.follow_arm(resp) and not _retry:
            self.refresh_theta(_retry=True)  # the plans of the arm's policy, not the host's
            return
        # on the retry the interval closed as the policy changed, before the answer: the flows
        # since then are the new policy's, attributed by the datapath it tunes
        tuned = registry().answered(resp.target_cc)
        self.follow_datapath(tuned, close=not _retry)
        self.aggregator.completion_sums = resp.completion_sums
        if self.s.apply_to_kernel:
            arm_plan = self.apply_arm()
            self.apply_host_theta(resp)
            self.apply_tables(resp, tuned, asked, arm_plan, rank)
        else:
            self.dry_run.show(would_write(self, resp, asked, rank))

    def follow_datapath(self, tuned: Datapath | None, close: bool = True) -> None:
        """The datapath the policy asked under tunes: recorded flows of it are its trials, of
        any other its CC's baselines (gemini_agent.aggregator). The interval closes before it
        changes (``close``): its flows were reported under the datapath before. Not when the
        policy itself just changed (follow_arm closed the interval then): the flows that ended
        while its first answer was on the way are reported under it, so they are judged by
        the datapath it tunes, not by the previous policy's (a report of the host's Fusion
        policy carrying a GEMINI θ is refused whole)."""
        name = tuned.name if tuned is not None else None
        if name != self.aggregator.tuned:
            if close:
                self.close_interval()
            self.aggregator.tuned = name

    def count_kernel_drops(self) -> None:
        """The module's own counts of records it could not deliver, as counters."""
        now = self.record_drops()
        for where, count in now.items():
            if count > self.kernel_drops.get(where, count):
                self.metrics.records_dropped.labels(where).inc(count - self.kernel_drops[where])
        self.kernel_drops = now or self.kernel_drops

    def close_interval(self) -> None:
        # A report's interval ends after it starts (Booster refuses it otherwise), also when
        # a change of θ closes it within the millisecond another close began it.
        end_ms = max(int(time.time() * 1000), self.interval_start_ms + 1)
        report = self.aggregator.close_interval(self.interval_start_ms, end_ms)
        self.interval_start_ms = end_ms
        if report is not None:
            self.reporter.submit(report)

    def tick(self) -> None:
        """One interval's work; also what tests drive directly."""
        self.close_interval()
        self.count_kernel_drops()
        self.reporter.drain()
        self.refresh_theta()

    def make_sources(self) -> list[Source]:
        """The flow sources to start: the records of each table module loaded here, the flow
        log of each user-space transport installed here (FlashPass's), and socket diagnostics
        when on. A host without any of these (one that tunes its stock CUBIC only) has no
        records to read: with socket diagnostics on, the agent still runs on their flows and
        says so once; with them off it would report nothing, so it stops at start, naming both
        ways out (a Fusion fleet's host missing its module is a deployment error to see at
        once, not an agent that runs and reports nothing)."""
        sources: list[Source] = []
        missing: list[Exception] = []
        for d in recorded_datapaths():
            try:
                sources.append(RecordSource(self.aggregator.add, self.metrics, d))
            except (FusionError, OSError) as exc:
                missing.append(exc)
        add = self.aggregator.add
        sources += flow_log_sources(add, self.metrics, self.module_params, self.s.interval_s)
        if not sources and missing:
            if not self.s.sockdiag:
                raise FusionError(
                    f"{missing[0]} (a host without Fusion reports flows through sockdiag = true)"
                ) from missing[0]
            log.warning(
                "no Fusion flow records on this host (%s): flows come from socket diagnostics",
                missing[0],
            )
        for absent in missing if sources else []:
            log.info("no flow records of this module: %s", absent)
        if self.s.sockdiag:
            sources.append(
                SockDiagSource(
                    self.aggregator.add, self.metrics, self.s.sockdiag_dump_s, booster_peers(self.s)
                )
            )
        return sources

    def drain_between_intervals(self) -> bool:
        """A spool left by an outage drains between intervals. When a report gets through
        while θ could not be fetched, Booster is back: its θ is asked for at once, so the
        host does not run the safe default (or a stale θ) until the interval's end. True
        when θ was asked for."""
        if not self.reporter.drain() or not self.booster_silent:
            return False
        self.refresh_theta()
        return True

    def run(self) -> None:
        host, _, port = self.s.metrics_listen.rpartition(":")
        start_http_server(int(port), addr=host, registry=self.metrics.registry)
        sources = self.make_sources()
        for source in sources:
            source.start()
        if self.s.apply_to_kernel:
            self.arms.recover()  # an arm a previous run left applied (it did not exit cleanly)
        self.refresh_theta()
        next_close = time.monotonic() + self.s.interval_s
        last_refresh = time.monotonic()
        try:
            while not self.stopped.wait(min(1.0, max(0.0, next_close - time.monotonic()))):
                now = time.monotonic()
                if now >= next_close:
                    self.tick()
                    next_close += self.s.interval_s
                    last_refresh = time.monotonic()
                elif now - last_refresh >= self.refresh_after_s:
                    self.refresh_theta()  # Booster asked to be asked sooner than each interval
                    last_refresh = time.monotonic()
                elif self.drain_between_intervals():
                    last_refresh = time.monotonic()
        finally:
            for source in sources:
                source.stop()
            self.close_interval()
            if self.s.apply_to_kernel:
                self.arms.restore()  # a clean exit leaves the host's own CC settings
                for params in self.module_params.values():
                    self._restore_params(params)
            self.reporter.drain_at_exit()  # after the kernel is restored: it may wait
