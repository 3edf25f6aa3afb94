"""Host side: build the module for the guest kernel, boot the lab guest on a plan, read results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gemini_lab.vm import GuestKernel, LabError, find_kernel, run_in_guest

REPO = Path(__file__).resolve().parents[2]
KMOD_DIR = REPO / "fusion-kmod"
# A tcp_fusion.ko built elsewhere (against the guest kernel) to load instead of building one.
FUSION_KO_ENV = "GEMINI_LAB_FUSION_KO"
# What a healthy kernel never prints.
KERNEL_PROBLEMS = re.compile(
    r"WARNING:|BUG:|Oops|Call Trace|general protection fault|kernel BUG|UBSAN|KASAN|"
    r"refcount_t:|list_add corruption|list_del corruption|stack-protector",
)


def build_module(kernel: GuestKernel, *, warnings_as_errors: bool = True) -> str:
    """`make W=1` against the guest kernel's headers; returns the compiler's output."""
    if not kernel.headers_dir.exists():
        raise LabError(f"no headers for {kernel.release}: install linux-headers-{kernel.release}")
    out = subprocess.run(
        ["make", "-C", str(KMOD_DIR), f"KVER={kernel.release}", "W=1"],
        capture_output=True,
        text=True,
    )
    log = out.stdout + out.stderr
    if out.returncode != 0:
        raise LabError(f"module build failed:\n{log[-4000:]}")
    if warnings_as_errors and "warning:" in log:
        raise LabError(f"module build has warnings:\n{log[-4000:]}")
    return log


def module_for(kernel: GuestKernel) -> Path:
    """The tcp_fusion.ko the guest loads: $GEMINI_LAB_FUSION_KO as given, or one built here
    against the guest kernel's headers."""
    given = os.environ.get(FUSION_KO_ENV)
    if given:
        ko = Path(given).resolve()
        if not ko.is_file():
            raise LabError(f"{FUSION_KO_ENV}={given} is not a file")
        return ko
    build_module(kernel)
    return KMOD_DIR / "tcp_fusion.ko"


def kernel_problems(log: str) -> list[str]:
    """Warnings, oopses and traces, up to the guest's own power-off."""
    log = log.split("sysrq: Power Off")[0]
    return [line for line in log.splitlines() if KERNEL_PROBLEMS.search(line)]


def run_plan(plan: dict, out_dir: Path, *, timeout_s: float = 1800) -> dict:
    """Build, boot, run the plan in the guest; the results plus the kernel log's problems."""
    kernel = find_kernel()
    module = module_for(kernel)
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    plan_path, results_path = out_dir / "plan.json", out_dir / "results.json"
    plan_path.write_text(json.dumps({**plan, "module": str(module)}, indent=1))
    results_path.unlink(missing_ok=True)
    run = run_in_guest(
        # inside, the output directory is the share at $GEMINI_LAB_OUT
        f'{sys.executable} -m gemini_lab.guest "$GEMINI_LAB_OUT/{plan_path.name}" '
        f'"$GEMINI_LAB_OUT/{results_path.name}"',
        out_dir,
        kernel=kernel,
        timeout_s=timeout_s,
    )
    if not results_path.exists():
        log = (out_dir / "job.log").read_text() if (out_dir / "job.log").exists() else ""
        raise LabError(
            f"guest wrote no results (rc {run.returncode}):\n{log[-4000:]}\n{run.console[-2000:]}"
        )
    results = json.loads(results_path.read_text())
    results["guest_rc"] = run.returncode
    # an oops panics the guest before it can save dmesg: the console has it then
    results["kernel_problems"] = kernel_problems(run.dmesg + "\n" + run.console)
    results["fusion_dmesg"] = [line for line in run.dmesg.splitlines() if "fusion" in line]
    return results
