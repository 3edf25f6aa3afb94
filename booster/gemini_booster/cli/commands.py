"""The commands behind ``booster``'s arguments, imported only once the arguments parsed.

Each command checks its own arguments first (JSON, times, which flags go together) and only
then starts or connects to the database, so a typing mistake is answered at once, not after
the embedded PostgreSQL started. A command that needs the embedded server and waits for it
says so on stderr if the wait is noticeable.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..config import CONFIG_FILE_ENV, Settings, apply_grpc_core_experiments, runtime_dir
from . import output
from .errors import CliError, explain

if TYPE_CHECKING:
    from sqlalchemy import Engine

log = logging.getLogger("gemini_booster")

EXIT_FAILURE = 1
EMBEDDED_NOTICE_AFTER_S = 1.0  # a wait for the embedded server longer than this is announced


def database_url(settings: Settings) -> str:
    """The URL to use: the configured one, or the embedded server's, started if need be."""
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    from ..storage import database

    runtime_dir(settings.data_dir)
    where = settings.data_dir / "postgres"
    notice = threading.Timer(
        EMBEDDED_NOTICE_AFTER_S,
        lambda: print(
            f"booster: starting the embedded PostgreSQL in {where} (no database_url set; "
            "the first start takes a while)…",
            file=sys.stderr,
            flush=True,
        ),
    )
    notice.start()
    try:
        return database.start_embedded(where)
    finally:
        notice.cancel()


def _engine(settings: Settings, migrate: bool = False) -> Engine:
    from ..storage import database

    engine = database.make_engine(database_url(settings))
    if migrate:
        database.migrate(engine)
    else:
        database.require_head(engine)
    return engine


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    apply_grpc_core_experiments(settings.grpc_core_experiments)  # before gRPC is imported
    from ..service.app import BoosterServer

    if settings.database_url is None:
        runtime_dir(settings.data_dir)
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


def _token_name(args: argparse.Namespace) -> str:
    """The new token's name, checked before the database is touched."""
    if args.host is not None and args.role != "agent":
        raise CliError("--host binds agent tokens only; use --role agent")
    if args.name is None and args.host is None:
        raise CliError("--name is required (it may be left out only with --host)")
    from ..storage import credentials as token_store

    return str(args.name or token_store.host_token_name(args.host))


def _token_create(engine: Engine, args: argparse.Namespace, name: str) -> None:
    from ..storage import credentials as token_store

    token = token_store.create_token(engine, name, args.role, actor="cli", host_id=args.host)
    print(token)  # shown once, on stdout only; never logged
    print(f"created {name}", file=sys.stderr)
    if args.role == "agent" and args.host is None:
        print(
            "warning: this agent token is bound to no host and is refused unless "
            "allow_unbound_agent_tokens is set; prefer --host",
            file=sys.stderr,
        )


def _token_rotate(engine: Engine, args: argparse.Namespace) -> None:
    from ..storage import credentials as token_store

    rotation = token_store.rotate_token(
        engine, args.host, actor="cli", grace=timedelta(seconds=args.grace_s)
    )
    print(rotation.token)  # shown once, on stdout only
    print(
        f"created {rotation.name}; {', '.join(rotation.expiring)} expire at "
        f"{rotation.expires_at.isoformat()}",
        file=sys.stderr,
    )


TOKEN_COLUMNS = ("name", "role", "host_id", "created_at", "expires_at", "revoked")


def cmd_token(settings: Settings, args: argparse.Namespace) -> int:
    if args.token_cmd == "revoke" and (args.name is None) == (args.host is None):
        raise CliError("give exactly one of --name and --host")
    name = _token_name(args) if args.token_cmd == "create" else None
    fmt = output.choose(args.output) if args.token_cmd == "list" else None
    from ..storage import credentials as token_store

    engine = _engine(settings)
    if name is not None:
        _token_create(engine, args, name)
    elif args.token_cmd == "rotate":
        _token_rotate(engine, args)
    elif args.token_cmd == "revoke":
        if args.host is not None:
            names = token_store.revoke_host_tokens(engine, args.host, actor="cli")
            print(f"revoked {', '.join(names)}")
        else:
            token_store.revoke_token(engine, args.name, actor="cli")
            print(f"revoked {args.name}")
    elif fmt is not None:
        output.emit(token_store.list_tokens(engine), fmt, TOKEN_COLUMNS)
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


POLICY_COLUMNS = (
    "name", "datapath", "objective", "sigma", "mode", "exploration_share", "revision",
)  # fmt: skip


