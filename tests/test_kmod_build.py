"""The congestion-control modules (tcp_fusion.ko, tcp_gemini.ko, tcp_dcvegas.ko, tcp_gear.ko
and gear_int.ko, the lab's INT switch Gear reads) build
warning-free with W=1 on Debian 12's 6.1 and Debian 13's 6.12, and through DKMS.

- 6.1: against the host's Debian headers (linux-headers-amd64 of bookworm, which
  lab/install-deps.sh installs), in a copy of the sources so the lab's build is not disturbed.
- 6.12: inside the trixie chroot that fusion-kmod/build-in-trixie.sh makes (debootstrap, under
  var/); the test skips, saying how to make it, when the chroot is not there.
- DKMS: Debian's dkms adds and builds the module from fusion-kmod/dkms.conf against the 6.1
  headers, in a private DKMS tree (--dkmstree/--sourcetree), so the host's own is untouched.

Each build's whole compiler output is searched for "warning:"; every module's vermagic must
name the kernel it was built for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gemini_lab.host import KMOD_DIR, REPO
from gemini_lab.vm import LabError, find_kernel

pytestmark = pytest.mark.slow

SOURCES = ("Kbuild", "Makefile", "dkms.conf", "*.c", "*.h")
TRIXIE_SCRIPT = KMOD_DIR / "build-in-trixie.sh"
TRIXIE_ROOT = REPO / "var" / "trixie" / "root"
TRIXIE_COMPLETE = TRIXIE_ROOT / ".gemini-complete"
# The builds' own make, whatever make runs pytest: a parent `make -s` exports MAKEFLAGS=s, which
# silences the compiler lines the tests read (and a parent's -j or -k would change the build).
BUILD_ENV = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
WARNING = re.compile(r"\bwarning:", re.IGNORECASE)
# Kbuild's obj-m, dkms.conf's modules
MODULES = ("tcp_fusion", "tcp_gemini", "tcp_dcvegas", "tcp_gear", "gear_int")


def _copy_sources(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for pattern in SOURCES:
        for src in KMOD_DIR.glob(pattern):
            if not src.name.endswith(".mod.c"):
                shutil.copy2(src, dest / src.name)
    return dest


def _dkms_conf(name: str) -> str:
    text = (KMOD_DIR / "dkms.conf").read_text()
    match = re.search(rf'^{name}="([^"]+)"', text, re.MULTILINE)
    assert match, f"dkms.conf has no {name}"
    return match.group(1)


def _vermagic(ko: Path) -> str:
    out = subprocess.run(
        ["modinfo", "-F", "vermagic", str(ko)], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if WARNING.search(line)]


@pytest.fixture(scope="module")
def bookworm_kernel():
    try:
        kernel = find_kernel()
    except LabError as exc:
        pytest.skip(str(exc))
    if not kernel.headers_dir.exists():
        pytest.skip(f"no headers for {kernel.release}: lab/install-deps.sh installs them")
    return kernel


def test_builds_warning_free_with_w1_on_6_1(bookworm_kernel, tmp_path):
    src = _copy_sources(tmp_path / "fusion-kmod")
    out = subprocess.run(
        ["make", "-C", str(src), f"KVER={bookworm_kernel.release}", "W=1"],
        capture_output=True,
        text=True,
        env={**BUILD_ENV, "LC_ALL": "C"},
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    assert _warnings(log) == [], log[-4000:]
    for module in MODULES:
        assert _vermagic(src / f"{module}.ko").startswith(bookworm_kernel.release + " "), module


def test_builds_warning_free_with_w1_on_6_12(tmp_path):
    if not TRIXIE_COMPLETE.exists():
        pytest.skip(
            f"no Debian 13 (trixie) chroot at {TRIXIE_ROOT}: "
            f"run `{TRIXIE_SCRIPT.relative_to(REPO)} setup` as root (debootstrap, network)"
        )
    out = subprocess.run(
        [str(TRIXIE_SCRIPT), "build"],
        capture_output=True,
        text=True,
        env={**BUILD_ENV, "TRIXIE_OUT": str(tmp_path)},
    )
    log = (tmp_path / "build.log").read_text() if (tmp_path / "build.log").exists() else ""
    assert out.returncode == 0, (out.stderr + log)[-4000:]
    assert _warnings(log) == [], log[-4000:]
    release = (tmp_path / "release").read_text().strip()
    assert release.startswith("6.12."), release
    for module in MODULES:
        assert _vermagic(tmp_path / f"{module}.ko").startswith(release + " "), module


def test_dkms_adds_and_builds_the_module(bookworm_kernel, tmp_path):
    dkms = shutil.which("dkms")
    if dkms is None:
        pytest.skip("dkms is missing: apt-get install dkms (Debian's 3.0.10 is what is tested)")
    name, version = _dkms_conf("PACKAGE_NAME"), _dkms_conf("PACKAGE_VERSION")
    source_tree, dkms_tree = tmp_path / "src", tmp_path / "dkms"
    _copy_sources(source_tree / f"{name}-{version}")
    dkms_tree.mkdir()
    trees = ["--sourcetree", str(source_tree), "--dkmstree", str(dkms_tree)]
    for action in ("add", "build"):
        out = subprocess.run(
            [dkms, action, "-m", name, "-v", version, "-k", bookworm_kernel.release, *trees],
            capture_output=True,
            text=True,
            env=BUILD_ENV,
        )
        assert out.returncode == 0, f"dkms {action}: {out.stdout}{out.stderr}"
    build_dir = dkms_tree / name / version
    # DKMS 3.0 keeps the build's log beside the modules once the build directory is cleaned
    (log_file,) = build_dir.glob(f"{bookworm_kernel.release}/*/log/make.log")
    log = log_file.read_text()
    assert "CC [M]" in log, log[-4000:]  # the log is the compiler's, so no warning is real
    assert _warnings(log) == [], log[-4000:]
    for module in MODULES:
        (ko,) = build_dir.glob(f"{bookworm_kernel.release}/*/module/{module}.ko*")
        if ko.suffix == ".ko":
            assert _vermagic(ko).startswith(bookworm_kernel.release + " "), module


def test_dkms_package_version_is_the_modules_version():
    """DKMS names the build by dkms.conf's version; modinfo shows MODULE_VERSION: one number,
    the same in every module of the package."""
    sources = {
        "tcp_fusion": "fusion_cc.c",
        "tcp_gemini": "gemini_cc.c",
        "tcp_dcvegas": "dcvegas_cc.c",
        "tcp_gear": "tcp_gear.c",
        "gear_int": "gear_int.c",
    }
    for module in MODULES:
        source = (KMOD_DIR / sources[module]).read_text()
        match = re.search(r'MODULE_VERSION\("([^"]+)"\)', source)
        assert match, f"{sources[module]} has no MODULE_VERSION"
        assert _dkms_conf("PACKAGE_VERSION") == match.group(1), module


def test_kbuild_and_dkms_list_the_same_modules():
    kbuild = (KMOD_DIR / "Kbuild").read_text()
    obj_m = re.search(r"^obj-m := (.*)$", kbuild, re.MULTILINE)
    assert obj_m, "Kbuild has no obj-m"
    assert tuple(o.removesuffix(".o") for o in obj_m.group(1).split()) == MODULES
    for i, module in enumerate(MODULES):
        assert _dkms_conf(f"BUILT_MODULE_NAME\\[{i}\\]") == module
        assert _dkms_conf(f"DEST_MODULE_LOCATION\\[{i}\\]") == "/updates/dkms"
