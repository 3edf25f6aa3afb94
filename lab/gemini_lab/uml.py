"""Run a lab job in User-Mode Linux on a simulated clock: figures that do not move with host load.

Under qemu's CPU emulation a busy host slows the guest's CPU but not its clock, so timers fire
late, packets wait behind the emulator and RTT samples jitter: exactly what a delay-based
congestion control reads, and why the same flow measured 2.6, 18.9 and 25 Mbit/s from one run
to the next. User-Mode Linux runs the guest kernel as a host process, and with time travel
(``time-travel=inf-cpu``) its clock is simulated: CPU work takes no guest time at all, and when
every task is idle the clock jumps to the next timer. A flow's bytes, window and retransmits
are then fixed by the network the guest emulates, not by the host: a loaded host only makes
the run take longer in wall time.

What that asks of a job:
  - no busy-polling: a task that spins never lets the clock move (iperf3 polls; the lab's own
    flow tools block in the kernel, see gemini_lab.bulk);
  - the guest's randomness (netem's loss draws, TCP sequence numbers) comes from its own
    generator, seeded from the simulated clock, which starts at a fixed instant on every boot
    (the kernel is built without a host random device: lab/uml/config.fragment);
  - one CPU: time travel runs a uniprocessor kernel, and the host process is pinned to one
    core, since UML's context switches between host processes cost far more across cores.

The kernel comes from lab/uml/build-kernel.sh (Debian's linux-source-6.1 with ARCH=um, cached
under var/uml/); tcp_fusion.ko is built against that tree here. The guest's root is the host's
root read-only over hostfs, and the job's output directory a second, writable hostfs mount.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gemini_lab.vm import (
    CONSOLE_FILE,
    GUEST_INIT,
    REPO_ROOT,
    GuestRun,
    LabError,
    collect_run,
    prepare_job,
)

BUILD_SCRIPT = REPO_ROOT / "lab" / "uml" / "build-kernel.sh"
KMOD_DIR = REPO_ROOT / "fusion-kmod"
MODULE_CACHE = REPO_ROOT / "var" / "uml" / "fusion"
# The guest's clock starts at 2025-01-01T00:00:00Z on every boot, so that nothing the guest
# derives from wall-clock time (its random generator's seed among them) differs between runs.
TIME_TRAVEL_START_NS = 1_735_689_600 * 10**9
# The module's sources: what a tcp_fusion.ko build depends on besides the kernel tree.
MODULE_SOURCES = ("*.c", "*.h", "Kbuild")
# module builds kept in MODULE_CACHE (each a few MB), newest first
MODULE_BUILDS_KEPT = 6


@dataclass(frozen=True)
class UmlKernel:
    """A built UML tree: the kernel binary at its top and Module.symvers for modules."""

    tree: Path

    @property
    def binary(self) -> Path:
        return self.tree / "linux"

    @property
    def release(self) -> str:
        return (self.tree / "include" / "config" / "kernel.release").read_text().strip()


def build_kernel() -> UmlKernel:
    """The lab's UML kernel, built by lab/uml/build-kernel.sh unless its inputs are unchanged
    (then it answers at once). The build's progress goes to this process's stderr."""
    if shutil.which("flex") is None or not Path("/usr/src/linux-source-6.1.tar.xz").exists():
        raise LabError(
            "the UML lab kernel needs Debian's linux-source-6.1, flex and bison: "
            "run lab/install-deps.sh (it is missing here)"
        )
    out = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        raise LabError(f"{BUILD_SCRIPT} failed (rc {out.returncode}); its output is above")
    kernel = UmlKernel(Path(out.stdout.strip().splitlines()[-1]))
    if not kernel.binary.exists():
        raise LabError(f"{BUILD_SCRIPT} printed {kernel.tree}, which has no linux binary")
    return kernel


def _module_key(kernel: UmlKernel) -> str:
    digest = hashlib.sha256(kernel.tree.name.encode())
    for pattern in MODULE_SOURCES:
        for path in sorted(KMOD_DIR.glob(pattern)):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build_module(kernel: UmlKernel) -> Path:
    """tcp_fusion.ko for the UML kernel, from a copy of fusion-kmod/'s sources (so the qemu
    build's products in fusion-kmod/ are left alone); rebuilt only when a source changes."""
    MODULE_CACHE.mkdir(parents=True, exist_ok=True)
    dest = MODULE_CACHE / _module_key(kernel)
    with (MODULE_CACHE / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ko = dest / "tcp_fusion.ko"
        if ko.exists():
            return ko
        work = dest.with_suffix(".partial")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        for pattern in MODULE_SOURCES:
            for path in KMOD_DIR.glob(pattern):
                shutil.copy2(path, work / path.name)
        out = subprocess.run(
            ["make", "-C", str(kernel.tree), "ARCH=um", f"M={work}", "modules"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise LabError(
                f"tcp_fusion.ko for UML failed to build:\n{(out.stdout + out.stderr)[-4000:]}"
            )
        work.rename(dest)
        _prune_module_builds(keep=dest)
        return ko


def _prune_module_builds(keep: Path) -> None:
    """Drop all but the newest few module builds: a guest of another checkout state (a lab run
    started before a source changed) may still be loading one, so the latest are kept."""
    builds = sorted(
        (p for p in MODULE_CACHE.iterdir() if p.is_dir() and p.suffix != ".partial"),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for old in builds[MODULE_BUILDS_KEPT:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def _host_cpu() -> int:
    """The core the guest runs on: the last one this process may use."""
    return max(os.sched_getaffinity(0))


def uml_command(kernel: UmlKernel, out_dir: Path, memory_mb: int) -> list[str]:
    """The host command line that boots the guest on the job in ``out_dir``."""
    return [
        "taskset",
        "-c",
        str(_host_cpu()),
        "setarch",
        "x86_64",
        "--addr-no-randomize",  # the same host address layout on every run
        str(kernel.binary),
        f"mem={memory_mb}M",
        "root=/dev/root",
        "rootfstype=hostfs",
        "rootflags=/",
        "ro",
        f"init={GUEST_INIT}",
        "time-travel=inf-cpu",
        f"time-travel-start={TIME_TRAVEL_START_NS}",
        "con=null",
        "con0=null,fd:1",
        "ipv6.disable=1",  # no router solicitations at random times through the lossy queues
        f"uml_dir={out_dir}",
        "umid=lab",
        "loglevel=4",
        f"gemini.repo={REPO_ROOT}",
        f"gemini.out={out_dir}",
    ]


def run_in_uml(
    command: str,
    out_dir: Path,
    *,
    kernel: UmlKernel | None = None,
    memory_mb: int = 2048,
    timeout_s: float = 900,
) -> GuestRun:
    """Boot, run `command` (a shell line) as root in the guest, power off; collect its output.

    The same contract as gemini_lab.vm.run_in_guest: the command sees GEMINI_LAB_OUT (the
    output directory, shared read-write) and its exit status lands in the result."""
    kernel = kernel or build_kernel()
    out_dir = prepare_job(command, out_dir)
    # UML backs the guest's memory with a file in $TMPDIR: keep it in memory
    env = {**os.environ, "TMPDIR": "/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp"}
    # its own session: UML runs every guest process as a host process, and on a timeout (or
    # our own exit) the whole group goes, not only the kernel's main process
    # The console goes to a regular file, not a pipe: a host process reading a pipe signals
    # the writer (SIGIO), and the guest takes that as a console interrupt at whatever simulated
    # time the host's scheduling lets it arrive, which reaches the guest's random generator.
    # A regular file raises no such signal.
    console_file = out_dir / CONSOLE_FILE
    with console_file.open("wb") as console_out:
        proc = subprocess.Popen(
            uml_command(kernel, out_dir, memory_mb),
            stdin=subprocess.DEVNULL,
            stdout=console_out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        console = console_file.read_text(errors="replace")
        raise LabError(
            f"UML guest did not finish within {timeout_s:.0f} s; console:\n{console[-4000:]}"
        ) from exc
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        shutil.rmtree(out_dir / "lab", ignore_errors=True)  # UML's mconsole socket directory
    return collect_run(out_dir)
