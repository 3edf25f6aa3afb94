"""gemini-agent's command line: --version, ordinary errors as one line without a traceback, and
the exit codes its docstring promises (2 for configuration, 1 for a failure while running)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gemini_agent.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from gemini_agent.metrics import agent_version


def _agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GEMINI_AGENT_")}
    return subprocess.run(
        [sys.executable, "-m", "gemini_agent.cli", *args],
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_version_prints_the_agents_version():
    out = _agent("--version")
    assert out.returncode == EXIT_OK
    assert out.stdout.strip() == f"gemini-agent {agent_version()}"


@pytest.mark.parametrize(
    "env,says",
    [
        ({"GEMINI_AGENT_INTERVAL_S": "-1"}, "invalid setting interval_s"),
        ({"GEMINI_AGENT_MAX_CONTEXTS": "0"}, "invalid setting max_contexts"),
        ({"GEMINI_AGENT_CONFIG": "/nonexistent/agent.toml"}, "cannot read the configuration"),
        (
            {"GEMINI_AGENT_TOKEN": "t", "GEMINI_AGENT_TOKEN_FILE": "/etc/hostname"},
            "invalid settings: Value error, set token or token_file, not both",
        ),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(env, says):
    out = _agent("show-config", env=env)
    assert out.returncode == EXIT_USAGE
    assert says in _one_line(out.stderr)


def test_a_config_file_that_is_not_toml_or_has_unknown_keys(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("interval_s = [\n")
    out = _agent("show-config", env={"GEMINI_AGENT_CONFIG": str(broken)})
    assert out.returncode == EXIT_USAGE and "is not TOML" in _one_line(out.stderr)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("intervals = 5\n")
    out = _agent("show-config", env={"GEMINI_AGENT_CONFIG": str(unknown)})
    assert out.returncode == EXIT_USAGE and "intervals" in _one_line(out.stderr)


def test_a_bad_destination_table_names_file_and_line(tmp_path):
    table = tmp_path / "geo.csv"
    table.write_text("prefix,region,isp\n10.1.0.0/16,eu,a\n10.0.0.1/8,eu,b\n")
    out = _agent(
        "run",
        env={"GEMINI_AGENT_GEO_CSV": str(table), "GEMINI_AGENT_SPOOL_DIR": str(tmp_path / "s")},
    )
    assert out.returncode == EXIT_USAGE
    assert _one_line(out.stderr) == f"gemini-agent: {table}:3: 10.0.0.1/8 has host bits set"


def test_a_missing_token_file_stops_the_agent_in_one_line(tmp_path):
    absent = tmp_path / "token"
    out = _agent(
        "run",
        env={"GEMINI_AGENT_TOKEN_FILE": str(absent), "GEMINI_AGENT_SPOOL_DIR": str(tmp_path / "s")},
    )
    assert out.returncode == EXIT_USAGE
    line = _one_line(out.stderr)
    assert line == f"gemini-agent: cannot read token_file {absent}: No such file or directory"


@pytest.mark.skipif(Path("/proc/sys/net/fusion").exists(), reason="tcp_fusion is loaded here")
def test_running_without_the_module_fails_in_one_line_with_exit_1(tmp_path):
    """Without tcp_fusion, and without socket diagnostics to take flows from instead, the
    agent would report nothing: it says so, and how to run without Fusion, and exits 1."""
    out = _agent(
        "run",
        env={
            "GEMINI_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
            "GEMINI_AGENT_METRICS_LISTEN": "127.0.0.1:0",
        },
    )
    assert out.returncode == EXIT_FAILED
    last = out.stderr.strip().splitlines()[-1]
    assert last == (
        "gemini-agent: generic netlink family 'fusion' not found: is tcp_fusion loaded? "
        "(a host without Fusion reports flows through sockdiag = true)"
    )
    assert "Traceback" not in out.stderr


def test_an_unknown_command_is_a_usage_error():
    out = _agent("frobnicate")
    assert out.returncode == EXIT_USAGE and "invalid choice" in out.stderr
