"""Connecting to PostgreSQL: an external server by URL, or an embedded one started on demand.

The embedded server is a real PostgreSQL (the ``pgserver`` wheel ships its binaries) listening
on a Unix socket inside ``data_dir``; it survives Booster restarts because its data does.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, text

import gemini_migrations

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(gemini_migrations.__file__).parent


def start_embedded(data_dir: Path) -> str:
    """Start (or attach to) the embedded PostgreSQL and return its SQLAlchemy URL."""
    import pgserver  # imported lazily: deployments with a URL never need it

    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    server = pgserver.get_server(data_dir, cleanup_mode="stop")
    socket_dir = server.get_uri().split("host=")[-1]
    log.info("embedded PostgreSQL at %s", data_dir)
    return f"postgresql+psycopg://postgres@/postgres?host={socket_dir}"


def make_engine(url: str, pool_size: int = 8) -> Engine:
    return create_engine(url, pool_size=pool_size, max_overflow=8, pool_pre_ping=True)


def writer_engine(engine: Engine) -> Engine:
    """One connection for the ingest writer, without a ping before every transaction.

    The ping is a round trip per batch; the writer does not need it, because a batch that meets
    a dead connection fails as a whole, its agents retry, and the pool replaces the connection.
    """
    return create_engine(engine.url, pool_size=1, max_overflow=0, pool_pre_ping=False)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` under an advisory lock, so replicas can start together."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(727274)")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


class SchemaNotAtHead(RuntimeError):
    """The database's schema is not the one this Booster needs (older, newer, or none)."""


def head_revision() -> str:
    """The newest migration this Booster ships."""
    head = ScriptDirectory.from_config(alembic_config("postgresql://")).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database's schema is at; None before the first migration."""
    with engine.connect() as conn:
        if conn.execute(text("SELECT to_regclass('alembic_version')")).scalar_one() is None:
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one_or_none()


def require_head(engine: Engine) -> None:
    """SchemaNotAtHead unless the schema is at this Booster's newest migration.

    Serving never migrates on its own: a schema change is a step an operator (or the Helm
    chart's pre-upgrade hook Job) takes with ``booster migrate``, once, before new replicas
    start, not a side effect of whichever replica happens to start first.
    """
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaNotAtHead(
            f"database schema is at revision {current or 'none'}, this Booster needs {head}: "
            "run 'booster migrate' first"
        )
