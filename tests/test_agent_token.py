"""The agent's token follows its file: a rotated token is used without a restart, a file that
cannot be read keeps the last good token (said once, token never logged), a token from the
environment stays fixed, and a token file without a token is refused at start (two token
sources at once: tests/test_agent_cli.py).
The rotation against a real Booster is in tests/test_identity.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gemini_agent.config import AgentSettings
from gemini_agent.credentials import AgentToken
from gemini_agent.metrics import AgentMetrics

OLD, NEW, NEWER = "tok-old-secret", "tok-new-secret", "tok-newer-secret"


def bearer(token: AgentToken) -> str:
    ((key, value),) = token.metadata()
    assert key == "authorization"
    return value.removeprefix("Bearer ")


def reloads(metrics: AgentMetrics, outcome: str) -> float:
    return metrics.token_reloads.labels(outcome)._value.get()


def replace(path: Path, text: str) -> None:
    """Write the way a Secret volume or a careful script does: a new file renamed over."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@pytest.fixture(autouse=True)
def no_agent_environment(monkeypatch) -> None:
    for name in list(os.environ):
        if name.startswith("GEMINI_AGENT_"):
            monkeypatch.delenv(name)


def from_file(tmp_path: Path) -> tuple[AgentToken, AgentMetrics, Path]:
    path = tmp_path / "token"
    path.write_text(OLD + "\n")
    metrics = AgentMetrics()
    return AgentToken(AgentSettings(token_file=path), metrics), metrics, path


def test_a_rotated_token_file_is_used_without_a_restart(tmp_path) -> None:
    token, metrics, path = from_file(tmp_path)
    assert bearer(token) == OLD
    replace(path, NEW + "\n")
    assert bearer(token) == NEW
    path.write_text(NEWER)  # rewritten in place: the size changes, so does the identity
    assert bearer(token) == NEWER
    assert reloads(metrics, "reloaded") == 2


def test_an_unusable_file_keeps_the_last_good_token_and_says_so_once(tmp_path, caplog) -> None:
    token, metrics, path = from_file(tmp_path)
    caplog.set_level(logging.INFO, logger="gemini_agent.credentials")
    replace(path, "   \n")  # a half-done rotation: the file is there, the token is not
    assert bearer(token) == OLD and bearer(token) == OLD
    path.unlink()
    assert bearer(token) == OLD and bearer(token) == OLD
    assert reloads(metrics, "unreadable") == 2  # once per change, not once per call
    replace(path, NEW)
    assert bearer(token) == NEW
    assert str(path) in caplog.text
    assert OLD not in caplog.text and NEW not in caplog.text


def test_a_token_in_the_toml_configuration_rotates_with_that_file(tmp_path, monkeypatch) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'token = "{OLD}"\nhost_id = "h1"\n')
    monkeypatch.setenv("GEMINI_AGENT_CONFIG", str(config))
    token = AgentToken(AgentSettings(), AgentMetrics())
    assert bearer(token) == OLD
    replace(config, f'host_id = "h1"\ntoken = "{NEW}"\n')
    assert bearer(token) == NEW
    replace(config, "token = [")  # not TOML: keep the token in use
    assert bearer(token) == NEW


def test_a_token_from_the_environment_is_fixed(tmp_path, monkeypatch) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'token = "{OLD}"\n')
    monkeypatch.setenv("GEMINI_AGENT_CONFIG", str(config))
    monkeypatch.setenv("GEMINI_AGENT_TOKEN", NEW)
    token = AgentToken(AgentSettings(), AgentMetrics())
    replace(config, f'token = "{NEWER}"\n')
    assert bearer(token) == NEW  # the environment wins over the file, at start and after


def test_a_token_file_without_a_token_stops_the_agent_at_start(tmp_path) -> None:
    path = tmp_path / "token"
    path.write_text("\n")
    with pytest.raises(ValueError, match=f"token_file {path} holds no token"):
        AgentToken(AgentSettings(token_file=path), AgentMetrics())
    with pytest.raises(ValueError, match=f"cannot read token_file {tmp_path / 'absent'}"):
        AgentToken(AgentSettings(token_file=tmp_path / "absent"), AgentMetrics())
