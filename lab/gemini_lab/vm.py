"""Boot Debian's stock kernel under qemu with the host's root file system, and run one job in it.

The guest sees the host's whole tree read-only over 9p (virtio), so every host tool — Python and
this repository's virtualenv, iproute2, iperf3, the kernel's modules under /lib/modules — exists
inside at the same path, with tmpfs over the directories a running system writes to. One extra
9p share, read-write, is the job's output directory: the job's command runs as PID 1's child,
and the guest writes its exit status and kernel log there before it powers off.

This is how the lab gets a real kernel where modules load and netem works on machines whose own
kernel has neither. qemu emulates the CPU (TCG, single-threaded: see DEFAULT_ACCEL) unless
GEMINI_LAB_ACCEL=kvm asks for KVM.

The guest kernel is the newest Debian image in /boot, or one unpacked anywhere else: with
GEMINI_LAB_KERNEL_ROOT=DIR, where DIR holds ``boot/vmlinuz-<release>`` and
``lib/modules/<release>/`` as ``dpkg -x linux-image-<release>_….deb DIR`` leaves them (another
Debian release's kernel, say, that this host does not run). The guest then sees DIR's modules
at /lib/modules.
"""

from __future__ import annotations

import gzip
import lzma
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LAB_DIR = Path(__file__).resolve().parent
REPO_ROOT = LAB_DIR.parents[1]
GUEST_INIT = LAB_DIR / "guest_init.sh"
# A directory holding an unpacked Debian kernel (boot/vmlinuz-*, lib/modules/*), instead of /.
KERNEL_ROOT_ENV = "GEMINI_LAB_KERNEL_ROOT"
# Boots per job: a boot that fails before the job starts (a kernel panic, see
# panicked_before_the_job, or a boot that never reaches the job) boots again.
BOOT_ATTEMPTS = 3
# From qemu's start to the job's start. A TCG boot takes 8-10 s idle and 16-24 s with both
# cores of a 2-core host busy; a boot that stalls is killed here instead of holding the job's
# whole timeout.
BOOT_TIMEOUT_S = 600.0
JOB_LOG = "job.log"  # the guest creates it as the job starts: the sign that the boot is over
BOOT_POLL_S = 2.0
CONSOLE_FILE = "console.txt"  # in the job directory: what the guest printed
ACCEL_ENV = "GEMINI_LAB_ACCEL"  # qemu's -accel argument, e.g. kvm, or tcg,thread=multi
# One host thread runs both vCPUs in turn. Multi-threaded TCG (a thread per vCPU, qemu's
# default) in the qemu this lab runs on (Debian 12's 7.2) has a race between one vCPU's
# translating kernel code and another's patching it (fixed upstream in 8.1, "accel/tcg: Always
# lock pages before translation"): when the kernel flips a static key, a vCPU can execute the
# int3 that text_poke_bp() had placed and already removed, "Oops: int3" at the jump label, and
# in interrupt context the guest panics ("Fatal exception in interrupt"). qemu then exits
# before the job's exit status is written, so the job reads as rc -1 with the experiments after
# that moment missing. Keys flip at boot (sched_clock_cpu, the boot panic that
# panicked_before_the_job retries) and during the job (netstamp_needed_key at
# netif_rx_internal: flipping it ~60 times a second beside loopback traffic for 150 s
# panicked 3 guests of 4 multi-threaded, 0 of 3 single-threaded). The window is wider when the
# host deschedules vCPU threads, i.e. on a busy host. Single-threaded TCG has no second vCPU
# thread to race; on this 2-core host the module tests took 125 s idle (116 s multi-threaded)
# and 256 s with the cores busy (307 s multi-threaded).
DEFAULT_ACCEL = "tcg,thread=single"
# The modules the initramfs needs to mount the 9p root; their dependencies come along.
BOOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p")
INITRAMFS_INIT = """#!/bin/busybox sh
/bin/busybox --install -s /bin
echo "lab: initramfs"
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /modules.list); do insmod /modules/$m.ko || echo "lab: insmod $m failed"; done
mkdir -p /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot /newroot \\
  || { echo "lab: cannot mount the host root"; poweroff -f; }
umount /proc /sys /dev
echo "lab: host root mounted"
exec switch_root /newroot /bin/sh {guest_init}
"""


