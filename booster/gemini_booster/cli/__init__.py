"""``booster``: serve, migrate, manage credentials, policies and θ overrides, or run the demo.

Settings come from GEMINI_BOOSTER_* variables and the TOML file named by --config or
GEMINI_BOOSTER_CONFIG (a file named there that does not exist is an error, never a silent
fallback to the embedded database); see ``gemini_booster.config``.

Only ``booster migrate`` changes the schema (and ``serve --migrate``, for a single machine);
every other command checks that the schema is at this Booster's head and stops if it is not.
An ordinary failure (bad settings, a database that cannot be reached, an unknown policy, bad
JSON) is one line on stderr and exit status 1; a usage error (an unknown command or flag,
named) is argparse's, status 2. Arguments are checked before any database is started.
List and show commands print a table on a terminal and JSON otherwise; ``-o json|table``
chooses.
"""

from __future__ import annotations

# Nothing heavier than argparse is imported here: ``booster --help`` and a usage error must
# answer at once, so the service, SQLAlchemy and scikit-optimize load only in the command that
# needs them (``commands``), after the arguments have been parsed.
from .parser import parse


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from .commands import run  # the heavy imports, only now

    return run(args)
