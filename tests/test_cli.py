"""``booster`` as an operator types it, in a process of its own: ``--version``, ordinary errors
as one line on stderr with exit status 1 (never a traceback, never a password), migrations only
in ``booster migrate``, and the token commands for per-host credentials."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

import gemini_booster
from gemini_booster.storage import credentials as token_store
from gemini_booster.storage import database


@pytest.fixture
def empty_db(pg_admin_url) -> Iterator[str]:
    """A new database with no schema at all."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def booster(*args: str, db: str | None = None, tmp: Path | None = None, **env: str):
    variables = {k: v for k, v in os.environ.items() if not k.startswith("GEMINI_BOOSTER_")}
    if db is not None:
        variables["GEMINI_BOOSTER_DATABASE_URL"] = db
    if tmp is not None:
        variables["GEMINI_BOOSTER_DATA_DIR"] = str(tmp)
    variables |= {f"GEMINI_BOOSTER_{k.upper()}": v for k, v in env.items()}
    return subprocess.run(
        [sys.executable, "-m", "gemini_booster.cli", *args],
        env=variables,
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The failure's one line (asserting there is exactly one, and no traceback)."""
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("booster: error: "), lines[0]
    return lines[0].removeprefix("booster: error: ")


def test_version() -> None:
    result = booster("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"booster {gemini_booster.__version__}"
    assert gemini_booster.__version__ != "0+unknown"


def test_a_url_that_is_not_a_database_url_is_one_line(tmp_path) -> None:
    message = one_line_error(booster("policy", "list", db="nonsense://x", tmp=tmp_path))
    assert message.startswith("database_url: not a database URL")


def test_an_unreachable_database_is_one_line_without_the_password(tmp_path) -> None:
    url = "postgresql+psycopg://gemini:hunter2-secret@127.0.0.1:1/gemini"
    message = one_line_error(booster("policy", "list", db=url, tmp=tmp_path))
    assert message.startswith("database: OperationalError")
    assert "hunter2" not in message


def test_bad_settings_are_one_line_naming_the_setting(tmp_path) -> None:
    message = one_line_error(booster("migrate", tmp=tmp_path, grpc_processes="0"))
    assert message.startswith("invalid Settings: grpc_processes: ")
    secret = "fleet-secret-value"
    message = one_line_error(booster("migrate", tmp=tmp_path, bootstrap_agent_token=secret))
    assert "allow_unbound_agent_tokens" in message and secret not in message


def test_only_migrate_changes_the_schema(empty_db, tmp_path) -> None:
    message = one_line_error(booster("policy", "list", db=empty_db, tmp=tmp_path))
    head = database.head_revision()
    assert message == (
        f"database schema is at revision none, this Booster needs {head}: "
        "run 'booster migrate' first"
    )
    # serve refuses too, before it listens on anything.
    assert one_line_error(booster("serve", db=empty_db, tmp=tmp_path)) == message
    engine = database.make_engine(empty_db)
    try:
        assert database.current_revision(engine) is None  # nothing was migrated by the above
        result = booster("migrate", db=empty_db, tmp=tmp_path)
        assert result.returncode == 0, result.stderr
        assert database.current_revision(engine) == head
    finally:
        engine.dispose()
    assert booster("policy", "list", db=empty_db, tmp=tmp_path).returncode == 0


def test_policy_errors_are_one_line(db_url, tmp_path) -> None:
    assert one_line_error(booster("policy", "show", "nope", db=db_url, tmp=tmp_path)) == (
        "no policy named 'nope'"
    )
    message = one_line_error(
        booster("policy", "create", "p", "--fields", "{bad", db=db_url, tmp=tmp_path)
    )
    assert message.startswith("--fields: not JSON")
    message = one_line_error(
        booster("policy", "create", "p", "--fields", '{"sigma": -1}', db=db_url, tmp=tmp_path)
    )
    assert message.startswith("invalid PolicyCreate: sigma: ")
    created = booster(
        "policy", "create", "p", "--fields", '{"sigma": 0.5}', db=db_url, tmp=tmp_path
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["sigma"] == 0.5
    again = booster("policy", "create", "p", db=db_url, tmp=tmp_path)
    assert one_line_error(again) == "policy 'p' exists"


def test_host_tokens_from_the_command_line(db_url, tmp_path) -> None:
    created = booster("token", "create", "--role", "agent", "--host", "h1", db=db_url, tmp=tmp_path)
    assert created.returncode == 0, created.stderr
    first = created.stdout.strip()
    rotated = booster("token", "rotate", "--host", "h1", "--grace-s", "60", db=db_url, tmp=tmp_path)
    assert rotated.returncode == 0, rotated.stderr
    second = rotated.stdout.strip()
    assert "expire at" in rotated.stderr and first not in rotated.stderr

    engine = database.make_engine(db_url)
    try:
        found = token_store.lookup_tokens(engine)
        old, new = found[token_store.hash_token(first)], found[token_store.hash_token(second)]
        assert old.host_id == new.host_id == "h1"
        assert old.expires_at is not None and new.expires_at is None
    finally:
        engine.dispose()

    listed = booster("token", "list", db=db_url, tmp=tmp_path).stdout
    assert "h1" in listed and first not in listed and token_store.hash_token(first) not in listed

    message = one_line_error(
        booster("token", "create", "--role", "viewer", "--host", "h1", db=db_url, tmp=tmp_path)
    )
    assert message == "--host binds agent tokens only; use --role agent"
    revoked = booster("token", "revoke", "--host", "h1", db=db_url, tmp=tmp_path)
    assert revoked.returncode == 0 and revoked.stdout.count("h1@") == 2
    assert one_line_error(booster("token", "rotate", "--host", "h1", db=db_url, tmp=tmp_path)) == (
        "no live token for host 'h1'"
    )


def test_serve_on_a_port_in_use_is_one_line(db_url, tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = booster(
            "serve", db=db_url, tmp=tmp_path, grpc_listen=f"127.0.0.1:{port}", http_port="0"
        )
    assert one_line_error(result) == (
        f"gRPC: cannot listen on 127.0.0.1:{port} (in use, or not an address)"
    )
