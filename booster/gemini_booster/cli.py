"""``booster``: serve, migrate, manage credentials and policies, or run the demo.

Settings come from GEMINI_BOOSTER_* variables and the TOML file named by GEMINI_BOOSTER_CONFIG;
see ``gemini_booster.config``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from .config import Settings

log = logging.getLogger("gemini_booster")


def _engine(settings: Settings):
    from .service.app import database_url
    from .storage import database

    engine = database.make_engine(database_url(settings))
    database.migrate(engine)
    return engine


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from .service.app import BoosterServer

    server = BoosterServer(settings).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down")
    server.stop()
    return 0


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    _engine(settings).dispose()
    print("schema is at head")
    return 0


def cmd_token(settings: Settings, args: argparse.Namespace) -> int:
    from .storage import repository as repo

    engine = _engine(settings)
    if args.token_cmd == "create":
        token = repo.create_token(engine, args.name, args.role, actor="cli")
        print(token)  # shown once, on stdout only; never logged
    else:
        repo.revoke_token(engine, args.name, actor="cli")
        print(f"revoked {args.name}")
    return 0


def cmd_policy(settings: Settings, args: argparse.Namespace) -> int:
    from .models import PolicyCreate
    from .storage import repository as repo

    engine = _engine(settings)
    if args.policy_cmd == "create":
        body = json.loads(args.fields) if args.fields else {}
        policy = repo.create_policy(engine, PolicyCreate(name=args.name, **body), actor="cli")
        print(policy.model_dump_json(indent=2))
    else:
        for p in repo.list_policies(engine):
            print(p.model_dump_json())
    return 0


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(settings, rounds=args.rounds, keep_serving=args.keep_serving)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="booster", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve", help="run the gRPC and REST servers until SIGTERM")
    sub.add_parser("migrate", help="bring the database schema to the latest revision")
    tok = sub.add_parser("token", help="create or revoke an API credential")
    tsub = tok.add_subparsers(dest="token_cmd", required=True)
    tc = tsub.add_parser("create")
    tc.add_argument("--name", required=True)
    tc.add_argument("--role", required=True, choices=["agent", "viewer", "operator"])
    tr = tsub.add_parser("revoke")
    tr.add_argument("--name", required=True)
    pol = sub.add_parser("policy", help="create or list policies")
    psub = pol.add_subparsers(dest="policy_cmd", required=True)
    pc = psub.add_parser("create")
    pc.add_argument("name")
    pc.add_argument("--fields", help="JSON of policy fields, e.g. '{\"sigma\": 0.1}'")
    psub.add_parser("list")
    demo = sub.add_parser("demo", help="Booster on embedded PostgreSQL plus a synthetic demo fleet")
    demo.add_argument("--rounds", type=int, default=12)
    demo.add_argument("--keep-serving", action="store_true")
    return p


COMMANDS = {
    "serve": cmd_serve,
    "migrate": cmd_migrate,
    "token": cmd_token,
    "policy": cmd_policy,
    "demo": cmd_demo,
}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    os.environ.setdefault("XDG_RUNTIME_DIR", str(Path(settings.data_dir).resolve()))
    return COMMANDS[args.cmd](settings, args)


if __name__ == "__main__":
    sys.exit(main())