def cmd_policy(settings: Settings, args: argparse.Namespace) -> int:
    if args.policy_cmd == "create":
        from ..models import PolicyCreate

        spec = PolicyCreate.model_validate({**_fields(args.fields), "name": args.name})
        from ..storage import policies as policy_store

        policy = policy_store.create_policy(_engine(settings), spec, actor="cli")
        print(policy.model_dump_json(indent=2))
        return 0
    if args.policy_cmd == "restart":
        return _restart_policy(settings, args.name)
    fmt = output.choose(args.output)
    from ..storage import policies as policy_store
    from ..storage.errors import NotFound

    engine = _engine(settings)
    if args.policy_cmd == "show":
        try:
            one = policy_store.get_policy(engine, args.name).model_dump(mode="json")
        except NotFound:
            raise CliError(f"no policy named {args.name!r}") from None
        rows = [{"field": k, "value": v} for k, v in one.items()]
        output.emit(one, fmt, ("field", "value"), rows)
    else:
        listed = [p.model_dump(mode="json") for p in policy_store.list_policies(engine)]
        output.emit(listed, fmt, POLICY_COLUMNS)
    return 0


def _restart_policy(settings: Settings, name: str) -> int:
    from ..storage import policies as policy_store
    from ..storage.errors import Conflict, NotFound

    try:
        kept, fresh = policy_store.restart_policy(_engine(settings), name, actor="cli")
    except NotFound:
        raise CliError(f"no policy named {name!r}") from None
    except Conflict as e:
        raise CliError(str(e)) from None
    print(f"kept the held policy as {kept}; created {name} again (θ spec version "
          f"{fresh.theta_spec_version})")  # fmt: skip
    return 0


def _theta(text: str) -> dict[str, int]:
    try:
        theta = json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"--theta: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(theta, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in theta.values()
    ):
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


def _override_inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The override's own arguments, checked before the database is started."""
    cmd = args.override_cmd
    inputs: dict[str, Any] = {}
    if cmd == "pin":
        inputs["theta"] = _theta(args.theta)
    if cmd == "rollback":
        if (args.at is None) == (args.plan_generation is None):
            raise CliError("rollback: give exactly one of --at and --plan-generation")
        inputs["at"] = None if args.at is None else _at(args.at)
    if cmd == "list":
        inputs["fmt"] = output.choose(args.output)
    return inputs


OVERRIDE_COLUMNS = ("context", "kind", "origin", "theta", "set_by", "set_at")


def cmd_override(settings: Settings, args: argparse.Namespace) -> int:
    """Pin, freeze, roll back, unpin, kill switch: the same operations as the REST API, audited
    as the CLI; every replica serves them from its next GetParameters."""
    inputs = _override_inputs(args)  # before the service and the database load
    from ..service import overrides as ops
    from ..storage import policies as policy_store
    from ..storage.errors import NotFound

    engine = _engine(settings)
    try:
        policy = policy_store.get_policy(engine, args.policy)
    except NotFound:
        raise CliError(f"no policy named {args.policy!r}") from None
    ctx, actor, why, cmd = args.context, "cli", getattr(args, "reason", None), args.override_cmd
    try:
        if cmd == "pin":
            n = ops.pin(engine, policy, inputs["theta"], actor, ctx, why)
        elif cmd == "freeze":
            n = ops.freeze(engine, policy, actor, ctx, why)
        elif cmd == "rollback":
            n = ops.rollback(engine, policy, actor, inputs["at"], args.plan_generation, ctx, why)
        elif cmd == "unpin":
            n = ops.unpin(engine, policy, actor, ctx)
        elif cmd == "kill":
            n = ops.kill(engine, policy, actor, ctx, why)
        elif cmd == "release":
            n = ops.release(engine, policy, actor, ctx)
        else:
            listing = json.loads(json.dumps(ops.listing(engine, policy), default=str))
            output.emit(listing, inputs["fmt"], OVERRIDE_COLUMNS, listing["overrides"])
            return 0
    except (ops.UnknownContext, ops.NothingToOverride) as e:
        raise CliError(str(e)) from None
    print(json.dumps({"policy": policy.name, "changed": n}))
    return 0


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from ..progress import Progress

    progress = Progress()
    with progress.step("loading Booster"):  # the service's imports take seconds
        from ..demo import DemoOptions, run_demo

    options = DemoOptions(
        port=args.port,
        hours=args.hours,
        rounds=args.rounds,
        keep_serving=args.keep_serving,
        keep_state=args.keep_state,
    )
    return run_demo(settings, options, progress)


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "serve": cmd_serve,
    "migrate": cmd_migrate,
    "token": cmd_token,
    "policy": cmd_policy,
    "override": cmd_override,
    "demo": cmd_demo,
}


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; an ordinary failure is one line on stderr and status 1."""
    try:
        if getattr(args, "config", None) is not None:
            os.environ[CONFIG_FILE_ENV] = args.config  # refit workers read the same file
        settings = Settings()
        logging.basicConfig(
            level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        # Alembic announces its plugins when first imported, which is now after the logging
        # set-up (it loads with the command, not before parsing): not worth a line each.
        logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
        return COMMANDS[args.cmd](settings, args)
    except Exception as e:
        message = explain(e)
        if message is None:
            raise
        print(f"booster: error: {message}", file=sys.stderr)
        return EXIT_FAILURE
