"""The four distributions (gemini-api, gemini-agent, gemini-booster, gemini-lab).

An agent host installs gemini-api and gemini-agent only, so what those two declare and what they
import decides what every host in a fleet carries. These tests build each wheel the way a
release would (``pip wheel --no-deps``) and hold it to three things:

- its Requires-Dist names only the libraries its component is allowed (no optimiser, database
  or plotting library for the agent), each pinned exactly, at the same version everywhere;
- it ships every module and data file of its folder (a new subpackage is not left out);
- importing every module of the component loads only its own dependencies' code, found by
  importing it in a fresh interpreter and mapping each new top-level module to the distribution
  that provides it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent

# component folder → (distribution, the packages it ships with their source folders)
COMPONENTS: dict[str, tuple[str, dict[str, Path]]] = {
    "api": ("gemini-api", {"gemini_api": ROOT / "api/gemini_api"}),
    "agent": ("gemini-agent", {"gemini_agent": ROOT / "agent/gemini_agent"}),
    "booster": (
        "gemini-booster",
        {
            "gemini_booster": ROOT / "booster/gemini_booster",
            "gemini_migrations": ROOT / "migrations",
        },
    ),
    "lab": ("gemini-lab", {"gemini_lab": ROOT / "lab/gemini_lab"}),
}

# What each distribution may declare. The agent's list is the point of the split: a host gets
# gRPC, the netlink client, the sketch, an mmdb reader, metrics and settings, nothing more.
ALLOWED: dict[str, set[str]] = {
    "gemini-api": {"ddsketch", "grpcio", "protobuf", "pyroute2"},
    "gemini-agent": {
        "gemini-api",
        "grpcio",
        "maxminddb",
        "prometheus-client",
        "pydantic",
        "pydantic-settings",
    },
    "gemini-booster": {
        "gemini-api",
        "alembic",
        "fastapi",
        "grpcio",
        "grpcio-health-checking",
        "grpcio-reflection",
        "numpy",
        "pgserver",
        "prometheus-client",
        "protobuf",
        "psycopg",
        "pydantic",
        "pydantic-settings",
        "scikit-learn",
        "scikit-optimize",
        "scipy",
        "sqlalchemy",
        "swagger-ui-bundle",
        "threadpoolctl",
        "uvicorn",
        "uvloop",
    },
    "gemini-lab": {
        "gemini-api",
        "gemini-agent",
        "gemini-booster",
        "matplotlib",
        "mmdb-writer",
        "netaddr",
        "prometheus-client",
    },
}

# Libraries a host must never load, named so that a failure says which one crept in.
HEAVY = {"scipy", "sklearn", "skopt", "matplotlib", "pgserver", "numpy", "sqlalchemy", "psycopg"}

# Data files each distribution must carry, relative to its package.
DATA = {
    "gemini-api": ["gemini_api/specs/fusion.toml", "gemini_api/v1/booster.proto"],
    "gemini-booster": [
        "gemini_booster/service/dashboard/index.html",
        "gemini_booster/service/dashboard/dashboard.js",
        "gemini_migrations/script.py.mako",
    ],
    "gemini-lab": ["gemini_lab/guest_init.sh", "gemini_lab/scenarios/satellite.toml"],
}


def _wheel_metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(zf.read(name).decode())
    return {"name": [msg["Name"]], "requires": msg.get_all("Requires-Dist") or []}


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """distribution → its wheel, built from this checkout without dependencies or network."""
    out = tmp_path_factory.mktemp("wheels")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    built: dict[str, Path] = {}
    for folder, (dist, _) in COMPONENTS.items():
        # setuptools copies into build/ and packs what is there: a module deleted since the last
        # build would still be shipped
        shutil.rmtree(ROOT / folder / "build", ignore_errors=True)
        subprocess.run(
            [*pip_wheel, "--no-build-isolation", "--wheel-dir", str(out), str(ROOT / folder)],
            check=True,
            capture_output=True,
        )
        shutil.rmtree(ROOT / folder / "build", ignore_errors=True)
        stem = dist.replace("-", "_")
        built[dist] = next(out.glob(f"{stem}-*.whl"))
    return built


def _requirements(wheel: Path) -> list[Requirement]:
    return [Requirement(r) for r in _wheel_metadata(wheel)["requires"]]


@pytest.mark.parametrize("dist", list(ALLOWED))
def test_wheel_declares_only_its_allowed_dependencies_pinned(wheels, dist) -> None:
    reqs = _requirements(wheels[dist])
    names = {canonicalize_name(r.name) for r in reqs}
    assert names <= ALLOWED[dist], f"{dist} declares {sorted(names - ALLOWED[dist])}"
    assert names, f"{dist} declares no dependency at all"
    unpinned = [str(r) for r in reqs if not re.fullmatch(r"==[^,*]+", str(r.specifier))]
    assert not unpinned, f"{dist} has dependencies not pinned with ==: {unpinned}"


def test_agent_host_gets_no_heavy_library(wheels) -> None:
    declared = {
        canonicalize_name(r.name)
        for dist in ("gemini-api", "gemini-agent")
        for r in _requirements(wheels[dist])
    }
    heavy = {"scipy", "scikit-learn", "scikit-optimize", "matplotlib", "pgserver", "numpy"}
    assert not declared & heavy


def test_every_pin_agrees_across_distributions(wheels) -> None:
    pins: dict[str, dict[str, str]] = {}
    for dist, wheel in wheels.items():
        for r in _requirements(wheel):
            pins.setdefault(canonicalize_name(r.name), {})[dist] = str(r.specifier)
    split = {name: by for name, by in pins.items() if len(set(by.values())) > 1}
    assert not split, f"one library pinned at different versions: {split}"


def _source_files(package: str, folder: Path) -> Iterator[str]:
    for path in folder.rglob("*.py"):
        if "__pycache__" not in path.parts:
            yield f"{package}/{path.relative_to(folder).as_posix()}"


@pytest.mark.parametrize("folder", list(COMPONENTS))
def test_wheel_ships_every_module_and_data_file(wheels, folder) -> None:
    dist, packages = COMPONENTS[folder]
    with zipfile.ZipFile(wheels[dist]) as zf:
        shipped = set(zf.namelist())
    expected = {f for pkg, src in packages.items() for f in _source_files(pkg, src)}
    expected |= set(DATA.get(dist, []))
    assert expected - shipped == set(), f"{dist} wheel lacks {sorted(expected - shipped)}"
    foreign = {n.split("/")[0] for n in shipped if not n.startswith(dist.replace("-", "_") + "-")}
    assert foreign == set(packages), f"{dist} wheel ships other top-level names: {foreign}"


def test_entry_points_name_the_clis(wheels) -> None:
    expected = {
        "gemini-agent": "gemini-agent = gemini_agent.cli:main",
        "gemini-booster": "booster = gemini_booster.cli:main",
        "gemini-lab": "gemini-lab = gemini_lab.cli:main",
    }
    for dist, line in expected.items():
        with zipfile.ZipFile(wheels[dist]) as zf:
            name = next(n for n in zf.namelist() if n.endswith("entry_points.txt"))
            assert line in zf.read(name).decode().splitlines(), dist


# --- import closure -----------------------------------------------------------------------

# Run in a fresh interpreter as if only the allowed distributions were installed: a finder in
# front of all others refuses every top-level module outside the standard library and the
# allowed set, exactly as a missing package would. Then import the package and every module
# under it. Optional probes (grpc looks for grpc_tools, pyroute2 for psutil) fail as they would
# on a host and are printed; a module the code really needs makes the import fail.
_CLOSURE = """
import importlib, importlib.abc, json, pkgutil, sys
allowed = set(json.loads(sys.argv[2])) | set(sys.stdlib_module_names)
refused = set()

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if "." in name or name in allowed or name.startswith("_"):
            return None
        refused.add(name)
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
pkg = importlib.import_module(sys.argv[1])
for mod in pkgutil.walk_packages(pkg.__path__, sys.argv[1] + "."):
    importlib.import_module(mod.name)
