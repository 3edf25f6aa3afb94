"""What the lab's recorded UML measurements share (fairness, short flows, the long-flow
evaluation): the CCs they compare, θ given on the command line, one boot's results or several
boots' merged, and the record written with the command that made it."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from gemini_api.sums import FlowSums
from gemini_api.theta import load_spec
from gemini_lab.host import run_plan

RUN_TIMEOUT_S = 7200  # one boot's wall-clock limit, a stall guard
Config = TypeVar("Config")


@dataclass(frozen=True)
class Contender:
    """A CC as the figures name it: ``fusion-tuned`` is cc fusion with its own θ."""

    name: str
    cc: str
    theta: dict[str, int]


def merged(paths: list[Path]) -> dict:
    """The experiments of several runs' results.json as one result (the first run's kernel)."""
    runs = [json.loads(p.read_text()) for p in paths]
    experiments = {k: v for r in runs for k, v in r["experiments"].items()}
    return {**runs[0], "experiments": experiments}


def run_or_merge(
    plan: dict,
    out: Path,
    progress: Callable[[str, dict], None] | None,
    merge: list[Path] | None,
) -> dict:
    """The plan's results from one UML boot (kept in ``out``/results.json), or, with ``merge``,
    those runs' results as one, without running anything."""
    if merge:
        return merged(merge)
    results = run_plan(plan, out, backend="uml", progress=progress, timeout_s=RUN_TIMEOUT_S)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return results


@dataclass(frozen=True)
class Measurement(Generic[Config]):
    """One recorded UML measurement: how a configuration becomes a plan, how results become
    the record, each experiment's progress line, and what makes results not a measurement."""

    build_plan: Callable[[Config], dict]
    render: Callable[[dict, Config, str], str]
    progress_line: Callable[[str, dict], str]
    check: Callable[[dict, Config], list[str]] | None = None

    def run(
        self,
        cfg: Config,
        out: Path,
        command: str,
        record: Path | None,
        progress: Callable[[str, dict], None] | None = None,
        merge: list[Path] | None = None,
    ) -> str:
        """Run ``cfg``'s plan in UML, or with ``merge`` render recorded runs of the same
        settings as one (e.g. one run per position) without running anything; refuse results
        ``check`` finds wrong (nothing is written then), render them and write the record."""
        results = run_or_merge(self.build_plan(cfg), out, progress, merge)
        if self.check and (wrong := self.check(results, cfg)):
            raise RuntimeError("results not as asked:\n" + "\n".join(wrong[:10]))
        text = self.render(results, cfg, command)
        if record:
            record.write_text(text)
        return text


def provenance(command: str, results: dict) -> str:
    """The line under a record's title: the command that made it, the day, and the simulated
    kernel its figures come from."""
    return (
        f"Command: `{command}` (recorded {dt.date.today().isoformat()}, User-Mode Linux "
        f"{results.get('kernel')} with time-travel=inf-cpu: figures on the guest's simulated "
        "clock, independent of host load)."
    )


def flow_utility(throughput_mbps: float, queue_delay_ms: float, sigma: float) -> float:
    """Eq. 9 for one flow (Mbit/s − σ · ms of queueing), as gemini_api.sums computes it for
    Booster: the lab's figures and Booster's trials are the one formula."""
    return FlowSums.of_flow(throughput_mbps, queue_delay_ms).utility(sigma).mean


def opening(title: str, command: str, results: dict) -> list[str]:
    """A record's first lines: its title, then where its figures come from."""
    return [f"# {title}", "", provenance(command, results), ""]


def tuned_text(theta: dict[str, int] | None) -> str:
    """fusion-tuned's θ as a record names it."""
    return json.dumps(theta) if theta else "none"


def load_theta(text: str) -> dict[str, int]:
    """θ from JSON text or a JSON file's path, checked against the spec's names and Θ′."""
    path = Path(text)
    data = json.loads(path.read_text() if path.is_file() else text)
    spec = load_spec()
    for name, value in data.items():
        if name not in spec.names:
            raise ValueError(f"θ: {name!r} is not one of {', '.join(spec.names)}")
        lo, hi = spec.param(name).wide
        if not isinstance(value, int) or not lo <= value <= hi:
            raise ValueError(f"θ: {name} = {value!r} is not an integer in [{lo}, {hi}]")
    return dict(data)
