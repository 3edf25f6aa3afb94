"""``booster``'s conventions (issue #35 item 5): ``--help`` without the service stack, a missing
settings file is an error naming it, an unknown flag is named, arguments are checked before any
database starts, and list/show commands print ``-o json`` or ``-o table``.

The subprocess tests run ``python -m gemini_booster.cli`` as an operator types ``booster``; the
absence of the data directory afterwards shows that no embedded PostgreSQL was started."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from gemini_booster.cli import output
from gemini_booster.cli.parser import parse

from .test_cli import booster, one_line_error

HEAVY = ("sqlalchemy", "skopt", "sklearn", "fastapi", "grpc", "alembic", "pydantic", "uvicorn")


def test_the_cli_module_imports_none_of_the_service_stack() -> None:
    """What ``booster --help`` loads: argparse and the version, not the service (which took
    3-10 s); the time itself is recorded in benchmarks/results/cli.md, not asserted."""
    code = (
        "import sys, gemini_booster.cli\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert not set(HEAVY) & set(loaded), set(HEAVY) & set(loaded)
    result = booster("--help")
    assert result.returncode == 0 and "COMMAND" in result.stdout and "``" not in result.stdout


@pytest.mark.parametrize("how", ["env", "flag", "flag-after-command"])
def test_a_missing_config_file_is_an_error_naming_it(tmp_path, how) -> None:
    missing = tmp_path / "nonexistent.toml"
    data = tmp_path / "data"
    if how == "env":
        result = booster("policy", "list", tmp=data, config=str(missing))
    elif how == "flag":
        result = booster("--config", str(missing), "policy", "list", tmp=data)
    else:
        result = booster("policy", "list", "-c", str(missing), tmp=data)
    message = one_line_error(result)
    assert str(missing) in message and "does not exist" in message
    assert not data.exists()  # no embedded database was started, let alone acted on


def test_a_config_file_that_is_a_directory_or_not_toml_is_named(tmp_path) -> None:
    data = tmp_path / "data"
    message = one_line_error(booster("migrate", tmp=data, config=str(tmp_path)))
    assert message.startswith(f"settings file {tmp_path} is a directory")
    broken = tmp_path / "broken.toml"
    broken.write_text("http_port = [\n")
    message = one_line_error(booster("migrate", tmp=data, config=str(broken)))
    assert message.startswith(f"settings file {broken} is not TOML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("http_prot = 80\n")
    assert "http_prot" in one_line_error(booster("migrate", tmp=data, config=str(unknown)))
    assert not data.exists()


def usage_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    return result.stderr.strip().splitlines()[-1]


def test_an_unknown_flag_is_named() -> None:
    assert usage_error(booster("--bogus")) == "booster: error: unrecognized arguments: --bogus"
    line = usage_error(booster("override", "list", "cdn", "--contxt", "x"))
    assert line == (
        "booster override list: error: unrecognized arguments: --contxt (did you mean --context?) x"
    )
    line = usage_error(booster("token"))
    assert (
        line == "booster token: error: token needs a command: one of create, rotate, revoke, list"
    )
    assert "invalid choice: 'polcy'" in usage_error(booster("polcy", "list"))


@pytest.mark.parametrize(
    "args,says",
    [
        (("override", "pin", "cdn", "--theta", "{bad"), "--theta: not JSON"),
        (("override", "pin", "cdn", "--theta", '{"k": true}'), "--theta: expected a JSON object"),
        (("override", "rollback", "cdn"), "rollback: give exactly one of --at and"),
        (("override", "rollback", "cdn", "--at", "2026-11-27T14:00"), "--at: needs a time zone"),
        (("token", "revoke"), "give exactly one of --name and --host"),
        (("token", "create", "--role", "viewer", "--host", "h"), "--host binds agent tokens"),
        (("token", "create", "--role", "viewer"), "--name is required"),
        (("policy", "create", "p", "--fields", "[1]"), "--fields: expected a JSON object"),
        (("policy", "create", "p", "--fields", '{"sigma": -1}'), "invalid PolicyCreate: sigma"),
    ],
)
def test_arguments_are_checked_before_any_database_starts(tmp_path, args, says) -> None:
    data = tmp_path / "data"
    assert one_line_error(booster(*args, tmp=data)).startswith(says)
    assert not data.exists()


@pytest.mark.parametrize("bad", [("--port", "70000"), ("--rounds", "0"), ("--hours", "x")])
def test_demo_options_are_checked(bad) -> None:
    assert "argument " + bad[0] in usage_error(booster("demo", *bad))


def test_output_defaults_to_a_table_on_a_terminal_and_json_elsewhere() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert output.choose(None, Tty()) is output.Format.TABLE
    assert output.choose(None, io.StringIO()) is output.Format.JSON
    assert output.choose("json", Tty()) is output.Format.JSON
    assert parse(["policy", "list", "-o", "table"]).output == "table"


def test_a_table_aligns_columns_and_writes_values_compactly() -> None:
    rows = [
        {"name": "cdn", "theta": {"k": 40, "m": 7}, "at": datetime(2026, 11, 27, tzinfo=UTC)},
        {"name": "a-longer-name", "theta": None, "revoked": True},
    ]
    text = output.table(rows, ("name", "theta", "at", "revoked"))
    assert text.splitlines() == [
        "NAME           THETA     AT                         REVOKED",
        "cdn            k=40 m=7  2026-11-27T00:00:00+00:00  -",
        "a-longer-name  -         -                          yes",
    ]


def test_policy_list_and_show_as_table_and_json(db_url, tmp_path) -> None:
    fields = '{"sigma": 0.5, "objective": "completion"}'
    created = booster("policy", "create", "cdn", "--fields", fields, db=db_url, tmp=tmp_path)
    assert created.returncode == 0, created.stderr
    listed = booster("policy", "list", "-o", "json", db=db_url, tmp=tmp_path)
    assert [p["name"] for p in json.loads(listed.stdout)] == ["cdn"]
    table = booster("policy", "list", "-o", "table", db=db_url, tmp=tmp_path).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "DATAPATH",
        "OBJECTIVE",
        "SIGMA",
        "MODE",
        "EXPLORATION_SHARE",
        "REVISION",
    ]
    assert table[1].split()[:4] == ["cdn", "fusion", "completion", "0.5"]
    shown = booster("policy", "show", "cdn", "-o", "table", db=db_url, tmp=tmp_path).stdout
    assert any(line.split() == ["sigma", "0.5"] for line in shown.splitlines())
    tokens = booster("token", "list", "-o", "table", db=db_url, tmp=tmp_path).stdout.splitlines()
    assert tokens[0].split()[:3] == ["NAME", "ROLE", "HOST_ID"]