class LabError(RuntimeError):
    """The lab cannot run here; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class GuestKernel:
    release: str
    vmlinuz: Path
    # where boot/ and lib/modules/ of this kernel live: / for an installed kernel
    root: Path = Path("/")

    @property
    def modules_dir(self) -> Path:
        return self.root / "lib" / "modules" / self.release

    @property
    def headers_dir(self) -> Path:
        """lib/modules/<release>/build; its absolute link is read inside ``root``."""
        build = self.modules_dir / "build"
        if self.root != Path("/") and build.is_symlink():
            target = Path(os.readlink(build))
            if target.is_absolute():
                return self.root / target.relative_to("/")
        return build

    def modinfo_args(self) -> list[str]:
        """modinfo's options to look this kernel's modules up."""
        base = ["-b", str(self.root)] if self.root != Path("/") else []
        return ["modinfo", *base, "-k", self.release]


def find_kernel(release: str | None = None) -> GuestKernel:
    """The newest Debian kernel image in /boot (package linux-image-amd64), or `release`;
    under $GEMINI_LAB_KERNEL_ROOT instead of / when that is set."""
    env_root = os.environ.get(KERNEL_ROOT_ENV)
    root = Path(env_root).resolve() if env_root else Path("/")
    if env_root and not (root / "boot").is_dir():
        raise LabError(f"{KERNEL_ROOT_ENV}={env_root} has no boot/ directory (use dpkg -x)")
    images = sorted((root / "boot").glob("vmlinuz-*"))
    if release:
        images = [p for p in images if p.name == f"vmlinuz-{release}"]
    if not images:
        where = f"{root}/boot" if env_root else "/boot"
        raise LabError(
            f"no guest kernel in {where}: install Debian's linux-image-amd64 and "
            "linux-headers-amd64 (lab/install-deps.sh does)"
        )
    image = images[-1]
    kernel = GuestKernel(release=image.name.removeprefix("vmlinuz-"), vmlinuz=image, root=root)
    if not kernel.modules_dir.is_dir():
        raise LabError(f"{kernel.modules_dir} is missing: reinstall linux-image-{kernel.release}")
    if env_root and not (kernel.modules_dir / "modules.dep").exists():
        _depmod(kernel)  # dpkg -x unpacks; only the package's postinst would run depmod
    return kernel


def _depmod(kernel: GuestKernel) -> None:
    out = subprocess.run(
        ["depmod", "-b", str(kernel.root), kernel.release], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise LabError(f"depmod for {kernel.modules_dir} failed: {out.stderr.strip()}")


def _module_path(kernel: GuestKernel, name: str) -> Path:
    out = subprocess.run([*kernel.modinfo_args(), "-n", name], capture_output=True, text=True)
    if out.returncode != 0:
        raise LabError(f"kernel module {name} not found for {kernel.release}: {out.stderr.strip()}")
    return Path(out.stdout.strip())


def _module_depends(kernel: GuestKernel, name: str) -> list[str]:
    out = subprocess.run(
        [*kernel.modinfo_args(), "-F", "depends", name], capture_output=True, text=True
    )
    return [d for d in out.stdout.strip().split(",") if d]


def _copy_module(path: Path, dest: Path) -> bool:
    """The module as a plain .ko (busybox insmod reads no compressed ones); False if built in."""
    if not path.exists():
        return False
    if path.suffix == ".ko":
        shutil.copy2(path, dest)
    elif path.name.endswith(".ko.xz"):
        dest.write_bytes(lzma.decompress(path.read_bytes()))
    elif path.name.endswith(".ko.gz"):
        dest.write_bytes(gzip.decompress(path.read_bytes()))
    elif path.name.endswith(".ko.zst"):
        subprocess.run(["zstd", "-q", "-d", "-f", str(path), "-o", str(dest)], check=True)
    else:
        return False
    return True


def _load_order(kernel: GuestKernel, names: tuple[str, ...]) -> list[str]:
    """Modules and their dependencies, each after what it depends on."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for dep in _module_depends(kernel, name):
            visit(dep)
        order.append(name)

    for name in names:
        visit(name)
    return order


