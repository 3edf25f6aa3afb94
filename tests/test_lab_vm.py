"""The qemu lab's contract for kernels and modules from elsewhere: a Debian kernel unpacked
outside /boot (GEMINI_LAB_KERNEL_ROOT, as ``dpkg -x`` leaves it) and a tcp_fusion.ko built
elsewhere (GEMINI_LAB_FUSION_KO). No guest boots here: the real depmod and modinfo run on a
small unpacked tree made from this host's installed kernel."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gemini_lab import host, vm
from tests.labkit import guest_kernel

pytestmark = pytest.mark.lab


@pytest.fixture
def installed() -> vm.GuestKernel:
    if shutil.which("depmod") is None or shutil.which("modinfo") is None:
        pytest.skip("kmod (depmod, modinfo) is missing: lab/install-deps.sh installs it")
    return guest_kernel()


def _unpacked(installed: vm.GuestKernel, root: Path) -> Path:
    """boot/vmlinuz-<release> and one module, without modules.dep: what dpkg -x leaves."""
    (root / "boot").mkdir(parents=True)
    shutil.copy2(installed.vmlinuz, root / "boot" / installed.vmlinuz.name)
    netem = next(installed.modules_dir.rglob("sch_netem.ko*"))
    dest = root / "lib" / "modules" / installed.release / netem.relative_to(installed.modules_dir)
    dest.parent.mkdir(parents=True)
    shutil.copy2(netem, dest)
    headers = root / "usr" / "src" / f"linux-headers-{installed.release}"
    headers.mkdir(parents=True)
    (root / "lib" / "modules" / installed.release / "build").symlink_to(
        f"/usr/src/linux-headers-{installed.release}"
    )
    return dest


def test_a_kernel_unpacked_outside_boot_is_found_with_its_modules(installed, tmp_path, monkeypatch):
    root = tmp_path / "kernel"
    netem = _unpacked(installed, root)
    monkeypatch.setenv(vm.KERNEL_ROOT_ENV, str(root))
    kernel = vm.find_kernel()
    assert kernel.release == installed.release
    assert kernel.vmlinuz == root / "boot" / f"vmlinuz-{installed.release}"
    assert kernel.modules_dir == root / "lib" / "modules" / installed.release
    # depmod ran, so modinfo (and the guest's modprobe) find modules in the unpacked tree
    assert (kernel.modules_dir / "modules.dep").exists()
    assert vm._module_path(kernel, "sch_netem") == netem
    # the headers' absolute link is followed inside the unpacked tree, not on this host
    assert kernel.headers_dir == root / "usr" / "src" / f"linux-headers-{installed.release}"


def test_an_unpacked_kernel_root_without_boot_is_named_in_the_error(tmp_path, monkeypatch):
    monkeypatch.setenv(vm.KERNEL_ROOT_ENV, str(tmp_path))
    with pytest.raises(vm.LabError, match=r"GEMINI_LAB_KERNEL_ROOT=.* has no boot/"):
        vm.find_kernel()


def test_a_module_built_elsewhere_is_loaded_as_given(installed, tmp_path, monkeypatch):
    ko = tmp_path / "tcp_fusion.ko"
    ko.write_bytes(b"\x7fELF")
    monkeypatch.setenv(host.FUSION_KO_ENV, str(ko))
    assert host.module_for(installed) == ko
    monkeypatch.setenv(host.FUSION_KO_ENV, str(tmp_path / "absent.ko"))
    with pytest.raises(vm.LabError, match=r"GEMINI_LAB_FUSION_KO=.*absent\.ko is not a file"):
        host.module_for(installed)


def _run(out_dir: Path, *, rc: int, console: str, job_started: bool) -> vm.GuestRun:
    if job_started:
        (out_dir / "job.log").write_text("")
    return vm.GuestRun(returncode=rc, console=console, dmesg="", out_dir=out_dir)


PANIC = "RIP: 0010:sched_clock_cpu+0x9/0x1d0\nKernel panic - not syncing: Fatal exception"


def test_only_a_panic_before_the_job_starts_is_a_failed_boot(tmp_path):
    """Such a boot is run again; a panic once the job ran is the job's own result."""
    before, during, done = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (before, during, done):
        d.mkdir()
    assert vm.panicked_before_the_job(_run(before, rc=-1, console=PANIC, job_started=False))
    assert not vm.panicked_before_the_job(_run(during, rc=-1, console=PANIC, job_started=True))
    assert not vm.panicked_before_the_job(_run(done, rc=0, console="", job_started=True))
    # no status and no job log, but no panic either (a missing share, say): not retried
    assert not vm.panicked_before_the_job(
        _run(before, rc=-1, console="lab: no output share", job_started=False)
    )


def test_a_new_job_starts_without_the_last_jobs_log(tmp_path):
    (tmp_path / "job.log").write_text("the previous job\n")
    (tmp_path / "rc").write_text("0\n")
    vm.prepare_job("true", tmp_path)
    assert not (tmp_path / "job.log").exists()
    assert not (tmp_path / "rc").exists()


def test_a_boot_that_never_reaches_the_job_is_killed_and_named(tmp_path):
    """The watchdog, driven by stand-in processes for the guest (a hung boot cannot be made on
    demand): one that never creates the job log is killed at the boot timeout; one that starts
    the job is left to finish."""
    hung = vm._run_qemu(["sleep", "600"], tmp_path, timeout_s=900, boot_timeout_s=1)
    assert not hung
    run = vm.collect_run(tmp_path)
    assert vm.boot_failure(run, booted=hung) == (
        "the guest did not start the job within the boot timeout"
    )
    job = f"touch {tmp_path / vm.JOB_LOG}; sleep 3; echo 0 > {tmp_path / 'rc'}"
    assert vm._run_qemu(["sh", "-c", job], tmp_path, timeout_s=900, boot_timeout_s=300)
    run = vm.collect_run(tmp_path)
    assert run.returncode == 0
    assert vm.boot_failure(run, booted=True) is None