loaded = {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)
print(json.dumps({"loaded": sorted(loaded), "refused": sorted(refused)}))
"""


def _dependency_closure(wheels: dict[str, Path], dist: str) -> set[str]:
    """dist and every distribution it needs, transitively: our own from the built wheels'
    metadata, third-party from what is installed (with extras and environment markers)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(dist, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        if key[0] in wheels:
            reqs = _requirements(wheels[key[0]])
        else:
            reqs = [Requirement(r) for r in metadata.requires(name) or []]
        envs = [{"extra": e} for e in extras] + [{"extra": ""}]
        for r in reqs:
            if r.marker is None or any(r.marker.evaluate(env) for env in envs):
                todo.append((r.name, frozenset(r.extras)))
    return {name for name, _ in seen}


def _modules_of(wheels: dict[str, Path], dists: set[str]) -> set[str]:
    """The top-level modules the given distributions provide."""
    mods = {
        mod
        for mod, providers in metadata.packages_distributions().items()
        if {canonicalize_name(d) for d in providers} & dists
    }
    for dist, packages in COMPONENTS.values():
        if dist in dists:
            mods |= set(packages)
    return mods


@pytest.mark.parametrize(
    ("folder", "package"),
    [("api", "gemini_api"), ("agent", "gemini_agent"), ("booster", "gemini_booster")],
)
def test_imports_need_nothing_outside_declared_dependencies(
    wheels, tmp_path, folder, package
) -> None:
    dist = COMPONENTS[folder][0]
    allowed = _modules_of(wheels, _dependency_closure(wheels, dist))
    run = subprocess.run(
        [sys.executable, "-c", _CLOSURE, package, json.dumps(sorted(allowed))],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # an empty folder: nothing of the checkout is importable by accident
    )
    assert run.returncode == 0, f"{package} needs more than {dist} declares:\n{run.stderr}"
    seen = json.loads(run.stdout.splitlines()[-1])
    print(f"{package}: optional imports absent on a minimal install: {seen['refused']}")
    if dist == "gemini-agent":
        assert not set(seen["loaded"]) & HEAVY, f"the agent loads {seen['loaded']}"
