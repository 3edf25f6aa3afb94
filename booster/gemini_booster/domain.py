"""Booster's domain values, defined once and imported by every layer above (policy, storage,
service): a context, the running sums of eq. 9, and a trial.

Eq. 9 is f = mean over flows of (throughput − σ·queueing delay). It is linear in per-flow values,
so five running sums (Σx, Σx², Σd, Σd², Σx·d) and the flow count give, for any σ, the exact mean
utility and the sample variance of per-flow utility; their sum over reports, trials or whole
arms is again such a set of sums. ``FlowSums`` is that value; ``utility(σ)`` is the only place
eq. 9 is computed. It lives in ``gemini_api.sums``, beside the API, because agents build the
same sums from their flows; it is re-exported here as part of Booster's domain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from gemini_api.sums import SINGLE_FLOW_STD, SUM_FIELDS, FlowSums, Utility

__all__ = [
    "SINGLE_FLOW_STD",
    "SUM_FIELDS",
    "ContextKey",
    "FlowSums",
    "Trial",
    "Utility",
    "merge_buckets",
]

CONTEXT_FIELDS = ("src_region", "src_isp", "dst_region", "dst_isp", "hour")
# ContextKey.label read back: src_region/src_isp->dst_region/dst_isp@hour
_LABEL = re.compile(r"^(?P<sr>[^/]*)/(?P<si>.*)->(?P<dr>[^/]*)/(?P<di>.*)@(?P<h>\d+)$")


class ContextKey(NamedTuple):
    """The hidden variables h of a flow (Gemini Table II): who talks to whom, over which ISPs,
    at what hour. A tuple, so it is hashable and orders the same everywhere."""

    src_region: str
    src_isp: str
    dst_region: str
    dst_isp: str
    hour: int

    @property
    def label(self) -> str:
        return f"{self.src_region}/{self.src_isp}->{self.dst_region}/{self.dst_isp}@{self.hour}"

    @classmethod
    def from_label(cls, label: str) -> ContextKey | None:
        """The key whose ``label`` this is (the dashboard and REST name contexts by label);
        None when ``label`` is not one."""
        m = _LABEL.match(label)
        return None if m is None else cls(m["sr"], m["si"], m["dr"], m["di"], int(m["h"]))

    def as_dict(self) -> dict[str, str | int]:
        return self._asdict()


@dataclass(frozen=True)
class Trial:
    """Everything seen of one θ (or one baseline CC) in one context of one policy, in one time
    bucket: the sums of flows that ran from ``bucket`` for the policy's bucket width (None: not
    split by time). Buckets let the history window drop old flows of a θ that keeps running."""

    context_id: int
    theta_key: str
    sums: FlowSums
    slow_flows: int
    report_count: int
    last_seen: datetime
    bucket: datetime | None = None

    @property
    def flow_count(self) -> int:
        return self.sums.flow_count

    @property
    def slow_flow_share(self) -> float:
        return self.slow_flows / self.sums.flow_count if self.sums.flow_count else 0.0


def merge_buckets(trials: Iterable[Trial]) -> list[Trial]:
    """One trial per (context, θ): the sums of its time buckets added, which is exact because
    eq. 9 is linear in them; ``last_seen`` is the newest bucket's, ``bucket`` None."""
    groups: dict[tuple[int, str], list[Trial]] = {}
    for t in trials:
        groups.setdefault((t.context_id, t.theta_key), []).append(t)
    return [
        Trial(
            context_id,
            theta_key,
            FlowSums.total(t.sums for t in group),
            sum(t.slow_flows for t in group),
            sum(t.report_count for t in group),
            max(t.last_seen for t in group),
        )
        for (context_id, theta_key), group in groups.items()
    ]
