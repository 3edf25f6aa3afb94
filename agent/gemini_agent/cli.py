"""gemini-agent: run the host agent (settings from GEMINI_AGENT_* and GEMINI_AGENT_CONFIG).

Exit codes: 0 done (or stopped by SIGTERM/SIGINT), 1 the agent failed while running, 2 bad
usage or configuration (a setting, the configuration file, the destination table). An ordinary
error is one line on stderr, `gemini-agent: <what is wrong>`, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tomllib

from pydantic import ValidationError

from gemini_agent.config import AgentSettings
from gemini_agent.metrics import agent_version

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad configuration: the message says what and where."""


def _settings() -> AgentSettings:
    try:
        return AgentSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        if not where:  # a rule across settings
            raise UsageError(f"invalid settings: {first['msg']}") from None
        raise UsageError(
            f"invalid setting {where} (GEMINI_AGENT_{where.upper()}): {first['msg']}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"configuration file (GEMINI_AGENT_CONFIG) is not TOML: {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read the configuration file: {exc}") from None


def _run(settings: AgentSettings) -> None:
    from gemini_agent.daemon import Agent  # grpc and the kernel sources only when running
    from gemini_agent.dryrun import banner

    try:
        agent = Agent(settings)
    except (ValueError, OSError) as exc:  # the destination table, the spool directory
        raise UsageError(str(exc)) from None
    for line in banner(settings, agent_version()):  # once the configuration holds
        print(line, file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: agent.stopped.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stopped.set())
    agent.run()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gemini-agent", description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="version", version=f"gemini-agent {agent_version()}")
    ap.add_argument("command", choices=["run", "show-config"])
    args = ap.parse_args(argv)  # usage errors: argparse's one line and exit code 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = _settings()
        if args.command == "show-config":
            print(settings.model_dump_json(indent=1))  # SecretStr prints as '**********'
            return EXIT_OK
        _run(settings)
    except UsageError as exc:
        print(f"gemini-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, RuntimeError) as exc:
        print(f"gemini-agent: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
