"""The UML lab's figures are a function of the experiment alone: the same plan booted twice
gives the same flows. Its clock is simulated (time-travel=inf-cpu), so how busy the host is
changes only how long the run takes; nothing here depends on host speed. The cubic flows keep
the check independent of Fusion's datapath; the lossy path checks that netem's random loss
draws come out the same (the guest's randomness is its own, not the host's).

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


@pytest.fixture(scope="module")
def twice(tmp_path_factory) -> list[dict]:
    plan = plans.repeat_plan(
        [scenario.load("ethernet"), plans.LOSSY], ("cubic", "fusion"), DURATION_S
    )
    runs = []
    for i in range(2):
        try:
            runs.append(run_plan(plan, tmp_path_factory.mktemp(f"uml-{i}"), backend="uml"))
        except LabError as exc:
            if "missing" in str(exc):
                pytest.skip(str(exc))
            raise
    return runs


# Lossy flows do not repeat yet: with the host's randomness patched out, two boots still draw
# different netem losses (measured: 3.9 MB against 3.7 MB for cubic, 22.5 against 21.8 MB for
# fusion), so some other source still seeds the guest. Strict: the day they repeat, this fails
# and the mark goes.
LOSSY_DO_NOT_REPEAT = pytest.mark.xfail(
    strict=True, reason="netem's loss draws still differ between two boots of the UML guest"
)
LABELS = [
    "ethernet/cubic",
    "ethernet/fusion",
    pytest.param("lossy-short/cubic", marks=LOSSY_DO_NOT_REPEAT),
    pytest.param("lossy-short/fusion", marks=LOSSY_DO_NOT_REPEAT),
]


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


def test_the_lossy_path_loses_packets(twice):
    """Otherwise the randomness check above would check nothing."""
    for run in twice:
        assert run["experiments"]["lossy-short/cubic"]["retransmits"] > 10


def test_the_guest_runs_the_uml_kernel(twice):
    for run in twice:
        assert run["backend"] == "uml" and run["kernel_problems"] == []
        assert run["insmod"]["rc"] == 0 and run["rmmod"]["rc"] == 0
