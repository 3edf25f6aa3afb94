"""``booster demo``: a real Booster on embedded PostgreSQL, driven by a synthetic demo fleet.

The fleet (``fleet.py``) is labelled as what it is: simulated hosts with a known utility surface,
talking to Booster over the real gRPC API. The demo prints, per round, each context's incumbent
utility against the known optimum, so convergence can be watched.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from typing import Any

from . import simulation as sim
from .config import Settings
from .domain import ContextKey
from .fleet import SyntheticFleet, host_ids
from .models import PolicyCreate
from .service.app import BoosterServer
from .storage import repository as repo

DEMO_POLICY = "demo"
DEMO_HOSTS = 8


def _new_value() -> str:
    return "gmn_demo_" + secrets.token_urlsafe(24)


def _tokens(server: BoosterServer, settings: Settings) -> dict[str, Any]:
    """Demo credentials, created once and kept in a 0600 file beside the database: an operator
    token, and one agent token per demo host, bound to it as a real host's would be."""
    path = settings.data_dir / "demo-tokens.json"
    if path.exists():
        tokens: dict[str, Any] = json.loads(path.read_text())
        if isinstance(tokens.get("hosts"), dict):
            return tokens
    tokens = {"operator": _new_value(), "hosts": {h: _new_value() for h in host_ids(DEMO_HOSTS)}}
    repo.ensure_token(server.engine, "demo-operator", "operator", tokens["operator"])
    for host, value in tokens["hosts"].items():
        repo.ensure_token(server.engine, f"demo-agent-{host}", "agent", value, host_id=host)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(tokens, f)
    return tokens


def run_demo(settings: Settings, rounds: int, keep_serving: bool) -> int:
    server = BoosterServer(settings, migrate=True).start()
    try:
        tokens = _tokens(server, settings)
        if DEMO_POLICY not in server.booster.policies:
            repo.create_policy(
                server.engine,
                PolicyCreate(name=DEMO_POLICY, sigma=1.0, exploration_share=0.75),
                actor="demo",
            )
            server.booster.reload_policies()
        policy = server.booster.policies[DEMO_POLICY]
        print(
            f"Booster serving: gRPC 127.0.0.1:{server.grpc_port}, "
            f"REST http://{settings.http_host}:{server.http_port}/docs, "
            f"dashboard http://{settings.http_host}:{server.http_port}/dashboard/"
        )
        print(f"credentials: {settings.data_dir / 'demo-tokens.json'} (mode 0600)")
        print(
            "demo fleet: 8 SIMULATED hosts per context over real gRPC; utility from a known "
            "synthetic surface (not a network)\n"
        )
        fleet = SyntheticFleet(
            f"127.0.0.1:{server.grpc_port}",
            tokens["hosts"],
            DEMO_POLICY,
            hosts_per_context=DEMO_HOSTS,
        )
        names = {c.key: c for c in fleet.contexts}
        print("round  " + "  ".join(f"{c.key[3]:>22}" for c in fleet.contexts))
        for r in range(rounds):
            fleet.run_round(r)
            server.booster.refit(policy)
            snap = server.booster.plan_snapshot(policy.id)
            cells = []
            for key, ctx in names.items():
                plan = snap.get(ContextKey(*key))
                if plan is None:
                    cells.append("no plan yet")
                    continue
                u = sim.true_utility(ctx, server.booster.spec.from_key(plan.incumbent_key))
                cells.append(f"{u:7.1f} of {sim.best_utility(ctx):5.1f} Mbit/s")
            print(f"{r + 1:>5}  " + "  ".join(f"{c:>22}" for c in cells))
        fleet.close()
        print(
            "\nincumbent θ per context: "
            f"curl -H 'authorization: Bearer …' http://{settings.http_host}:{server.http_port}"
            f"/v1/policies/{DEMO_POLICY}/parameters"
        )
        if keep_serving:
            print("serving until interrupted (Ctrl-C)")
            threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
