"""A demo fleet of synthetic hosts that talk to Booster over its real gRPC API.

Each host asks for θ per context, "runs" flows whose outcome comes from ``simulation`` (a known
utility surface, not a network), and reports aggregates with an idempotency key. Used by the demo,
the convergence tests and the benchmarks; the lab (real kernels) replaces it end to end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
    ):
        self.channel = grpc.insecure_channel(target, options=channel_options())
        self.stub = pb_grpc.BoosterStub(self.channel)
        self.policy = policy
        self.contexts = list(contexts)
        self.hosts = host_ids(hosts_per_context)
        # One token per host, as a real fleet has; one shared (unbound) token for any host if
        # Booster is set to allow such tokens.
        tokens = token if isinstance(token, Mapping) else dict.fromkeys(self.hosts, token)
        self.metadata = {h: (("authorization", f"Bearer {tokens[h]}"),) for h in self.hosts}
        self.flows = flows_per_report
        self.sigma = sigma
        self.rng = np.random.default_rng(seed)

    def close(self) -> None:
        self.channel.close()

    def parameters(self, host: str) -> list[pb.ContextParameters]:
        req = pb.GetParametersRequest(
            host_id=host, policy=self.policy, contexts=[c.message() for c in self.contexts]
        )
        reply = self.stub.GetParameters(req, metadata=self.metadata[host], timeout=10)
        return list(reply.parameters)

    def run_round(self, index: int) -> RoundResult:
        incumbents: dict[tuple, dict[str, int]] = {}
        reports = 0
        for host in self.hosts:
            aggregates = []
            for ctx, params in zip(self.contexts, self.parameters(host), strict=True):
                theta = theta_of(params.theta)
                if not params.exploratory:
                    incumbents[ctx.key] = theta
                aggregates.append(sim.make_aggregate(ctx, theta, self.sigma, self.flows, self.rng))
            report = sim.make_report(host, self.policy, aggregates)
            self.stub.ReportAggregates(report, metadata=self.metadata[host], timeout=30)
            reports += 1
        return RoundResult(reports, incumbents)
