"""What the lab tests share: where the lab cannot run here (no guest kernel, no UML build, a
missing tool), a lab test is skipped with the lab's own reason instead of failing; any other
lab error still fails the test. And the fleet runs' setup: lab hosts against a Booster of
their own."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from gemini_booster.config import Settings
from gemini_lab.host import Backend, kernel_problems, run_plan
from gemini_lab.vm import GuestKernel, LabError, find_kernel, run_in_guest
from tests.conftest import OPERATOR, free_port, lab_fleet_settings, new_database

C = TypeVar("C")
R = TypeVar("R")

# words in a LabError's text that say the lab is not installed here, not that a run went wrong
MISSING = ("missing",)


def guest_kernel() -> GuestKernel:
    """The installed guest kernel; the test is skipped where none is installed."""
    try:
        return find_kernel()
    except LabError as exc:
        pytest.skip(str(exc))


@contextmanager
def skip_if_lab_missing(*also: str) -> Iterator[None]:
    """Skip the test on a LabError that says a lab part is missing (or any word of ``also``);
    re-raise any other LabError."""
    try:
        yield
    except LabError as exc:
        if any(word in str(exc) for word in MISSING + also):
            pytest.skip(str(exc))
        raise


def lab_plan(plan: dict, out: Path, backend: Backend | None = None) -> dict:
    """``run_plan``'s results, on the lab's default backend unless ``backend`` is named; the
    test is skipped where a lab part is missing."""
    with skip_if_lab_missing():
        if backend is None:
            return run_plan(plan, out)
        return run_plan(plan, out, backend=backend)


def healthy_uml_run(plan: dict, out: Path) -> dict:
    """``plan``'s results in the UML guest, asserted to have run with no guest failure and no
    kernel problem (warning, oops, taint) in its log."""
    results = lab_plan(plan, out, backend="uml")
    assert results["guest_failure"] is None, results["guest_failure"]
    assert results["kernel_problems"] == [], results["kernel_problems"]
    return results


FleetRun = Callable[[Callable[[str], Settings], int, str, Path, C], R]


def fleet_run(run: FleetRun[C, R], pg_admin_url: str, out: Path, cfg: C) -> R:
    """``run`` (run_abtest, run_cubic: lab hosts against a Booster) on a database of its own,
    the hosts with tokens bound to them; skipped where no guest kernel is installed."""
    guest_kernel()
    settings = lab_fleet_settings(new_database(pg_admin_url))
    return run(settings, free_port(), OPERATOR, out, cfg)


def run_guest_job(
    out: Path, kernel: GuestKernel, job: str, kmod_dir: Path, plan: dict, timeout_s: float = 900
) -> dict:
    """Run ``job`` (a Python script: ``job.py <kmod_dir> <plan.json> <results.json>``) in a qemu
    guest and return its results, with the guest's rc, the job log's tail and the kernel's
    problems (warnings, oopses) from dmesg and the console; skipped where the lab is missing."""
    (out / "job.py").write_text(job)
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    command = " ".join(
        [
            shlex.quote(sys.executable),
            '"$GEMINI_LAB_OUT/job.py"',
            shlex.quote(str(kmod_dir)),
            '"$GEMINI_LAB_OUT/plan.json"',
            '"$GEMINI_LAB_OUT/results.json"',
        ]
    )
    with skip_if_lab_missing():
        run = run_in_guest(command, out, kernel=kernel, timeout_s=timeout_s)
    results_path = out / "results.json"
    job_log = (out / "job.log").read_text() if (out / "job.log").exists() else ""
    assert results_path.exists(), f"no results (rc {run.returncode}):\n{job_log[-4000:]}"
    results = json.loads(results_path.read_text())
    results["guest_rc"] = run.returncode
    results["job_log"] = job_log[-4000:]
    results["kernel_problems"] = kernel_problems(run.dmesg + "\n" + run.console)
    return results
