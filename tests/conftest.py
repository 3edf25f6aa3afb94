"""Shared fixtures: a real PostgreSQL (embedded via pgserver, or GEMINI_TEST_DATABASE_URL), a
fresh migrated database per test, and a whole Booster (gRPC + REST) on loopback ports.

Also the CI tiers: every test is marked with the resources it uses (see ``tiers_of``), so that
``pytest -m unit`` runs the tests that need none of them and ``-m postgres`` (``browser``,
``lab``, ``tools``) the tests that need that one."""

from __future__ import annotations

import functools
import os
import shlex
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType, FunctionType, ModuleType

from gemini_booster.config import GRPC_CORE_EXPERIMENTS, Settings, apply_grpc_core_experiments

# Booster's servers in these tests run on the gRPC core that `booster serve` configures, which
# reads its experiments once, when it initialises: so before anything imports grpc.
apply_grpc_core_experiments(GRPC_CORE_EXPERIMENTS)

import grpc  # noqa: E402
import httpx  # noqa: E402
import pytest  # noqa: E402
from sqlalchemy import Engine, create_engine, make_url, text  # noqa: E402

from gemini_api.v1 import booster_pb2_grpc as pb_grpc  # noqa: E402
from gemini_booster.service.app import BoosterServer  # noqa: E402
from gemini_booster.storage import database  # noqa: E402

OPERATOR = "test-operator-token"
AGENT = "test-agent-token"


@pytest.fixture(scope="session")
def pg_admin_url(tmp_path_factory) -> Iterator[str]:
    url = os.environ.get("GEMINI_TEST_DATABASE_URL")
    if not url:
        os.environ.setdefault("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("runtime")))
        url = database.start_embedded(tmp_path_factory.mktemp("pg"))
    yield url
    template = _MIGRATED_TEMPLATES.pop(url, None)
    if template:  # a server of one's own (GEMINI_TEST_DATABASE_URL) is left as it was found
        _admin_execute(url, f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')


# The database migrated to head once per server and session, which each test's database is a
# copy of: CREATE DATABASE … TEMPLATE copies it in ~0.1 s where running the migrations took
# 0.4–1.7 s on a loaded CI machine, for each of some 300 tests. The tests of the migrations
# themselves run them on their own database (at_revision).
_MIGRATED_TEMPLATES: dict[str, str] = {}


def _admin_execute(pg_admin_url: str, statement: str) -> None:
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(statement))
    admin.dispose()


def _database_url(pg_admin_url: str, name: str) -> str:
    return make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)


def _migrated_template(pg_admin_url: str) -> str:
    """The name of this server's migrated template database, made at the first call."""
    if pg_admin_url not in _MIGRATED_TEMPLATES:
        name = f"t_template_{uuid.uuid4().hex[:12]}"
        _admin_execute(pg_admin_url, f'CREATE DATABASE "{name}"')
        engine = database.make_engine(_database_url(pg_admin_url, name))
        database.migrate(engine)
        engine.dispose()  # no session may stay on a template while it is copied
        _MIGRATED_TEMPLATES[pg_admin_url] = name
    return _MIGRATED_TEMPLATES[pg_admin_url]