def build_initramfs(kernel: GuestKernel, dest: Path) -> Path:
    """A busybox initramfs that loads virtio + 9p and switches to the host's root over 9p."""
    busybox = shutil.which("busybox")
    if busybox is None:
        raise LabError("busybox is missing: install Debian's busybox-static")
    with tempfile.TemporaryDirectory(prefix="gemini-initramfs-") as tmp:
        root = Path(tmp)
        for d in ("bin", "proc", "sys", "dev", "modules"):
            (root / d).mkdir()
        shutil.copy2(busybox, root / "bin" / "busybox")
        loaded = []
        for name in _load_order(kernel, BOOT_MODULES):
            try:
                path = _module_path(kernel, name)
            except LabError:
                continue  # built in, or not needed by this kernel
            if _copy_module(path, root / "modules" / f"{name}.ko"):
                loaded.append(name)
        (root / "modules.list").write_text("\n".join(loaded) + "\n")
        init = root / "init"
        init.write_text(INITRAMFS_INIT.replace("{guest_init}", str(GUEST_INIT)))
        init.chmod(0o755)
        files = subprocess.run(
            ["find", "."], cwd=root, capture_output=True, text=True, check=True
        ).stdout
        with dest.open("wb") as out:
            subprocess.run(
                ["cpio", "-o", "-H", "newc", "--quiet"],
                cwd=root,
                input=files.encode(),
                stdout=out,
                check=True,
            )
    return dest


@dataclass
class GuestRun:
    returncode: int
    console: str
    dmesg: str
    out_dir: Path


def run_in_guest(
    command: str,
    out_dir: Path,
    *,
    kernel: GuestKernel | None = None,
    memory_mb: int = 2048,
    cpus: int = 2,
    timeout_s: float = 900,
) -> GuestRun:
    """Boot, run `command` (a shell line) as root in the guest, power off; collect its output.

    The command sees GEMINI_LAB_OUT (the shared output directory) in its environment.
    """
    kernel = kernel or find_kernel()
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise LabError("qemu-system-x86_64 is missing: install Debian's qemu-system-x86")
    out_dir = prepare_job(command, out_dir)
    initrd = build_initramfs(kernel, out_dir / "initramfs.cpio")
    # an unpacked kernel's modules replace the host's /lib/modules inside the guest
    modroot = f" gemini.modroot={kernel.root}" if kernel.root != Path("/") else ""
    # TCG by default: nested KVM boots hang on some hosts; GEMINI_LAB_ACCEL=kvm where it works
    accel = ["-accel", os.environ.get(ACCEL_ENV, DEFAULT_ACCEL)]
    args = [
        qemu,
        *accel,
        "-m",
        str(memory_mb),
        "-smp",
        str(cpus),
        "-kernel",
        str(kernel.vmlinuz),
        "-initrd",
        str(initrd),
        "-append",
        "console=ttyS0 panic=-1 oops=panic quiet loglevel=4 "
        f"gemini.kver={kernel.release} gemini.repo={REPO_ROOT}{modroot}",
        "-nographic",
        "-no-reboot",
        "-nic",
        "user,model=virtio-net-pci",
        "-virtfs",
        "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
        "-virtfs",
        f"local,path={out_dir},mount_tag=labout,security_model=none",
    ]
    attempt = 1
    while True:
        booted = _run_qemu(args, out_dir, timeout_s)
        run = collect_run(out_dir)
        failure = boot_failure(run, booted)
        if failure is None:
            return run
        if attempt == BOOT_ATTEMPTS:
            raise LabError(
                f"the guest failed to boot {BOOT_ATTEMPTS} times ({failure}); console:\n"
                f"{run.console[-4000:]}"
            )
        (out_dir / f"boot-failure-{attempt}.txt").write_text(run.console)
        print(
            f"lab: {failure}; its console is in boot-failure-{attempt}.txt; booting again",
            file=sys.stderr,
        )
        attempt += 1


