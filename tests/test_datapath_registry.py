"""Datapaths are one registry (api/gemini_api/datapaths.py): Booster and the agent look them up
there and branch on their kinds, never on their names; a policy names its datapath explicitly,
and policies stored before that are migrated to the datapath they searched."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from gemini_api.datapaths import (
    DEFAULT_DATAPATH,
    Apply,
    Message,
    Records,
    load_registry,
    registry,
)
from gemini_api.theta import SPECS_DIR, ThetaError, load_spec
from gemini_booster.models import PolicyCreate, PolicyUpdate
from gemini_booster.storage import database
from gemini_booster.storage import policies as policy_store

from .conftest import OPERATOR, at_revision, auth

REPO = Path(__file__).resolve().parents[1]
# Where no datapath's name may appear: everything of Booster and the agent. The registry and
# the specs live in api/, which is where a datapath is declared.
CHECKED = (REPO / "booster" / "gemini_booster", REPO / "agent" / "gemini_agent")


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def name_uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, text) of each string literal that is a datapath's name or CC (docstrings aside),
    and of each use of a constant named after one (FUSION, CUBIC, ...)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    upper = {n.upper() for n in names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in docs:
            found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Name) and node.id in upper:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.alias) and node.name in upper:
            found.append((node.lineno, node.name))
    return sorted(found)


def test_no_module_of_booster_or_the_agent_branches_on_a_datapaths_name() -> None:
    names = {d.name for d in registry()} | {d.cc for d in registry()}
    offences = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for root in CHECKED
        for path in sorted(root.rglob("*.py"))
        if not path.name.endswith("_pb2.py")
        for line, what in name_uses(path.read_text(), names)
    ]
    assert offences == [], "look datapaths up in gemini_api.datapaths:\n" + "\n".join(offences)


def test_the_name_check_sees_a_branch_on_a_name() -> None:
    """The check above finds what it forbids, in each form it forbids."""
    names = {"fusion", "cubic"}
    src = 'FUSION = "fusion"\nif cc == "cubic":\n    pass\nx = FUSION\n'
    assert name_uses(src, names) == [(1, "'fusion'"), (1, "FUSION"), (2, "'cubic'"), (4, "FUSION")]
    assert name_uses('"""fusion"""\nx = "fusion-records"\n', names) == []


def test_every_spec_is_a_datapath_of_a_known_kind() -> None:
    reg = registry()
    assert reg.names()[0] == DEFAULT_DATAPATH
    assert set(reg.names()) == {p.stem for p in SPECS_DIR.glob("*.toml")}
    for d in reg:
        assert d.spec.datapath == d.name
        # a kernel datapath names its module; a user-space transport has none to load
        kernel_module = d.module.startswith("tcp_")
        assert kernel_module != (d.apply is Apply.CONFIG_FILE and d.module == ""), d.name
        assert (d.apply is Apply.PROFILE_TABLE) == (d.spec.scope == "context"), d.name
        assert reg.for_cc(d.cc) is d
    fusion = reg.get("fusion")
    assert (fusion.apply, fusion.records, fusion.message) == (
        Apply.PROFILE_TABLE,
        Records.FLOW_RECORDS,
        Message.THETA,
    )
    assert fusion.spec == load_spec()
    cubic = reg.get("cubic")
    assert (cubic.apply, cubic.records, cubic.message) == (
        Apply.MODULE_PARAMS,
        Records.SOCK_DIAG,
        Message.DATAPATH_THETA,
    )
    assert cubic.genl_family == ""
    # GEMINI and DC-Vegas run per context as Fusion does, each through its own module's table
    # (family and net.<name> named after the datapath, as fusion-kmod/<name>_table.h does)
    for name in ("gemini", "dcvegas"):
        d = reg.get(name)
        assert (d.apply, d.records, d.message) == (
            Apply.PROFILE_TABLE,
            Records.FLOW_RECORDS,
            Message.DATAPATH_THETA,
        )
        assert d.genl_family == name and d.sysctl_root() == Path("/proc/sys/net") / name


def _write(dir: Path, name: str, extra: str) -> None:
    (dir / f"{name}.toml").write_text(
        f'version = 1\ndatapath = "{name}"\nscope = "host"\n{extra}\n'
        '[[param]]\nname = "a"\nsymbol = "a"\nmeaning = "m"\nunit = "u"\nscale = 1\n'
        "production = [1, 2]\nwide = [0, 3]\ndefault = 1\n"
    )


def test_a_new_datapath_is_one_spec_file(tmp_path: Path) -> None:
    """The recipe's first step: a spec file is all the registry needs; kinds follow its scope."""
    (tmp_path / "fusion.toml").write_text((SPECS_DIR / "fusion.toml").read_text())
    _write(tmp_path, "newcc", "ecn = true")
    reg = load_registry(tmp_path)
    new = reg.get("newcc")
    assert (new.cc, new.module, new.apply, new.records, new.ecn) == (
        "newcc",
        "tcp_newcc",
        Apply.MODULE_PARAMS,
        Records.SOCK_DIAG,
        True,
    )
    assert reg.names() == ("fusion", "newcc")


