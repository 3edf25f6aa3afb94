"""Booster as an operator runs it: ``booster serve`` in a process of its own, killed for real."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from .conftest import AGENT, OPERATOR

START_DEADLINE_S = 180  # a Booster's start on a busy host (migrations, pools, two ports)


def start_booster(
    db_url: str, grpc_port: int, http_port: int, workdir: Path, **settings: str
) -> subprocess.Popen:
    """Start ``booster serve`` on ``db_url`` and return once its REST port answers /livez."""
    env = os.environ | {
        "GEMINI_BOOSTER_DATABASE_URL": db_url,
        "GEMINI_BOOSTER_GRPC_LISTEN": f"127.0.0.1:{grpc_port}",
        "GEMINI_BOOSTER_HTTP_PORT": str(http_port),
        "GEMINI_BOOSTER_BOOTSTRAP_OPERATOR_TOKEN": OPERATOR,
        "GEMINI_BOOSTER_BOOTSTRAP_AGENT_TOKEN": AGENT,
        "GEMINI_BOOSTER_ALLOW_UNBOUND_AGENT_TOKENS": "true",
        "GEMINI_BOOSTER_REFIT_INTERVAL_S": "3600",
        "GEMINI_BOOSTER_DATA_DIR": str(workdir),
    }
    env |= {f"GEMINI_BOOSTER_{k.upper()}": v for k, v in settings.items()}
    log_path = workdir / f"booster-{http_port}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gemini_booster.cli", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, log_path.read_text()
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"Booster did not start: {log_path.read_text()[-2000:]}")


def children(pid: int) -> list[int]:
    """Direct child processes of ``pid`` (from /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