def new_database(pg_admin_url: str) -> str:
    """A new database on the real server, migrated to head (a copy of the session's migrated
    template); returns its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    template = _migrated_template(pg_admin_url)
    _admin_execute(pg_admin_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return _database_url(pg_admin_url, name)


@pytest.fixture
def db_url(pg_admin_url) -> Iterator[str]:
    """A new database for one test, dropped afterwards."""
    url = new_database(pg_admin_url)
    yield url
    _admin_execute(pg_admin_url, f'DROP DATABASE "{make_url(url).database}" WITH (FORCE)')


@dataclass
class Running:
    server: BoosterServer
    grpc_target: str
    http: httpx.Client

    @property
    def booster(self):
        return self.server.booster

    @property
    def engine(self):
        return self.server.engine

    def stub(self) -> pb_grpc.BoosterStub:
        return pb_grpc.BoosterStub(grpc.insecure_channel(self.grpc_target))


def make_settings(db_url: str, **overrides) -> Settings:
    values = dict(
        database_url=db_url,
        grpc_listen="127.0.0.1:0",
        http_port=0,
        bootstrap_operator_token=OPERATOR,
        bootstrap_agent_token=AGENT,
        # One fleet-wide agent token for the tests' many synthetic hosts; per-host tokens and
        # the refusal of unbound ones are tested in test_identity.py.
        allow_unbound_agent_tokens=True,
        refit_interval_s=3600,
        # Refits in this process: a worker pool per test costs seconds of start-up; the pool
        # itself is exercised by the tests that run `booster serve` (test_replicas.py).
        refit_processes=0,
    )
    values.update(overrides)
    return Settings(**values)


def lab_fleet_settings(db_url: str) -> Callable[[str], Settings]:
    """Booster for a lab run listening where the run says: each lab host has a token of its
    own, bound to it (no bootstrap agent token, no unbound tokens), refits every 2 s."""
    return lambda listen: make_settings(
        db_url,
        grpc_listen=listen,
        refit_interval_s=2,
        bootstrap_agent_token=None,
        allow_unbound_agent_tokens=False,
    )


_END_OTHER_SESSIONS = text(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


def at_revision(engine: Engine, revision: str) -> None:
    """Empty the test database and migrate it up to ``revision`` only: a database as an older
    release left it, for a migration test to take on to head."""
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    database.migrate(engine, revision)


def end_other_sessions(conn) -> None:
    """End every session on ``conn``'s database but its own: what its clients see of a server
    restart (their next statement fails; a pool reconnects)."""
    conn.execute(_END_OTHER_SESSIONS)


@contextmanager
def serve(db_url: str, **overrides) -> Iterator[Running]:
    """A whole Booster on ``db_url`` with ``overrides`` of the test settings."""
    server = BoosterServer(make_settings(db_url, **overrides)).start()
    http = httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30)
    try:
        yield Running(server, f"127.0.0.1:{server.grpc_port}", http)
    finally:
        http.close()
        server.stop()


@pytest.fixture
def booster(db_url) -> Iterator[Running]:
    with serve(db_url) as running:
        yield running


def free_port() -> int:
    """A loopback port nobody listens on now (for servers that must be told their port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def agent_md(token: str = AGENT) -> tuple:
    return (("authorization", f"Bearer {token}"),)


def insert_old_policy_and_context(conn) -> None:
    """A policy named 'old' and one context, written with the columns every migration since
    0001 has: for tests that migrate a database holding data."""
    conn.execute(
        text(
            "INSERT INTO policies (name, sigma, region, bounds, mode, target_cc, acq_func,"
            " exploration_share, n_initial_points, min_flows, history_hours, time_buckets,"
            " max_model_points, revision) SELECT 'old', 1, 'production', '{}', 'contextual',"
            " 'fusion', 'gp_hedge', 0.1, 5, 1, 24, 1, 500, 1"
        )
    )
    conn.execute(
        text(
            "INSERT INTO contexts (src_region, src_isp, dst_region, dst_isp, hour)"
            " VALUES ('a', 'b', 'c', 'd', 1)"
        )
    )


# ---- CI tiers ----------------------------------------------------------------------------------
#
# A test's tiers are derived from what it reaches: the fixtures it uses (with every fixture those
# use), and every name that its function, its fixtures and the helpers they call from tests/
# refer to, followed through helpers and classes defined under tests/ (so a test that starts
# PostgreSQL, boots a guest or runs a tool through a helper of its own is marked too), together
# with the string constants they hold (the executables they run). A test marked `lab` by hand
# keeps it. `unit` is a test that reaches none of them; as a safety net, a `unit` test that
# starts one of the tiers' executables anyway fails, naming it (see _unit_guard).

RESOURCE_TIERS = ("postgres", "browser", "lab", "tools")

# fixture name -> tier (fixtures that use these are found through pytest's fixture closure)
TIER_FIXTURES = {"pg_admin_url": "postgres", "browser": "browser"}

# qualified names of objects (module.qualname; a module's name alone) -> tier
TIER_OBJECTS = {
    "gemini_booster.storage.database.start_embedded": "postgres",
    "pgserver": "postgres",
    "selenium": "browser",
    "gemini_lab.vm.run_in_guest": "lab",
    "gemini_lab.uml.run_in_uml": "lab",
    "gemini_lab.uml.build_kernel": "lab",
    "gemini_lab.host.run_plan": "lab",
    "gemini_lab.host.build_module": "lab",
    "gemini_lab.abtest.run_abtest": "lab",
    "gemini_lab.cubic.run_cubic": "lab",
    "gemini_lab.loop.run_loop": "lab",
    "gemini_lab.loop.run_closed_loop": "lab",
    "gemini_lab.tune.run_tune": "lab",
    "gemini_lab.datapath_eval.run_eval": "lab",
    "gemini_lab.vm.build_initramfs": "lab",
    "tests.test_helm.tool": "tools",  # helm, kubeconform, promtool … built into var/tools
}

# executables (a string constant, or a path whose last part is one of these) -> tier; also what
# the unit guard refuses to let a `unit` test start
TIER_EXECUTABLES = {
    **dict.fromkeys(("postgres", "pg_ctl", "initdb", "pg_ctlcluster"), "postgres"),
    **dict.fromkeys(("chromium", "chromedriver", "chrome", "google-chrome"), "browser"),
    **dict.fromkeys(("qemu-system-x86_64", "qemu-system-aarch64", "vmlinux"), "lab"),
    **dict.fromkeys(
        (
            "helm", "kubeconform", "promtool", "umoci", "debootstrap", "mmdebstrap", "dpkg-deb",
            "dkms", "make", "systemd-analyze", "kube-apiserver", "kube-controller-manager", "etcd",
        ),
        "tools",
    ),
}  # fmt: skip

# the project's heavy build scripts, named in a test -> tier
TIER_SCRIPTS = {
    "build-kernel.sh": "lab",
    "build-in-trixie.sh": "tools",
    "build.sh": "tools",  # packaging/images/build.sh, packaging/debian/build.sh
    "install-tools.sh": "tools",
}


def _executable_tier(word: str) -> str | None:
    name = word.rsplit("/", 1)[-1]
    return TIER_EXECUTABLES.get(name) or TIER_SCRIPTS.get(name)


def _qualname(obj: object) -> str | None:
    if isinstance(obj, ModuleType):
        return obj.__name__
    module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{qual}" if isinstance(module, str) and isinstance(qual, str) else None


def _ours(obj: object) -> bool:
    """True for what is defined under tests/ (followed further)."""
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "tests" or module.startswith("tests."))


