"""``booster``'s arguments: argparse only, so that ``--help`` and usage errors answer at once.

Every usage error names what is wrong: an unknown flag or word is named (with the nearest
known flag, if one is close) before a missing subcommand is reported, which argparse on its own
does the other way round (``booster --bogus`` said only that a command was required).
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

from .. import __version__

DEFAULT_GRACE_S = 86_400  # a rotated token's predecessor stays valid this long by default
OUTPUT_FORMATS = ("json", "table")
DEMO_DEFAULT_HOURS = 12  # simulated hours the demo fleet covers before it follows the clock
DEMO_DEFAULT_PORT = 8080

CLOSE = 0.75  # how alike an unknown flag and a known one must be to suggest the known one
ParserPath = tuple[str, ...]


def _common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (``booster -c x policy list`` and
    ``booster policy list -c x``); SUPPRESS keeps a later parser from resetting one given."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "-c",
        "--config",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="TOML settings file (overrides GEMINI_BOOSTER_CONFIG); it must exist",
    )
    return p


def _output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        help="json or table (default: table on a terminal, json otherwise)",
    )


class _Tree:
    """The parsers by command path, so an error is reported with the usage of the command the
    user typed, not the top level's."""

    def __init__(self) -> None:
        self.common = _common()
        self.top = argparse.ArgumentParser(
            prog="booster",
            description=_top_description(),
            parents=[self.common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        self.top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
        self.by_path: dict[ParserPath, argparse.ArgumentParser] = {(): self.top}
        self.groups: dict[ParserPath, list[str]] = {}  # a path → its subcommands

    def commands(self, path: ParserPath, dest: str) -> argparse._SubParsersAction:
        parent = self.by_path[path]
        return parent.add_subparsers(dest=dest, metavar="COMMAND", title="commands")

    def add(
        self, sub: argparse._SubParsersAction, path: ParserPath, help_text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(path[-1], help=help_text, description=help_text, parents=[self.common])
        self.by_path[path] = p
        self.groups.setdefault(path[:-1], []).append(path[-1])
        return p


def _top_description() -> str:
    from . import __doc__ as doc

    return (doc or "").replace("``", "")  # reST quoting is for the docs, not a terminal


def _serve_and_migrate(t: _Tree, sub: argparse._SubParsersAction) -> None:
    serve = t.add(sub, ("serve",), "run the gRPC and REST servers until SIGTERM")
    serve.add_argument(
        "--migrate",
        action="store_true",
        help="bring the schema to head first (a single machine; a fleet runs 'booster migrate')",
    )
    t.add(sub, ("migrate",), "bring the database schema to the latest revision")


def _token(t: _Tree, sub: argparse._SubParsersAction) -> None:
    t.add(sub, ("token",), "create, rotate, revoke or list API credentials")
    tsub = t.commands(("token",), "token_cmd")
    tc = t.add(tsub, ("token", "create"), "a new credential, printed once on stdout")
    tc.add_argument("--name", help="its name (default for a host's token: host@time)")
    tc.add_argument("--role", required=True, choices=["agent", "viewer", "operator"])
    tc.add_argument("--host", help="the one host an agent token may speak for")
    tro = t.add(
        tsub, ("token", "rotate"), "a new token for a host; its old ones expire after a grace"
    )
    tro.add_argument("--host", required=True)
    tro.add_argument(
        "--grace-s",
        type=float,
        default=DEFAULT_GRACE_S,
        help=f"how long the old token stays valid (default {DEFAULT_GRACE_S} s)",
    )
    tr = t.add(tsub, ("token", "revoke"), "revoke one token by name, or every token of a host")
    tr.add_argument("--name")
    tr.add_argument("--host")
    _output(t.add(tsub, ("token", "list"), "every credential's name, role, host and state"))


def _policy(t: _Tree, sub: argparse._SubParsersAction) -> None:
    t.add(sub, ("policy",), "create, show or list policies")
    psub = t.commands(("policy",), "policy_cmd")
    pc = t.add(psub, ("policy", "create"), "a new policy (its fields as JSON)")
    pc.add_argument("name")
    pc.add_argument("--fields", help="JSON of policy fields, e.g. '{\"sigma\": 0.1}'")
    ps = t.add(psub, ("policy", "show"), "one policy's fields")
    ps.add_argument("name")
    _output(ps)
    _output(t.add(psub, ("policy", "list"), "every policy"))
    pr = t.add(
        psub,
        ("policy", "restart"),
        "a held policy (its θ in an older spec version): keep it as NAME.DATAPATH-vN, "
        "create NAME again",
    )
    pr.add_argument("name")


OVERRIDES = (
    ("list", "the policy's overrides"),
    ("pin", "serve --theta to every host, no exploration"),
    ("freeze", "pin at the current incumbent"),
    ("rollback", "pin at the incumbent of --at or --plan-generation"),
    ("unpin", "remove pins: normal planning again"),
    ("kill", "every host to the datapath's safe default"),
    ("release", "release the kill switch"),
)
CONTEXT_HELP = "one context, src_region/src_isp->dst_region/dst_isp@hour (default: the policy)"


def _override(t: _Tree, sub: argparse._SubParsersAction) -> None:
    t.add(
        sub,
        ("override",),
        "pin, freeze, roll back or unpin θ, or the kill switch, for a policy or a context",
    )
    osub = t.commands(("override",), "override_cmd")
    for name, text in OVERRIDES:
        o = t.add(osub, ("override", name), text)
        o.add_argument("policy")
        o.add_argument("--context", help=CONTEXT_HELP)
        if name == "list":
            _output(o)
        if name in ("pin", "freeze", "rollback", "kill"):
            o.add_argument("--reason", help="why, for the audit log")
        if name == "pin":
            o.add_argument("--theta", required=True, help="JSON, e.g. '{\"k\": 40, ...}'")
        if name == "rollback":
            o.add_argument("--at", help="ISO 8601 time with zone, e.g. 2026-11-27T14:00:00Z")
            o.add_argument("--plan-generation", type=int)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {n}")
    return n


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"not a port number (0-65535): {n}")
    return n


def _demo(t: _Tree, sub: argparse._SubParsersAction) -> None:
    demo = t.add(
        sub,
        ("demo",),
        "Booster on embedded PostgreSQL plus a simulated fleet (with an A/B experiment), "
        "served until Ctrl-C",
    )
    demo.add_argument(
        "--port",
        type=_port,
        default=DEMO_DEFAULT_PORT,
        help=f"the dashboard's and REST API's port (default {DEMO_DEFAULT_PORT}; 0: any free)",
    )
    demo.add_argument(
        "--hours",
        type=_positive,
        default=DEMO_DEFAULT_HOURS,
        help="simulated hours of history the fleet reports first, at 4 rounds an hour "
        f"(default {DEMO_DEFAULT_HOURS})",
    )
    demo.add_argument(
        "--rounds",
        type=_positive,
        help="stop after this many rounds (default: keep simulating and serving until Ctrl-C)",
    )
    demo.add_argument(
        "--keep-serving",
        action="store_true",
        help="with --rounds: keep serving the dashboard after the last round, until Ctrl-C",
    )
    demo.add_argument(
        "--keep-state",
        action="store_true",
        help="keep the previous demo's database (default: start from a fresh one)",
    )


def build() -> _Tree:
    t = _Tree()
    sub = t.commands((), "cmd")
    _serve_and_migrate(t, sub)
    _token(t, sub)
    _policy(t, sub)
    _override(t, sub)
    _demo(t, sub)
    return t


def parser() -> argparse.ArgumentParser:
    """The top-level parser (for documentation and tests)."""
    return build().top


def _path(args: argparse.Namespace) -> ParserPath:
    """The command path the arguments name, as far as they name one."""
    path: ParserPath = ()
    for dest in ("cmd", "token_cmd", "policy_cmd", "override_cmd"):
        word = getattr(args, dest, None)
        if word is not None:
            path = (*path, word)
    return path


def _flags(p: argparse.ArgumentParser) -> list[str]:
    return [s for a in p._actions for s in a.option_strings]


def _unknown(p: argparse.ArgumentParser, extra: Sequence[str]) -> str:
    """'unrecognized arguments: …' with the nearest known flag of ``p`` for each unknown one."""
    named = []
    for word in extra:
        close = difflib.get_close_matches(word.split("=")[0], _flags(p), n=1, cutoff=CLOSE)
        if word.startswith("-") and close:
            named.append(f"{word} (did you mean {close[0]}?)")
        else:
            named.append(word)
    return "unrecognized arguments: " + " ".join(named)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parsed arguments, or argparse's usage error (exit status 2) naming what is wrong."""
    t = build()
    args, extra = t.top.parse_known_args(argv)
    path = _path(args)
    if extra:
        t.by_path[path].error(_unknown(t.by_path[path], extra))
    if path in t.groups:  # a command that needs a subcommand was given none
        choices = ", ".join(t.groups[path])
        what = " ".join(path) or "booster"
        t.by_path[path].error(f"{what} needs a command: one of {choices}")
    return args
