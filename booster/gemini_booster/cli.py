"""``booster``: serve, migrate, manage credentials, policies and θ overrides, or run the demo.

Settings come from GEMINI_BOOSTER_* variables and the TOML file named by GEMINI_BOOSTER_CONFIG;
see ``gemini_booster.config``.

Only ``booster migrate`` changes the schema (and ``serve --migrate``, for a single machine);
every other command checks that the schema is at this Booster's head and stops if it is not.
An ordinary failure (bad settings, a database that cannot be reached, an unknown policy, bad
JSON) is one line on stderr and exit status 1; a usage error is argparse's, status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy import Engine
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from . import __version__
from .config import Settings
from .storage.database import SchemaNotAtHead
from .storage.repository import Conflict, NotFound

log = logging.getLogger("gemini_booster")

EXIT_FAILURE = 1
DEFAULT_GRACE_S = 86_400  # a rotated token's predecessor stays valid this long by default


class CliError(Exception):
    """An ordinary failure, printed as one line."""


def _engine(settings: Settings, migrate: bool = False) -> Engine:
    from .service.app import database_url
    from .storage import database

    engine = database.make_engine(database_url(settings))
    if migrate:
        database.migrate(engine)
    else:
        database.require_head(engine)
    return engine


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    from .service.app import BoosterServer

    server = BoosterServer(settings, migrate=True if args.migrate else None).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    log.info("shutting down")
    server.stop()
    return 0


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    _engine(settings, migrate=True).dispose()
    print("schema is at head")
    return 0


def _token_create(engine: Engine, args: argparse.Namespace) -> None:
    from .storage import repository as repo

    if args.host is not None and args.role != "agent":
        raise CliError("--host binds agent tokens only; use --role agent")
    name = args.name or (repo.host_token_name(args.host) if args.host else None)
    if name is None:
        raise CliError("--name is required (it may be left out only with --host)")
    token = repo.create_token(engine, name, args.role, actor="cli", host_id=args.host)
    print(token)  # shown once, on stdout only; never logged
    print(f"created {name}", file=sys.stderr)
    if args.role == "agent" and args.host is None:
        print(
            "warning: this agent token is bound to no host and is refused unless "
            "allow_unbound_agent_tokens is set; prefer --host",
            file=sys.stderr,
        )


def _token_rotate(engine: Engine, args: argparse.Namespace) -> None:
    from .storage import repository as repo

    rotation = repo.rotate_token(
        engine, args.host, actor="cli", grace=timedelta(seconds=args.grace_s)
    )
    print(rotation.token)  # shown once, on stdout only
    print(
        f"created {rotation.name}; {', '.join(rotation.expiring)} expire at "
        f"{rotation.expires_at.isoformat()}",
        file=sys.stderr,
    )


def cmd_token(settings: Settings, args: argparse.Namespace) -> int:
    from .storage import repository as repo

    engine = _engine(settings)
    if args.token_cmd == "create":
        _token_create(engine, args)
    elif args.token_cmd == "rotate":
        _token_rotate(engine, args)
    elif args.token_cmd == "revoke":
        if (args.name is None) == (args.host is None):
            raise CliError("give exactly one of --name and --host")
        if args.host is not None:
            names = repo.revoke_host_tokens(engine, args.host, actor="cli")
            print(f"revoked {', '.join(names)}")
        else:
            repo.revoke_token(engine, args.name, actor="cli")
            print(f"revoked {args.name}")
    else:
        for row in repo.list_tokens(engine):
            print(json.dumps(row, default=str))
    return 0


def _fields(text: str | None) -> dict[str, object]:
    if not text:
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"--fields: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(body, dict):
        raise CliError("--fields: expected a JSON object, e.g. '{\"sigma\": 0.1}'")
    return body


def cmd_policy(settings: Settings, args: argparse.Namespace) -> int:
    from .models import PolicyCreate
    from .storage import repository as repo

    engine = _engine(settings)
    if args.policy_cmd == "create":
        spec = PolicyCreate.model_validate({**_fields(args.fields), "name": args.name})
        policy = repo.create_policy(engine, spec, actor="cli")
        print(policy.model_dump_json(indent=2))
    elif args.policy_cmd == "show":
        try:
            print(repo.get_policy(engine, args.name).model_dump_json(indent=2))
        except NotFound:
            raise CliError(f"no policy named {args.name!r}") from None
    else:
        for p in repo.list_policies(engine):
            print(p.model_dump_json())
    return 0


def _theta(text: str) -> dict[str, int]:
    try:
        theta = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"--theta: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(theta, dict) or not all(isinstance(v, int) for v in theta.values()):
        raise CliError("--theta: expected a JSON object of integers, e.g. '{\"k\": 40}'")
    return theta


def _at(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"--at: not an ISO 8601 time: {text[:64]!r}") from None
    if at.tzinfo is None:
        raise CliError("--at: needs a time zone (e.g. 2026-11-27T14:00:00Z)")
    return at


def cmd_override(settings: Settings, args: argparse.Namespace) -> int:
    """Pin, freeze, roll back, unpin, kill switch: the same operations as the REST API, audited
    as the CLI; every replica serves them from its next GetParameters."""
    from .service import overrides as ops
    from .storage import repository as repo

    engine = _engine(settings)
    try:
        policy = repo.get_policy(engine, args.policy)
    except NotFound:
        raise CliError(f"no policy named {args.policy!r}") from None
    ctx, actor, why = args.context, "cli", getattr(args, "reason", None)
    try:
        if args.override_cmd == "pin":
            n = ops.pin(engine, policy, _theta(args.theta), actor, ctx, why)
        elif args.override_cmd == "freeze":
            n = ops.freeze(engine, policy, actor, ctx, why)
        elif args.override_cmd == "rollback":
            if (args.at is None) == (args.plan_generation is None):
                raise CliError("rollback: give exactly one of --at and --plan-generation")
            at = None if args.at is None else _at(args.at)
            n = ops.rollback(engine, policy, actor, at, args.plan_generation, ctx, why)
        elif args.override_cmd == "unpin":
            n = ops.unpin(engine, policy, actor, ctx)
        elif args.override_cmd == "kill":
            n = ops.kill(engine, policy, actor, ctx, why)
        elif args.override_cmd == "release":
            n = ops.release(engine, policy, actor, ctx)
        else:
            print(json.dumps(ops.listing(engine, policy), default=str))
            return 0
    except (ops.UnknownContext, ops.NothingToOverride) as e:
        raise CliError(str(e)) from None
    print(json.dumps({"policy": policy.name, "changed": n}))
    return 0


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(settings, rounds=args.rounds, keep_serving=args.keep_serving)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="booster", description=__doc__)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", help="run the gRPC and REST servers until SIGTERM")
    serve.add_argument(
        "--migrate",
        action="store_true",
        help="bring the schema to head first (a single machine; a fleet runs 'booster migrate')",
    )
    sub.add_parser("migrate", help="bring the database schema to the latest revision")
    tok = sub.add_parser("token", help="create, rotate, revoke or list API credentials")
    tsub = tok.add_subparsers(dest="token_cmd", required=True)
    tc = tsub.add_parser("create", help="a new credential, printed once on stdout")
    tc.add_argument("--name", help="its name (default for a host's token: host@time)")
    tc.add_argument("--role", required=True, choices=["agent", "viewer", "operator"])
    tc.add_argument("--host", help="the one host an agent token may speak for")
    tro = tsub.add_parser(
        "rotate", help="a new token for a host; its old ones expire after a grace period"
    )
    tro.add_argument("--host", required=True)
    tro.add_argument(
        "--grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"how long the old token stays valid (default {DEFAULT_GRACE_S} s)",
    )
    tr = tsub.add_parser("revoke", help="revoke one token by name, or every token of a host")
    tr.add_argument("--name")
    tr.add_argument("--host")
    tsub.add_parser("list", help="every credential's name, role, host and state (no values)")
    pol = sub.add_parser("policy", help="create, show or list policies")
    psub = pol.add_subparsers(dest="policy_cmd", required=True)
    pc = psub.add_parser("create")
    pc.add_argument("name")
    pc.add_argument("--fields", help="JSON of policy fields, e.g. '{\"sigma\": 0.1}'")
    ps = psub.add_parser("show")
    ps.add_argument("name")
    psub.add_parser("list")
    ovr = sub.add_parser(
        "override",
        help="pin, freeze, roll back or unpin θ, or the kill switch, for a policy or a context",
    )
    osub = ovr.add_subparsers(dest="override_cmd", required=True)
    ctx_help = "one context, src_region/src_isp->dst_region/dst_isp@hour (default: the policy)"
    for name, text in (
        ("list", "the policy's overrides"),
        ("pin", "serve --theta to every host, no exploration"),
        ("freeze", "pin at the current incumbent"),
        ("rollback", "pin at the incumbent of --at or --plan-generation"),
        ("unpin", "remove pins: normal planning again"),
        ("kill", "every host to the datapath's safe default"),
        ("release", "release the kill switch"),
    ):
        o = osub.add_parser(name, help=text)
        o.add_argument("policy")
        o.add_argument("--context", help=ctx_help)
        if name in ("pin", "freeze", "rollback", "kill"):
            o.add_argument("--reason", help="why, for the audit log")
        if name == "pin":
            o.add_argument("--theta", required=True, help="JSON, e.g. '{\"k\": 40, ...}'")
        if name == "rollback":
            o.add_argument("--at", help="ISO 8601 time with zone, e.g. 2026-11-27T14:00:00Z")
            o.add_argument("--plan-generation", type=int)
    demo = sub.add_parser("demo", help="Booster on embedded PostgreSQL plus a synthetic demo fleet")
    demo.add_argument("--rounds", type=int, default=12)
    demo.add_argument("--keep-serving", action="store_true")
    return p


COMMANDS = {
    "serve": cmd_serve,
    "migrate": cmd_migrate,
    "token": cmd_token,
    "policy": cmd_policy,
    "override": cmd_override,
    "demo": cmd_demo,
}


def _problems(e: ValidationError) -> str:
    """A validation error as one line: each field and what is wrong, never the input (which
    may be a secret)."""
    return "; ".join(
        f"{'.'.join(map(str, err['loc'])) or 'settings'}: {err['msg']}" for err in e.errors()
    )


def explain(e: BaseException) -> str | None:
    """One line for an ordinary failure; None for a bug (which keeps its traceback)."""
    if isinstance(e, CliError | SchemaNotAtHead | NotFound | Conflict):
        return str(e)
    if isinstance(e, ValidationError):
        return f"invalid {e.title}: {_problems(e)}"
    if isinstance(e, ArgumentError | NoSuchModuleError):
        return "database_url: not a database URL SQLAlchemy can use (postgresql+psycopg://…)"
    if isinstance(e, DBAPIError):
        # The driver's first line says what failed (refused, no such user…); it never holds a
        # password, and the URL itself is not repeated.
        first = str(e.orig).strip().splitlines()[0] if e.orig is not None else ""
        return f"database: {type(e.orig).__name__}: {first}".rstrip(": ")
    if isinstance(e, ValueError | OSError):
        return str(e)
    return None


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        settings = Settings()
        logging.basicConfig(
            level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        os.environ.setdefault("XDG_RUNTIME_DIR", str(Path(settings.data_dir).resolve()))
        return COMMANDS[args.cmd](settings, args)
    except Exception as e:
        message = explain(e)
        if message is None:
            raise
        print(f"booster: error: {message}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
