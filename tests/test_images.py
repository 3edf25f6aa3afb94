"""The deployables, built and started the way a host or a cluster would: the OCI images of
Booster and the agent (packaging/images/), the agent's Debian package with its systemd unit,
and the module's DKMS package (packaging/debian/).

Each image is built by packaging/images/build.sh (debootstrap + umoci, no daemon; reused from
var/packaging/ while its inputs are unchanged), unpacked from its OCI layout with umoci, and its
entry point run from that root file system: chroot with the image's user, environment and
working directory, in mount and PID namespaces of its own, on the host's network. Booster
serves /livez and /readyz from inside its image on the embedded PostgreSQL the image carries.

Needs root and the tools of packaging/install-tools.sh; skips naming what is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var" / "packaging"
BUILD_TIMEOUT_S = 1800  # a clean machine: debootstrap, every wheel downloaded, two images

pytestmark = pytest.mark.slow


def _missing_tools() -> str | None:
    if os.geteuid() != 0:
        return "building and running images needs root (debootstrap, chroot, namespaces)"
    for tool in ("debootstrap", "umoci", "unshare", "chroot", "dpkg-deb"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (packaging/install-tools.sh installs it)"
    return None


_SKIP = _missing_tools()
if _SKIP:
    pytestmark = [pytestmark, pytest.mark.skip(reason=_SKIP)]


def _version(folder: str) -> str:
    import tomllib

    return tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]["version"]


def _run_script(*args: str) -> None:
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(
        list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def built() -> None:
    _run_script(str(ROOT / "packaging/images/build.sh"), "booster", "agent")


@dataclass
class Unpacked:
    """An image unpacked from its OCI layout: the root file system and the runtime config."""

    rootfs: Path
    args: list[str]
    uid: int
    gid: int
    env: dict[str, str]
    cwd: str

    def command(self, args: list[str] | None = None, env: dict[str, str] | None = None) -> list:
        """argv that runs args (default: the image's entry point and command) from the image's
        root file system as its user, with its environment, in fresh mount and PID namespaces
        (so /proc and /dev mounted for it vanish with it, and so does every process it starts)."""
        full_env = {**self.env, **(env or {})}
        inner = (
            'r=$1; shift; mount -t proc proc "$r/proc" && mount --rbind /dev "$r/dev" && '
            'exec chroot --userspec="$U" "$r" /usr/bin/env -i "$@"'
        )
        return [
            "unshare",
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--",
            "/usr/bin/env",
            f"U={self.uid}:{self.gid}",
            "sh",
            "-c",
            inner,
            "sh",
            str(self.rootfs),
            *(f"{k}={v}" for k, v in full_env.items()),
            "/bin/sh",
            "-c",
            'cd "$0" && exec "$@"',
            self.cwd,
            *(self.args if args is None else args),
        ]

    def run(self, args: list[str], env: dict[str, str] | None = None) -> CompletedProcess:
        return subprocess.run(self.command(args, env), capture_output=True, text=True, timeout=120)

    def assert_version(self, prog: str, folder: str) -> None:
        out = self.run([self.args[0], "--version"])
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [prog, _version(folder)]


def _unpack(image: str, tag: str, dest: Path) -> Unpacked:
    subprocess.run(
        ["umoci", "unpack", "--image", f"{VAR}/oci/{image}:{tag}", str(dest)],
        check=True,
        capture_output=True,
    )
    spec = json.loads((dest / "config.json").read_text())
    proc = spec["process"]
    return Unpacked(
        rootfs=dest / "rootfs",
        args=proc["args"],
        uid=proc["user"]["uid"],
        gid=proc["user"]["gid"],
        env=dict(e.split("=", 1) for e in proc["env"]),
        cwd=proc["cwd"],
    )


@pytest.fixture(scope="module")
def agent_image(built, tmp_path_factory) -> Unpacked:
    return _unpack("gemini-agent", _version("agent"), tmp_path_factory.mktemp("agent") / "b")


@pytest.fixture(scope="module")
def booster_image(built, tmp_path_factory) -> Unpacked:
    return _unpack("gemini-booster", _version("booster"), tmp_path_factory.mktemp("booster") / "b")


def _site_packages(image: Unpacked, prefix: str) -> set[str]:
    lib = next((image.rootfs / prefix.lstrip("/") / "lib").glob("python3*/site-packages"))
    return {p.name.split("-")[0].lower() for p in lib.glob("*.dist-info")}


# --- the agent image ----------------------------------------------------------------------


def test_agent_image_entry_point_answers_version(agent_image) -> None:
    assert agent_image.args == ["/opt/gemini-agent/bin/gemini-agent", "run"]
    agent_image.assert_version("gemini-agent", "agent")


def test_agent_image_reads_its_settings_and_masks_the_token(agent_image) -> None:
    out = agent_image.run(
        [agent_image.args[0], "show-config"],
        {"GEMINI_AGENT_TOKEN": "s3cret-token", "GEMINI_AGENT_POLICY": "cdn"},
    )
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["policy"] == "cdn" and shown["token"] == "**********"
    assert "s3cret-token" not in out.stdout + out.stderr


def test_agent_image_holds_the_agent_and_nothing_heavy(agent_image) -> None:
    installed = _site_packages(agent_image, "/opt/gemini-agent")
    assert {"gemini_agent", "gemini_api", "grpcio", "pyroute2"} <= installed
    heavy = {"scipy", "scikit_learn", "scikit_optimize", "numpy", "matplotlib", "pgserver"}
    assert not installed & heavy
    assert not any("booster" in name or "lab" in name for name in installed)
    # every module of the agent imports with only what the image holds
    walk = (
        "import importlib, pkgutil, gemini_agent\n"
        "for m in pkgutil.walk_packages(gemini_agent.__path__, 'gemini_agent.'):\n"
        "    importlib.import_module(m.name)\n"
    )
    out = agent_image.run(["/opt/gemini-agent/bin/python", "-c", walk])
    assert out.returncode == 0, out.stderr


def test_agent_image_can_load_the_module_and_runs_as_root_for_net_admin(agent_image) -> None:
    # uid 0 so that a DaemonSet can grant CAP_NET_ADMIN (Kubernetes has no ambient
    # capabilities for other users); modprobe for a loader init container
    assert (agent_image.uid, agent_image.gid) == (0, 0)
    assert (agent_image.rootfs / "usr/bin/kmod").exists()
    assert agent_image.env["PATH"].startswith("/opt/gemini-agent/bin:")


# --- the Booster image --------------------------------------------------------------------


def test_booster_image_runs_as_an_unprivileged_user(booster_image) -> None:
    assert booster_image.uid == 10001 and booster_image.gid == 10001
    passwd = (booster_image.rootfs / "etc/passwd").read_text().splitlines()
    entry = next(line.split(":") for line in passwd if line.split(":")[2] == "10001")
    assert entry[0] == "booster" and entry[6] == "/usr/sbin/nologin"
    home = booster_image.rootfs / booster_image.cwd.lstrip("/")
    assert (home.stat().st_uid, home.stat().st_mode & 0o777) == (10001, 0o700)


def test_booster_image_entry_point_answers_version(booster_image) -> None:
    assert booster_image.args == ["/opt/gemini-booster/bin/booster", "serve"]
    booster_image.assert_version("booster", "booster")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def booster_serving(booster_image) -> Iterator[str]:
    """`booster serve --migrate` from the image on its embedded PostgreSQL, on loopback ports."""
    http, grpc_port = _free_port(), _free_port()
    env = {
        "GEMINI_BOOSTER_HTTP_HOST": "127.0.0.1",
        "GEMINI_BOOSTER_HTTP_PORT": str(http),
        "GEMINI_BOOSTER_GRPC_LISTEN": f"127.0.0.1:{grpc_port}",
    }
    args = [*booster_image.args, "--migrate"]
    log = (booster_image.rootfs.parent / "serve.log").open("w+")
    proc = subprocess.Popen(
        booster_image.command(args, env), stdout=log, stderr=subprocess.STDOUT, text=True
    )
    try:
        yield f"http://127.0.0.1:{http}"
    finally:
        _stop(proc)
        log.seek(0)
        print(log.read()[-3000:])
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the entry point, which is PID 1 of its namespace (unshare itself ignores the
    signal while it waits); if it lingers, killing unshare takes the whole namespace down."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    pids = children.read_text().split() if children.exists() else []
    for pid in pids:
        os.kill(int(pid), signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_ok(url: str, deadline_s: float) -> httpx.Response:
    end = time.monotonic() + deadline_s
    last: object = None
    while time.monotonic() < end:
        try:
            r = httpx.get(url, timeout=2)
            if r.status_code == 200:
                return r
            last = r.status_code
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer 200 within {deadline_s} s (last: {last})")


def test_booster_image_serves_health_on_its_embedded_postgres(booster_serving) -> None:
    # generous deadlines: initdb and the migrations run first, on a shared 2-core machine
    assert _wait_ok(f"{booster_serving}/livez", 180).status_code == 200
    assert _wait_ok(f"{booster_serving}/readyz", 180).status_code == 200


# --- Debian packages ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def debs(built) -> dict[str, Path]:
    _run_script(str(ROOT / "packaging/debian/build.sh"))
    out = VAR / "debs"
    return {
        "agent": out / f"gemini-agent_{_version('agent')}_amd64.deb",
        "dkms": next(out.glob("gemini-fusion-dkms_*_all.deb")),
    }


def _deb_field(deb: Path, field: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "--field", str(deb), field], check=True, capture_output=True, text=True
    ).stdout.strip()


def _deb_contents(deb: Path) -> dict[str, tuple[str, str]]:
    """path → (mode string, owner/group) from dpkg-deb --contents."""
    out = subprocess.run(
        ["dpkg-deb", "--contents", str(deb)], check=True, capture_output=True, text=True
    ).stdout
    rows = {}
    for line in out.splitlines():
        mode, owner, *_rest = line.split()
        path = line.split(" ./", 1)[1].split(" -> ")[0].rstrip("/")
        rows["/" + path] = (mode, owner)
    return rows


def test_agent_deb_declares_what_it_installs(debs) -> None:
    deb = debs["agent"]
    assert _deb_field(deb, "Package") == "gemini-agent"
    assert _deb_field(deb, "Version") == _version("agent")
    assert "python3 (>= 3.11)" in _deb_field(deb, "Depends")
    rows = _deb_contents(deb)
    assert rows["/etc/gemini/agent.toml"] == ("-rw-------", "root/root")
    assert "/lib/systemd/system/gemini-agent.service" in rows
    assert rows["/usr/bin/gemini-agent"][0].startswith("l")
    assert "/opt/gemini-agent/bin/gemini-agent" in rows
    assert not any(re.search(r"/(scipy|sklearn|matplotlib|pgserver)/", p) for p in rows)
    control = subprocess.run(
        ["dpkg-deb", "--info", str(deb), "conffiles"], check=True, capture_output=True, text=True
    ).stdout.split()
    assert control == ["/etc/gemini/agent.toml"]


def _base_rootfs(dest: Path) -> Path:
    """The images' Debian base, unpacked: the tarball packaging/lib.sh keeps (in the machine's
    cache, built there first if it is not)."""
    tar = subprocess.run(
        ["bash", "-c", "source packaging/lib.sh && base_rootfs"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with tarfile.open(tar) as tf:
        tf.extractall(dest, filter="fully_trusted")
    return dest


def test_agent_deb_installs_and_runs_in_a_debian_root(debs, tmp_path) -> None:
    rootfs = _base_rootfs(tmp_path / "root")
    shutil.copy(debs["agent"], rootfs / "tmp/agent.deb")
    install = subprocess.run(
        ["chroot", str(rootfs), "dpkg", "-i", "/tmp/agent.deb"], capture_output=True, text=True
    )
    assert install.returncode == 0, install.stderr
    status = subprocess.run(
        ["chroot", str(rootfs), "dpkg-query", "-W", "-f=${Status}", "gemini-agent"],
        capture_output=True,
        text=True,
    )
    assert status.stdout == "install ok installed"
    out = subprocess.run(
        ["chroot", str(rootfs), "/usr/bin/env", "-i", "/usr/bin/gemini-agent", "--version"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gemini-agent", _version("agent")]
    if shutil.which("systemd-analyze"):
        # the unit as installed, its ExecStart included, checked against systemd's own units
        # (the minimal root has no systemd; the host's stand in for the targets it orders after)
        units = rootfs / "usr/lib/systemd/system"
        shutil.copytree("/usr/lib/systemd/system", units, symlinks=True, dirs_exist_ok=True)
        unit = "/lib/systemd/system/gemini-agent.service"
        verify = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", f"--root={rootfs}", unit],
            capture_output=True,
            text=True,
            cwd=rootfs,
        )
        assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    # purge takes the package, its conffile and its state away
    purge = subprocess.run(
        ["chroot", str(rootfs), "dpkg", "--purge", "gemini-agent"], capture_output=True, text=True
    )
    assert purge.returncode == 0, purge.stderr
    assert not (rootfs / "opt/gemini-agent").exists()
    assert not (rootfs / "etc/gemini/agent.toml").exists()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is missing")
def test_agent_unit_exposure_is_low_with_net_admin_its_only_capability(tmp_path) -> None:
    unit = ROOT / "packaging/systemd/gemini-agent.service"
    out = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout
    exposure = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
    # systemd's scale: 0 (fully locked down) to 10 (unprotected); ≤ 2 is its "OK" band's
    # lower half. CAP_NET_ADMIN and the host network are what the agent is for.
    assert exposure <= 2.0, out
    settings = dict(
        line.split("=", 1)
        for line in unit.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    assert settings["CapabilityBoundingSet"] == settings["AmbientCapabilities"] == "CAP_NET_ADMIN"


def _kbuild_sources(kmod: Path) -> set[str]:
    """The .c files Kbuild compiles and every local header they (and those headers) include."""
    objs = re.search(r"tcp_fusion-y\s*:=\s*(.*)", (kmod / "Kbuild").read_text()).group(1).split()
    todo = [o.replace(".o", ".c") for o in objs]
    found: set[str] = set()
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        todo += re.findall(r'#include\s+"([^"]+)"', (kmod / name).read_text())
    return found


def test_dkms_deb_ships_every_source_the_module_build_needs(debs) -> None:
    deb = debs["dkms"]
    conf = (ROOT / "fusion-kmod/dkms.conf").read_text()
    name = re.search(r'PACKAGE_NAME="([^"]+)"', conf).group(1)
    version = re.search(r'PACKAGE_VERSION="([^"]+)"', conf).group(1)
    assert _deb_field(deb, "Package") == "gemini-fusion-dkms"
    assert _deb_field(deb, "Version") == version
    assert _deb_field(deb, "Depends").startswith("dkms")
    rows = _deb_contents(deb)
    src = f"/usr/src/{name}-{version}"
    needed = _kbuild_sources(ROOT / "fusion-kmod") | {"Kbuild", "Makefile", "dkms.conf"}
    assert {f"{src}/{f}" for f in needed} <= set(rows)
    assert not any(p.endswith((".o", ".ko", ".mod.c", ".cmd")) for p in rows)
    assert "/usr/lib/modules-load.d/gemini-fusion.conf" in rows
    postinst = subprocess.run(
        ["dpkg-deb", "--info", str(deb), "postinst"], check=True, capture_output=True, text=True
    ).stdout
    assert f"common.postinst {name} {version}" in postinst
