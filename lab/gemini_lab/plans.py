"""Experiment plans: what the acceptance tests and the benchmark run in one guest boot each."""

from __future__ import annotations

from gemini_lab import scenario

CCS = ("cubic", "bbr", "vegas", "reno")
# the acceptance plans' own paths (why each: its file in scenarios/)
LOSSY = scenario.load("lossy-short")  # λ decides how much of the link a lossy flow keeps
LAN = scenario.load("lan")
CPU_PATH = scenario.load("cpu")  # a rate every CC fills: CPU per byte compares like with like


def outcome_plan(duration_s: int = 20) -> dict:
    """The network outcomes, for the UML lab's simulated clock: the Ethernet rate, λ's effect
    on a lossy path, two destination profiles at once, record byte counts."""
    paths = [scenario.load("ethernet"), LOSSY]
    return {
        "paths": [p.to_dict() for p in paths],
        "experiments": [
            {
                "label": "ethernet-default",
                "kind": "flow",
                "path": 0,
                "cc": "fusion",
                "duration_s": duration_s,
                "omit_s": 2,
            },
            {
                "label": "lossy-lambda-0.3",
                "kind": "flow",
                "path": 1,
                "cc": "fusion",
                "duration_s": duration_s,
                "theta": {"loss_threshold": 0, "mult_decrease": 30},
            },
            {
                "label": "lossy-lambda-0.9",
                "kind": "flow",
                "path": 1,
                "cc": "fusion",
                "duration_s": duration_s,
                "theta": {"loss_threshold": 0, "mult_decrease": 90},
            },
            {
                "label": "two-profiles",
                "kind": "profiles",
                "paths": [0, 1],
                "duration_s": duration_s,
                "thetas": [
                    {"mult_decrease": 80, "loss_threshold": 0},
                    {"mult_decrease": 40, "loss_threshold": 20, "window_intervals": 8},
                ],
            },
        ],
    }


def module_plan() -> dict:
    """The module in Debian's stock kernel (qemu): refused writes, the agent's write-back,
    records of flows that all end at once, other CCs' flows seen through socket diagnostics;
    and, around them, loading and unloading it."""
    return {
        "paths": [LAN.to_dict()],
        "experiments": [
            {"label": "rejects", "kind": "rejects"},
            {**BURST, "path": 0, "flows": 3000},
            {"label": "writeback", "kind": "writeback"},
            {"label": "sockdiag", "kind": "sockdiag", "path": 0, "duration_s": 5, "flows": 300},
        ],
    }


BURST = {"label": "records-burst", "kind": "records", "workers": 2, "burst": True}


def records_plan(flows: int, workers: int, burst: int = 0) -> dict:
    """Short flows over the LAN path, to load the flow-record path; with ``burst``, also that
    many flows ended at once."""
    experiments = [
        {"label": "records", "kind": "records", "path": 0, "flows": flows, "workers": workers}
    ]
    if burst:
        experiments.append({**BURST, "path": 0, "flows": burst})
    return {"paths": [LAN.to_dict()], "experiments": experiments}


# θ set by hand for the benchmark, besides the default.
HAND_THETAS = {
    "fusion-loss-tolerant": {"loss_threshold": 10, "mult_decrease": 90},
    "fusion-delay-strict": {"rtt_threshold": 10, "mult_increase": 100, "mult_decrease": 80},
}


# An 800 ms path needs more round trips than the others to leave slow start behind.
LONG_RTT_FACTOR = 2


def benchmark_plan(duration_s: int = 30, *, cpu: bool = True) -> dict:
    """Table IV: Fusion (default and hand-set θ) against the kernel's CCs; with ``cpu``, the
    guest's CPU per byte, which only an emulated CPU measures (UML's simulated clock lets CPU
    work take no time at all)."""
    paths = [scenario.load(n) for n in ("ethernet", "satellite", "cellular")] + [CPU_PATH]
    experiments: list[dict] = []
    for i, p in enumerate(paths[:3]):
        secs = duration_s * (LONG_RTT_FACTOR if p.rtt_ms >= 500 else 1)
        runs: list[tuple[str, dict[str, int], str]] = [("fusion", {}, "fusion")]
        runs += [(cc, {}, cc) for cc in CCS]
        runs += [("fusion", theta, name) for name, theta in HAND_THETAS.items()]
        for cc, theta, name in runs:
            experiments.append(
                {
                    "label": f"{p.name}/{name}",
                    "kind": "flow",
                    "path": i,
                    "cc": cc,
                    "theta": theta,
                    "duration_s": secs,
                    "omit_s": 0,
                }
            )
    if cpu:
        experiments.append(_CPU_EXPERIMENT)
    return {"paths": [p.to_dict() for p in paths], "experiments": experiments}


_CPU_EXPERIMENT = {
    "label": "cpu",
    "kind": "cpu",
    "path": 3,
    "ccs": ["cubic", "fusion"],
    "flow_counts": [1, 10, 100],
    "duration_s": 10,
    "repeats": 2,
}


def repeat_plan(scenarios: list[scenario.Scenario], ccs: tuple[str, ...], duration_s: int) -> dict:
    """One flow of each CC on each path, for running the same plan again and comparing."""
    experiments = [
        {
            "label": f"{p.name}/{cc}",
            "kind": "flow",
            "path": i,
            "cc": cc,
            "duration_s": duration_s * (LONG_RTT_FACTOR if p.rtt_ms >= 500 else 1),
        }
        for i, p in enumerate(scenarios)
        for cc in ccs
    ]
    return {"paths": [p.to_dict() for p in scenarios], "experiments": experiments}
