"""Host side: build the module for the guest kernel, boot the lab guest on a plan, read results.

Two backends run a plan. ``uml`` (the default) is User-Mode Linux on a simulated clock
(gemini_lab.uml): figures that do not move with host load, for every network outcome. ``qemu``
boots Debian's stock kernel (gemini_lab.vm), for what needs that kernel: the module's real
build, loading and unloading it, other Debian releases' kernels.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from gemini_lab import uml
from gemini_lab.uml import KMOD_DIR
from gemini_lab.vm import REPO_ROOT, GuestKernel, GuestRun, LabError, find_kernel, run_in_guest

REPO = REPO_ROOT  # vm's, the one place it is found; under the name the studies import
Backend = Literal["uml", "qemu"]
BACKENDS: tuple[Backend, ...] = ("uml", "qemu")
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


def guest_failure(plan: dict, results: dict, run: GuestRun) -> str | None:
    """None when the guest job exited 0. Otherwise what went wrong, for a test to show instead
    of a KeyError on the experiments that never ran: the exit status (-1: the guest stopped
    before writing one, a kernel panic say, see gemini_lab.vm.DEFAULT_ACCEL), the experiment
    that was running then, and the tail of the console, where a panic's last words are."""
    if run.returncode == 0:
        return None
    done = results.get("experiments", {})
    running = next((e["label"] for e in plan["experiments"] if e["label"] not in done), None)
    where = f"during experiment {running!r}" if running else "after its experiments"
    finished = ", ".join(done) or "none"
    return (
        f"the guest job ended with rc {run.returncode} {where} (finished: {finished}); "
        f"console tail:\n{run.console[-3000:]}"
    )


Progress = Callable[[str, dict], None]
PROGRESS_POLL_S = 2.0


class _Watcher(threading.Thread):
    """Reports each experiment once the guest has written its result (the guest rewrites
    results.json after every experiment, and the host sees the output directory live)."""

    def __init__(self, results_path: Path, report: Progress) -> None:
        super().__init__(daemon=True)
        self.results_path, self.report = results_path, report
        self.seen: set[str] = set()
        self.stopped = threading.Event()

    def poll(self) -> None:
        try:
            experiments = json.loads(self.results_path.read_text())["experiments"]
        except (OSError, ValueError, KeyError):
            return  # not written yet, or caught half-written
        for label, result in experiments.items():
            if label not in self.seen:
                self.seen.add(label)
                self.report(label, result)

    def run(self) -> None:
        while not self.stopped.wait(PROGRESS_POLL_S):
            self.poll()

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self.poll()


def _boot(
    backend: Backend, plan: dict, plan_path: Path, command: str, out_dir: Path, timeout_s: float
) -> GuestRun:
    """Build the kernel and module the backend needs, write the plan naming that module, and
    run the guest on it."""
    if backend == "uml":
        uml_kernel = uml.build_kernel()
        module = uml.build_module(uml_kernel)
        plan_path.write_text(json.dumps({**plan, "module": str(module)}, indent=1))
        return uml.run_in_uml(command, out_dir, kernel=uml_kernel, timeout_s=timeout_s)
    if backend == "qemu":
        kernel = find_kernel()
        module = module_for(kernel)
        plan_path.write_text(json.dumps({**plan, "module": str(module)}, indent=1))
        return run_in_guest(command, out_dir, kernel=kernel, timeout_s=timeout_s)
    raise LabError(f"unknown lab backend {backend!r}: one of {', '.join(BACKENDS)}")


def run_plan(
    plan: dict,
    out_dir: Path,
    *,
    timeout_s: float = 1800,
    backend: Backend = "uml",
    progress: Progress | None = None,
) -> dict:
    """Build, boot, run the plan in the guest; the results plus the kernel log's problems.
    ``progress`` hears of each experiment (label, result) as soon as the guest finishes it."""
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    plan_path, results_path = out_dir / "plan.json", out_dir / "results.json"
    results_path.unlink(missing_ok=True)
    # inside, the output directory is at $GEMINI_LAB_OUT
    command = (
        f'{sys.executable} -m gemini_lab.guest "$GEMINI_LAB_OUT/{plan_path.name}" '
        f'"$GEMINI_LAB_OUT/{results_path.name}"'
    )
    watcher = _Watcher(results_path, progress) if progress else None
    if watcher:
        watcher.start()
    try:
        run = _boot(backend, plan, plan_path, command, out_dir, timeout_s)
    finally:
        if watcher:
            watcher.stop()
    if not results_path.exists():
        log = (out_dir / "job.log").read_text() if (out_dir / "job.log").exists() else ""
        raise LabError(
            f"guest wrote no results (rc {run.returncode}):\n{log[-4000:]}\n{run.console[-2000:]}"
        )
    results = json.loads(results_path.read_text())
    results["guest_rc"] = run.returncode
    results["guest_failure"] = guest_failure(plan, results, run)
    results["backend"] = backend
    # an oops panics the guest before it can save dmesg: the console has it then
    results["kernel_problems"] = kernel_problems(run.dmesg + "\n" + run.console)
    results["fusion_dmesg"] = [line for line in run.dmesg.splitlines() if "fusion" in line]
    return results