def test_a_table_datapaths_family_is_its_name_unless_its_spec_names_one(tmp_path: Path) -> None:
    (tmp_path / "fusion.toml").write_text((SPECS_DIR / "fusion.toml").read_text())
    _write(tmp_path, "tab", "")
    _write(tmp_path, "own", 'genl_family = "own_v2"')
    for name in ("tab", "own"):
        path = tmp_path / f"{name}.toml"
        path.write_text(path.read_text().replace('scope = "host"', 'scope = "context"'))
    reg = load_registry(tmp_path)
    assert (reg.get("tab").apply, reg.get("tab").genl_family) == (Apply.PROFILE_TABLE, "tab")
    assert reg.get("own").genl_family == "own_v2"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('apply = "sysfs"', "specs/bad.toml: apply 'sysfs'; expected one of"),
        ('apply = "profile_table"', "specs/bad.toml: apply 'profile_table' with scope 'host'"),
        ('cc = "fusion"', "two datapaths share a congestion-control name"),
        ('message = "theta"', "only one datapath can travel in the Theta message"),
        ('genl_family = "bad"', "specs/bad.toml: genl_family without apply 'profile_table'"),
    ],
)
def test_a_wrong_spec_is_refused_naming_its_file_and_key(
    tmp_path: Path, extra: str, message: str
) -> None:
    (tmp_path / "fusion.toml").write_text((SPECS_DIR / "fusion.toml").read_text())
    _write(tmp_path, "bad", extra)
    with pytest.raises(ThetaError, match=message):
        load_registry(tmp_path)


def test_a_policy_names_its_datapath_and_old_clients_target_cc_still_works() -> None:
    assert PolicyCreate(name="p").datapath == DEFAULT_DATAPATH
    assert PolicyCreate(name="p", datapath="cubic").target_cc == "cubic"
    assert PolicyCreate.model_validate({"name": "p", "target_cc": "cubic"}).datapath == "cubic"
    assert PolicyUpdate.model_validate({"target_cc": "cubic"}).datapath == "cubic"
    with pytest.raises(ValueError, match="target_cc: 'bbr' is no datapath's congestion control"):
        PolicyCreate.model_validate({"name": "p", "target_cc": "bbr"})
    with pytest.raises(ValueError, match="no datapath 'vegas'"):
        PolicyCreate(name="p", datapath="vegas")
    with pytest.raises(ValueError, match="'cubic' is datapath 'cubic', not 'fusion'"):
        PolicyCreate.model_validate({"name": "p", "target_cc": "cubic", "datapath": "fusion"})


def test_the_rest_api_takes_and_shows_the_datapath(booster) -> None:
    h = auth(OPERATOR)
    r = booster.http.post("/v1/policies", json={"name": "c", "datapath": "cubic"}, headers=h)
    assert r.status_code == 201, r.text
    assert (r.json()["datapath"], r.json()["target_cc"]) == ("cubic", "cubic")
    assert booster.booster.policies["c"].spec == registry().get("cubic").spec
    r = booster.http.patch("/v1/policies/c", json={"datapath": "fusion"}, headers=h)
    assert r.status_code == 200, r.text
    assert (r.json()["datapath"], r.json()["target_cc"]) == ("fusion", "fusion")
    r = booster.http.post("/v1/policies", json={"name": "v", "datapath": "vegas"}, headers=h)
    assert r.status_code == 422 and "no datapath 'vegas'" in r.text


def test_migration_names_each_policys_datapath_from_its_target_cc(db_url) -> None:
    """0010 → head: cubic stays cubic; fusion, and a CC without a spec (which searched Fusion's
    θ), become fusion; the revision moves only for the policy whose datapath was guessed."""
    engine = create_engine(db_url)
    at_revision(engine, "0010")
    fusion = json.dumps(load_spec().region_bounds("production"))
    with engine.begin() as conn:
        for name, target in (("f", "fusion"), ("c", "cubic"), ("b", "bbr")):
            conn.execute(
                text(
                    "INSERT INTO policies (name, sigma, region, bounds, mode, target_cc, acq_func,"
                    " exploration_share, n_initial_points, min_flows, history_hours,"
                    " time_buckets, max_model_points, revision) VALUES (:n, 1, 'production',"
                    " CAST(:b AS jsonb), 'contextual', :t, 'gp_hedge', 0.1, 5, 1, 24, 1, 500, 1)"
                ),
                {"n": name, "b": fusion, "t": target},
            )
    database.migrate(engine)
    policies = {p.name: p for p in policy_store.list_policies(engine)}
    engine.dispose()
    got = {n: (p.datapath, p.target_cc, p.revision) for n, p in policies.items()}
    assert got == {
        "f": ("fusion", "fusion", 1),
        "c": ("cubic", "cubic", 1),
        "b": ("fusion", "fusion", 2),
    }
