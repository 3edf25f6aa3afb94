"""Connecting to PostgreSQL: an external server by URL, or an embedded one started on demand.

The embedded server is a real PostgreSQL (the ``pgserver`` wheel ships its binaries) listening
on a Unix socket inside ``data_dir``; it survives Booster restarts because its data does.
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine

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