def _walk(code: CodeType, globs: dict) -> set[str]:
    found: set[str] = set()
    stack: list[tuple[CodeType, dict]] = [(code, globs)]
    seen: set[CodeType] = set()
    while stack:
        code, globs = stack.pop()
        if code in seen:
            continue
        seen.add(code)
        for const in code.co_consts:
            if isinstance(const, CodeType):
                stack.append((const, globs))
            elif isinstance(const, str):
                found.add(const)
            elif isinstance(const, tuple):
                found.update(c for c in const if isinstance(c, str))
        found.update(code.co_names)  # also local imports: `from selenium import webdriver`
        modules = [globs[n] for n in code.co_names if isinstance(globs.get(n), ModuleType)]
        for name in code.co_names:
            objects = [globs[name]] if name in globs else []
            objects += [getattr(m, name) for m in modules if name in vars(m)]
            for obj in objects:
                obj = getattr(obj, "__wrapped__", obj)  # functools.cache, decorators
                if isinstance(obj, str | os.PathLike):
                    found.add(str(os.fspath(obj)))  # a module constant: a tool's or script's path
                    continue
                qual = _qualname(obj)
                if qual:
                    found.add(qual)
                if not _ours(obj):
                    continue
                if isinstance(obj, FunctionType):
                    stack.append((obj.__code__, obj.__globals__))
                elif isinstance(obj, type):
                    for member in vars(obj).values():
                        member = getattr(member, "__func__", member)
                        member = getattr(member, "fget", member)
                        if isinstance(member, FunctionType):
                            stack.append((member.__code__, member.__globals__))
    return found


@functools.cache
def _reach(fn: FunctionType) -> frozenset[str]:
    """Qualified names, raw names and string constants reached from ``fn`` (memoised: fixtures
    and helpers are shared by many tests)."""
    return frozenset(_walk(fn.__code__, fn.__globals__))


def tiers_of(item: pytest.Item) -> set[str]:
    """The resource tiers ``item`` needs (empty for a unit test)."""
    tiers = {m.name for m in item.iter_markers() if m.name in RESOURCE_TIERS}
    names = getattr(item, "fixturenames", ())
    tiers |= {TIER_FIXTURES[n] for n in names if n in TIER_FIXTURES}
    functions: list[Callable] = []
    if isinstance(item, pytest.Function):
        functions.append(item.function)
        infos = item._fixtureinfo.name2fixturedefs  # the closure, with the fixtures' fixtures
        functions += [d.func for defs in infos.values() for d in defs if _ours(d.func)]
    for fn in functions:
        fn = getattr(fn, "__wrapped__", fn)
        if not isinstance(fn, FunctionType):
            continue
        for found in _reach(fn):
            tier = TIER_OBJECTS.get(found) or TIER_OBJECTS.get(found.split(".", 1)[0])
            tier = tier or _executable_tier(found)
            if tier:
                tiers.add(tier)
    return tiers


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tiers = tiers_of(item)
        for tier in sorted(tiers) or ["unit"]:
            if item.get_closest_marker(tier) is None:
                item.add_marker(tier)


class _UnitGuard(subprocess.Popen):
    """subprocess.Popen for a `unit` test: refuses the executables of another tier."""

    def __init__(self, args, *rest, **kwargs) -> None:
        words = shlex.split(args) if isinstance(args, str) else [os.fspath(a) for a in args]
        for word in words[:1] + [w for w in words[1:3] if not w.startswith("-")]:
            tier = _executable_tier(str(word))
            if tier:
                pytest.fail(
                    f"a test marked unit runs {word!r} ({tier} tier): tests/conftest.py's tier "
                    "rules miss how it reaches it; add it there",
                    pytrace=False,
                )
        super().__init__(args, *rest, **kwargs)


@pytest.fixture(autouse=True)
def _unit_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("unit") is not None:
        monkeypatch.setattr(subprocess, "Popen", _UnitGuard)
        monkeypatch.setattr(database, "start_embedded", _refuse_postgres)


def _refuse_postgres(*args, **kwargs) -> str:
    pytest.fail(
        "a test marked unit starts PostgreSQL: tests/conftest.py's tier rules miss how it reaches "
        "it; add it there",
        pytrace=False,
    )