def _run_qemu(
    args: list[str], out_dir: Path, timeout_s: float, boot_timeout_s: float = BOOT_TIMEOUT_S
) -> bool:
    """Run qemu to the guest's power-off, its console into the job's console file. False when
    the job had not started ``boot_timeout_s`` after qemu did: the guest is killed then."""
    console_file = out_dir / CONSOLE_FILE
    with console_file.open("wb") as console:
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT
        )
    try:
        if not _wait_for_job_start(proc, out_dir / JOB_LOG, boot_timeout_s):
            return False
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired as exc:
        text = console_file.read_text(errors="replace")
        raise LabError(
            f"guest did not finish within {timeout_s:.0f} s; console:\n{text[-4000:]}"
        ) from exc
    finally:
        if proc.poll() is None:  # a stalled boot, a timeout, or our own exception
            proc.kill()
            proc.wait()


def _wait_for_job_start(proc: subprocess.Popen[bytes], job_log: Path, timeout_s: float) -> bool:
    """Whether the guest started the job (or powered off) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not job_log.exists():
        if proc.poll() is not None:
            return True  # powered off or panicked before the job: boot_failure tells which
        if time.monotonic() >= deadline:
            return False
        time.sleep(BOOT_POLL_S)
    return True


def boot_failure(run: GuestRun, booted: bool) -> str | None:
    """Why this boot says nothing about the job and is run again, or None when it does."""
    if not booted:
        return "the guest did not start the job within the boot timeout"
    if panicked_before_the_job(run):
        return "the guest kernel panicked before the job started"
    return None


def panicked_before_the_job(run: GuestRun) -> bool:
    """Whether the guest kernel panicked before PID 1 started the job (no job.log yet).

    Debian's stock kernel under qemu's multi-threaded TCG with two vCPUs has panicked this way
    once in CI (an exception in interrupt context at 2 s of boot, inside code the kernel
    patches at run time), before any of the project's code or modules ran: the race that
    DEFAULT_ACCEL now avoids. Such a boot says nothing about the job, so it is run again; a
    panic once the job has started is the job's result and is never retried."""
    started = (run.out_dir / JOB_LOG).exists()
    return run.returncode == -1 and not started and "Kernel panic" in run.console


def prepare_job(command: str, out_dir: Path) -> Path:
    """The output directory, absolute, with the job script PID 1 runs and no stale results."""
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("rc", "dmesg.txt", JOB_LOG):
        (out_dir / stale).unlink(missing_ok=True)
    (out_dir / "job.sh").write_text(f"cd {shlex.quote(os.getcwd())}\n{command}\n")
    return out_dir


def collect_run(out_dir: Path) -> GuestRun:
    """What the guest left in the output directory (exit status, kernel log, and the console
    its backend wrote to CONSOLE_FILE); a guest that died before writing its status reads as
    -1."""
    console = (out_dir / CONSOLE_FILE).read_text(errors="replace")
    rc_file = out_dir / "rc"
    rc = int(rc_file.read_text().strip()) if rc_file.exists() else -1
    dmesg_file = out_dir / "dmesg.txt"
    dmesg = dmesg_file.read_text(errors="replace") if dmesg_file.exists() else ""
    return GuestRun(returncode=rc, console=console, dmesg=dmesg, out_dir=out_dir)
