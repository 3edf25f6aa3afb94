"""A policy records the version of its datapath's θ spec its stored θ are in (migration 0017):
stored θ are read back by position, so a policy whose θ are in another version than the spec
Booster reads is held — no θ served, no refit, agents' reports kept for a retry (NOT_FOUND) —
until an operator keeps it under another name and creates it again (`booster policy restart`);
and a spec version cannot change without a migration that names it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import grpc
import pytest
from sqlalchemy import text

from gemini_api.datapaths import datapaths, load_datapath
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store

from .conftest import OPERATOR, agent_md, auth

MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations" / "versions"


def newest_spec_versions() -> dict[str, int]:
    """SPEC_VERSIONS of the newest migration that declares them."""
    found: dict[str, int] = {}
    for path in sorted(MIGRATIONS.glob("0*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        found = getattr(module, "SPEC_VERSIONS", found)
    return found


@pytest.mark.unit
def test_a_spec_version_changes_only_with_a_migration_that_names_it() -> None:
    """A datapath added after the newest SPEC_VERSIONS is at its first version; any other
    version must be the one a migration recorded (it converts or holds the stored θ)."""
    migrated = newest_spec_versions()
    assert migrated, "no migration declares SPEC_VERSIONS"
    now = {name: load_datapath(name).version for name in datapaths()}
    assert {n: v for n, v in now.items() if n in migrated} == {
        n: v for n, v in migrated.items() if n in now
    }
    assert all(v == 1 for n, v in now.items() if n not in migrated)


def _hold(engine, name: str, version: int) -> None:
    """What an upgrade to a spec of a new version leaves: the policy's θ in the old one."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE policies SET theta_spec_version = :v WHERE name = :n"),
            {"v": version, "n": name},
        )


def test_a_policy_in_an_older_spec_version_is_held_until_restarted(booster) -> None:
    for name, path in (("dc", "gemini"), ("cdn", "fusion")):
        spec = PolicyCreate(name=name, datapath=path)
        created = policy_store.create_policy(booster.engine, spec, actor="test")
        assert created.theta_spec_version == load_datapath(path).version and created.held is None
    _hold(booster.engine, "dc", 1)
    booster.booster.reload_policies()
    shown = booster.http.get("/v1/policies/dc", headers=auth(OPERATOR)).json()
    assert shown["theta_spec_version"] == 1
    assert "gemini θ spec version 1" in shown["held"] and "version 2" in shown["held"]
    stub = booster.stub()
    ask = pb.GetParametersRequest(host_id="h", policy="dc", contexts=[])
    with pytest.raises(grpc.RpcError) as refused:
        stub.GetParameters(ask, metadata=agent_md())
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "held" in (refused.value.details() or "")
    report = sim.make_report("h", "dc", [])
    with pytest.raises(grpc.RpcError) as kept:
        stub.ReportAggregates(report, metadata=agent_md())
    assert kept.value.code() == grpc.StatusCode.NOT_FOUND  # the agent keeps it and retries
    r = booster.http.post("/v1/policies/dc/refit", headers=auth(OPERATOR))
    assert r.status_code == 409 and "held" in r.text
    # The other policy is served as before.
    ask_cdn = pb.GetParametersRequest(host_id="h", policy="cdn", contexts=[])
    assert stub.GetParameters(ask_cdn, metadata=agent_md()).target_cc == "fusion"

    kept_as, fresh = policy_store.restart_policy(booster.engine, "dc", actor="test")
    assert kept_as == "dc.gemini-v1" and fresh.theta_spec_version == 2 and fresh.held is None
    booster.booster.reload_policies()
    assert stub.GetParameters(ask, metadata=agent_md()).target_cc == "gemini"
    old = booster.http.get(f"/v1/policies/{kept_as}", headers=auth(OPERATOR)).json()
    assert old["held"] is not None and old["sigma"] == fresh.sigma
    with pytest.raises(policy_store.Conflict, match="not held"):
        policy_store.restart_policy(booster.engine, "dc", actor="test")


def test_the_cli_restarts_a_held_policy_in_one_line(db_url, tmp_path) -> None:
    from .test_cli import booster as cli

    assert cli("policy", "create", "dc", "--fields", '{"datapath": "gemini"}', db=db_url,
               tmp=tmp_path).returncode == 0  # fmt: skip
    from sqlalchemy import create_engine

    engine = create_engine(db_url)
    _hold(engine, "dc", 1)
    engine.dispose()
    done = cli("policy", "restart", "dc", db=db_url, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "dc.gemini-v1" in done.stdout and "version 2" in done.stdout
    again = cli("policy", "restart", "dc", db=db_url, tmp=tmp_path)
    assert again.returncode != 0 and len(again.stderr.strip().splitlines()) == 1
    assert "not held" in again.stderr


def test_migration_0017_records_each_policys_spec_version_and_downgrades(db_url) -> None:
    from alembic import command
    from sqlalchemy import create_engine

    from gemini_booster.storage import database

    from .conftest import at_revision, insert_old_policy_and_context

    engine = create_engine(db_url)
    at_revision(engine, "0010")
    with engine.begin() as conn:
        insert_old_policy_and_context(conn)  # a Fusion policy
    database.migrate(engine, "0016")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO policies (name, sigma, region, bounds, mode, datapath,"
                          " acq_func, exploration_share, n_initial_points, min_flows,"
                          " history_hours, time_buckets, max_model_points, revision)"
                          " SELECT 'dc', 1, 'production', '{}', 'contextual', 'gemini',"
                          " 'gp_hedge', 0.1, 5, 1, 24, 1, 500, 1"))  # fmt: skip
    database.migrate(engine)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT name, theta_spec_version FROM policies ORDER BY name"))
        assert [tuple(r) for r in rows] == [("dc", 2), ("old", 1)]
    command.downgrade(database.alembic_config(db_url), "0016")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM policies")).scalar_one() == 2
    engine.dispose()
