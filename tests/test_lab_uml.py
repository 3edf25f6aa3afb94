"""The UML lab's figures are a function of the experiment alone: the same plan booted twice
gives the same flows. Its clock is simulated (time-travel=inf-cpu), so how busy the host is
changes only how long the run takes; nothing here depends on host speed. The cubic flows keep
the check independent of Fusion's datapath; the cellular path replays a capacity trace.

Lossy paths are left out. netem draws from a fixed seed per queue
(lab/uml/netem-fixed-seed.patch), and the job's own directory on the kernel's command line no
longer seeds the guest's generator (lab/uml/no-host-randomness.patch): two runs on an idle host
now give every lossy flow byte for byte, from two job directories. With every host core busy
they still moved (satellite/fusion: 8.4 against 9.2 MB; benchmarks/results/lab-determinism.md),
so host timing still reaches the guest somewhere, and a check on them would pass or fail with
the host's load.

Needs Debian's linux-source-6.1, flex and bison (lab/install-deps.sh); the kernel is built once
into var/uml/ by lab/uml/build-kernel.sh (about 8 minutes on 2 cores), then reused."""

from __future__ import annotations

import pytest

from gemini_lab import plans, scenario
from gemini_lab.host import run_plan
from gemini_lab.vm import LabError

pytestmark = [pytest.mark.lab, pytest.mark.slow]

# The bound for repeated runs in UML.
TOLERANCE = 0.02
DURATION_S = 10
CCS = ("cubic", "fusion")


@pytest.fixture(scope="module")
def twice(tmp_path_factory) -> list[dict]:
    paths = [scenario.load(n) for n in ("ethernet", "cellular")]
    plan = plans.repeat_plan(paths, CCS, DURATION_S)
    runs = []
    for i in range(2):
        try:
            runs.append(run_plan(plan, tmp_path_factory.mktemp(f"uml-{i}"), backend="uml"))
        except LabError as exc:
            if "missing" in str(exc):
                pytest.skip(str(exc))
            raise
    return runs


# cellular replays a capacity trace: each flow restarts it (netem.RateSchedule), so a flow's
# figures do not depend on what ran before it. Fusion there is left out: its delay signal reads
# the trace's rate changes to the microsecond, and two boots once differed by 2.4 % in bytes.
LABELS = ["ethernet/cubic", "ethernet/fusion", "cellular/cubic"]


@pytest.mark.parametrize("label", LABELS)
def test_the_same_flow_twice_carries_the_same_bytes(twice, label):
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
