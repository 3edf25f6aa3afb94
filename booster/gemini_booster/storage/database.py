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
from sqlalchemy import URL, Engine, create_engine, make_url, text

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


# libpq's own bounds on a connection, so that a silent partition (packets dropped, no RST)
# fails a request within seconds instead of hanging it until each client's deadline: a
# connection attempt gives up after ``connect_timeout``; an idle connection is probed by TCP
# keepalives (idle, then every interval, dead after count unanswered); data left unacknowledged
# for ``tcp_user_timeout`` ms ends the connection. libpq ignores the TCP ones on Unix sockets
# (the embedded server), where no partition can happen.
LIBPQ_TIMEOUTS: dict[str, int] = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}


def connect_args(engine: Engine) -> dict[str, object]:
    """The keyword arguments the engine's driver connects with (the URL's, then ours)."""
    _, kwargs = engine.dialect.create_connect_args(engine.url)
    return {**kwargs, **getattr(engine, "_gemini_connect_args", {})}


def _engine(url: str | URL, **kwargs) -> Engine:
    """An engine whose connections carry ``LIBPQ_TIMEOUTS`` (parameters the URL sets win)."""
    query = make_url(url).query if isinstance(url, str) else url.query
    extra = {k: v for k, v in LIBPQ_TIMEOUTS.items() if k not in query}
    engine = create_engine(url, connect_args=extra, **kwargs)
    engine._gemini_connect_args = extra  # type: ignore[attr-defined]
    return engine


def make_engine(url: str, pool_size: int = 8) -> Engine:
    return _engine(url, pool_size=pool_size, max_overflow=8, pool_pre_ping=True)


def writer_engine(engine: Engine) -> Engine:
    """One connection for the ingest writer, without a ping before every transaction.

    The ping is a round trip per batch; the writer does not need it, because a batch that meets
    a dead connection fails as a whole, its agents retry, and the pool replaces the connection.
    Its connections have the same timeouts as the main engine's.
    """
    return _engine(engine.url, pool_size=1, max_overflow=0, pool_pre_ping=False)


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
