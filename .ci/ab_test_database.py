"""A/B of what each PostgreSQL test's database costs: created and migrated to head each time
(the conftest before 2026-11-28) against a copy of the session's migrated template (now).

    .venv/bin/python .ci/ab_test_database.py [ROUNDS]

Both are made and dropped in turns on one embedded PostgreSQL, so that the load of a shared
machine falls on both alike; prints the medians and their ratio (docs/ci.md records a run)."""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gemini_booster.storage import database  # noqa: E402
from tests.conftest import _admin_execute, _database_url, new_database  # noqa: E402

DEFAULT_ROUNDS = 15


def migrated_each_time(admin_url: str) -> str:
    """The test database as the conftest made it before: created empty, then migrated."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    _admin_execute(admin_url, f'CREATE DATABASE "{name}"')
    url = _database_url(admin_url, name)
    engine = database.make_engine(url)
    database.migrate(engine)
    engine.dispose()
    return url


def made_and_dropped(admin_url: str, make: Callable[[str], str]) -> float:
    start = time.monotonic()
    url = make(admin_url)
    _admin_execute(admin_url, f'DROP DATABASE "{url.rsplit("/", 1)[1].split("?")[0]}" WITH (FORCE)')
    return time.monotonic() - start


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_ROUNDS
    work = Path(tempfile.mkdtemp(prefix="ab-test-database-"))
    os.environ.setdefault("XDG_RUNTIME_DIR", str(work))
    admin_url = database.start_embedded(work / "pg")
    made_and_dropped(admin_url, new_database)  # the template: once per session, not timed
    ways = {"migrated each time": migrated_each_time, "template copy": new_database}
    took: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, make in ways.items():
            took[name].append(made_and_dropped(admin_url, make))
    for name, seconds in took.items():
        print(f"{name}: median {statistics.median(seconds):.3f} s over {rounds} (create + drop)")
    ratio = statistics.median(took["template copy"]) / statistics.median(took["migrated each time"])
    print(f"template copy / migrated each time (medians): {ratio:.2f}")


if __name__ == "__main__":
    main()
