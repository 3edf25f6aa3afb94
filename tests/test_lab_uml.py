"""The UML lab's figures are a function of the experiment alone: the same plan booted twice,
once on an idle host and once with every host core kept busy by spinning processes, gives the
same flows. Its clock is simulated (time-travel=inf-cpu), so how busy the host is changes only
how long the run takes; nothing here depends on host speed. The cubic flows keep the check
independent of Fusion's datapath; the cellular path replays a capacity trace, and the lossy
path draws its losses from netem's fixed seed (lab/uml/netem-fixed-seed.patch).

What used to let host load in (lossy flows moved by up to 9 % of bytes with both cores busy):
the console was a pipe, whose reader's SIGIO reached the guest as a console interrupt at a
simulated time set by host scheduling, and from there the guest's random generator, which
times ARP probes and IPv6 router solicitations; each such packet through a lossy netem queue
takes one of its loss draws. The console is now a file, the lab's veth ends have permanent
neighbours and the guest boots with IPv6 off (lab/gemini_lab/uml.py, netem.py).

Needs Debian's linux-source-6.1, flex and bison (lab/install-deps.sh); the kernel is built once
into var/uml/ by lab/uml/build-kernel.sh (about 8 minutes on 2 cores), then reused."""

from __future__ import annotations

from contextlib import nullcontext

import pytest

from gemini_lab import plans, scenario
from gemini_lab.determinism import busy_host
from tests.labkit import lab_plan

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# The bound for repeated runs in UML.
TOLERANCE = 0.02
DURATION_S = 10
CCS = ("cubic", "fusion")


@pytest.fixture(scope="module")
def twice(tmp_path_factory) -> list[dict]:
    paths = [scenario.load(n) for n in ("ethernet", "cellular")] + [plans.LOSSY]
    plan = plans.repeat_plan(paths, CCS, DURATION_S)
    runs = []
    for i, load in enumerate((nullcontext, busy_host)):
        with load():
            runs.append(lab_plan(plan, tmp_path_factory.mktemp(f"uml-{i}"), backend="uml"))
    return runs


# cellular replays a capacity trace: each flow restarts it (netem.RateSchedule), so a flow's
# figures do not depend on what ran before it. Fusion there is left out: its delay signal reads
# the trace's rate changes to the microsecond, and two boots once differed by 2.4 % in bytes.
LABELS = [
    "ethernet/cubic",
    "ethernet/fusion",
    "cellular/cubic",
    f"{plans.LOSSY.name}/cubic",
    f"{plans.LOSSY.name}/fusion",
]


@pytest.mark.parametrize("label", LABELS)
def test_the_same_flow_idle_and_under_load_carries_the_same_bytes(twice, label):
    first, second = (run["experiments"][label] for run in twice)
    assert "error" not in first and "error" not in second, (first, second)
    assert first["bytes_received"] > 0
    for figure in ("bytes_received", "throughput_mbps"):
        assert second[figure] == pytest.approx(first[figure], rel=TOLERANCE), figure
    assert abs(second["retransmits"] - first["retransmits"]) <= max(
        2, TOLERANCE * first["retransmits"]
    )


def test_the_guest_runs_the_uml_kernel(twice):
    for run in twice:
        assert run["backend"] == "uml" and run["kernel_problems"] == []
        assert run["insmod"]["rc"] == 0 and run["rmmod"]["rc"] == 0
