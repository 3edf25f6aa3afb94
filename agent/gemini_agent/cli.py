"""gemini-agent: run the host agent (settings from GEMINI_AGENT_* and GEMINI_AGENT_CONFIG)."""

from __future__ import annotations

import argparse
import logging
import signal

from gemini_agent.config import AgentSettings
from gemini_agent.daemon import Agent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gemini-agent", description=__doc__)
    ap.add_argument("command", choices=["run", "show-config"])
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = AgentSettings()
    if args.command == "show-config":
        print(settings.model_dump_json(indent=1))  # SecretStr prints as '**********'
        return
    agent = Agent(settings)
    signal.signal(signal.SIGTERM, lambda *_: agent.stopped.set())
    agent.run()


if __name__ == "__main__":
    main()
