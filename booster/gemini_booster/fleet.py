"""A demo fleet of synthetic hosts that talk to Booster over its real gRPC API.

Each host asks for θ per context, "runs" flows whose outcome comes from ``simulation`` (a known
utility surface, not a network), and reports aggregates with an idempotency key. Used by the demo,
the convergence tests and the benchmarks; the lab (real kernels) replaces it end to end.

A host that Booster puts in an experiment arm runs the arm as an agent would: another CC's arm
(the control's "cubic") reports that CC's flows without θ, a fixed arm its θ, a kernel-default
arm the spec's default, a policy arm the plan. A round may be dated (``start_ms``): the demo
replays hours of simulated history that way, each round an interval of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np

from gemini_api.service_config import channel_options
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc

from . import simulation as sim


def theta_of(msg: pb.Theta) -> dict[str, int]:
    return load_spec().from_message(msg)


@dataclass
class RoundResult:
    reports: int
    incumbents: dict[tuple, dict[str, int]]
    arms: dict[str, str] = field(default_factory=dict)  # host → the experiment arm it ran


def host_ids(count: int) -> list[str]:
    """The demo fleet's host ids."""
    return [f"demo-host-{i:03d}" for i in range(count)]


class SyntheticFleet:
    def __init__(
        self,
        target: str,
        token: str | Mapping[str, str],
        policy: str,
        contexts: Sequence[sim.SyntheticContext] = sim.DEFAULT_CONTEXTS,
        hosts_per_context: int = 8,
        flows_per_report: int = 50,
        sigma: float = 1.0,
        seed: int = 0,
        hosts: Sequence[str] | None = None,
    ):
        self.channel = grpc.insecure_channel(target, options=channel_options())
        self.stub = pb_grpc.BoosterStub(self.channel)
        self.policy = policy
        self.contexts = list(contexts)
        self.hosts = list(hosts) if hosts is not None else host_ids(hosts_per_context)
        # One token per host, as a real fleet has; one shared (unbound) token for any host if
        # Booster is set to allow such tokens.
        tokens = token if isinstance(token, Mapping) else dict.fromkeys(self.hosts, token)
        self.metadata = {h: (("authorization", f"Bearer {tokens[h]}"),) for h in self.hosts}
        self.flows = flows_per_report
        self.sigma = sigma
        self.rng = np.random.default_rng(seed)

    def close(self) -> None:
        self.channel.close()

    def ask(self, host: str) -> pb.GetParametersResponse:
        req = pb.GetParametersRequest(
            host_id=host, policy=self.policy, contexts=[c.message() for c in self.contexts]
        )
        reply: pb.GetParametersResponse = self.stub.GetParameters(
            req, metadata=self.metadata[host], timeout=10
        )
        return reply

    def parameters(self, host: str) -> list[pb.ContextParameters]:
        return list(self.ask(host).parameters)

    def _flows(
        self, reply: pb.GetParametersResponse, incumbents: dict[tuple, dict[str, int]]
    ) -> list[pb.Aggregate]:
        """One host's aggregates for the answer it got: its arm's CC or θ, else the plan's θ
        (the incumbents it was told to exploit noted in ``incumbents``)."""
        arm = reply.experiment_arm if reply.HasField("experiment_arm") else None
        if arm is not None and arm.cc != reply.target_cc:
            return [
                sim.baseline_aggregate(ctx, arm.cc, self.flows, self.rng, self.sigma)
                for ctx in self.contexts
            ]
        fixed = None
        if arm is not None and arm.params == pb.ExperimentArm.FIXED:
            fixed = dict(arm.fixed_theta.values)
        elif arm is not None and arm.params == pb.ExperimentArm.KERNEL_DEFAULT:
            fixed = sim.baseline_theta()
        aggregates = []
        for ctx, params in zip(self.contexts, reply.parameters, strict=True):
            theta = fixed or theta_of(params.theta)
            if fixed is None and not params.exploratory:
                incumbents[ctx.key] = theta
            aggregates.append(sim.make_aggregate(ctx, theta, self.sigma, self.flows, self.rng))
        return aggregates

    def run_round(
        self, index: int, start_ms: int | None = None, interval_ms: int = 300_000
    ) -> RoundResult:
        """Every host asks, runs and reports once; over the interval that ends now, or the
        one from ``start_ms`` (a simulated clock)."""
        incumbents: dict[tuple, dict[str, int]] = {}
        arms: dict[str, str] = {}
        reports = 0
        for host in self.hosts:
            reply = self.ask(host)
            if reply.HasField("experiment_arm"):
                arms[host] = reply.experiment_arm.arm
            aggregates = self._flows(reply, incumbents)
            report = sim.make_report(host, self.policy, aggregates, start_ms, interval_ms)
            self.stub.ReportAggregates(report, metadata=self.metadata[host], timeout=30)
            reports += 1
        return RoundResult(reports, incumbents, arms)
