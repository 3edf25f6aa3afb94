"""Shared set-up for benchmarks: a Booster on a fresh embedded PostgreSQL, and result files."""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from gemini_booster.config import Settings
from gemini_booster.service.app import BoosterServer

RESULTS = Path(__file__).parent / "results"
OPERATOR = "bench-operator"
AGENT = "bench-agent"

# A report method Booster does not serve: each host's reports as messages on one long-lived
# stream of its own (benchmarks.grpc_floor serves it, benchmarks.replicas --floor-stream drives it).
STREAM_METHOD = "ReportStream"


def start_booster(**overrides) -> BoosterServer:
    data = Path(tempfile.mkdtemp(prefix="gemini-bench-"))
    os.environ.setdefault("XDG_RUNTIME_DIR", str(data))
    values = dict(
        data_dir=data,
        grpc_listen="127.0.0.1:0",
        http_port=0,
        bootstrap_operator_token=OPERATOR,
        bootstrap_agent_token=AGENT,
        allow_unbound_agent_tokens=True,  # one shared agent token for the benchmark fleet
        refit_interval_s=3600,
        log_level="WARNING",
    )
    values.update(overrides)
    return BoosterServer(Settings(**values)).start()


def write_result(name: str, command: str, lines: list[str]) -> None:
    RESULTS.mkdir(exist_ok=True)
    header = [
        f"# {name}",
        "",
        f"Command: `{command}`  ",
        f"Run: {datetime.now(UTC):%Y-%m-%d %H:%M UTC} on {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "",
    ]
    text = "\n".join(header + lines) + "\n"
    (RESULTS / f"{name}.md").write_text(text)
    sys.stdout.write(text)
