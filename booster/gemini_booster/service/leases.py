"""Refit ownership across replicas: one PostgreSQL session-level advisory lock per policy.

Any number of Booster replicas share one database; exactly one of them refits a given policy at
a time. Ownership is PostgreSQL's own mechanism, not a protocol of ours: a replica owns policy
``p`` while its lease connection holds ``pg_advisory_lock(LOCK_CLASS, p)``. The lock lives as
long as that session, so when the owner dies (even by ``kill -9``) the server drops the session
and the lock with it, and the next replica to try (every ``lease_poll_s``) takes over.

Publishing is fenced: plans are written in a transaction on the lease connection itself, after
checking in ``pg_locks`` that this very session still holds the policy's lock. A replica that
lost its connection (and so its locks) mid-refit cannot publish over the new owner's plans.
Keepalives and a TCP user timeout on both ends of the lease session bound how long a
partitioned owner keeps its locks (about 15 s).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from .ratelimit_log import RateLimitedLog

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCK_CLASS = 0x6D6E  # first key of every refit lock: (LOCK_CLASS, policy id)
# The lease session must die soon after its owner does, on both ends: libpq's keepalives and
# user timeout bound how long a replica believes in a dead session, the server's own (set for
# this session through ``options``) how long a dead or partitioned owner's locks outlive it;
# lock and statement timeouts keep one stuck publish from holding every lease forever.
SESSION_OPTIONS = (
    "-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3 "
    "-c tcp_user_timeout=15000 -c lock_timeout=10s -c statement_timeout=60s"
)
KEEPALIVE = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15000,
    "options": SESSION_OPTIONS,
}

_TRY = text("SELECT pg_try_advisory_lock(:cls, :obj)")
_HOLDS = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
    "AND granted AND classid = :cls AND objid = :obj AND objsubid = 2"
)
_OWNER = text(
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :cls AND l.objid = :obj "
    "AND l.objsubid = 2"
)


class LeaseLost(Exception):
    """This replica no longer owns the policy's refits; nothing was published."""


class Leases:
    """The session that holds this replica's refit locks (one connection for all of them)."""

    def __init__(self, engine: Engine, owner: str):
        self.engine = engine
        self.owner = owner
        self._session_engine = create_engine(
            engine.url,
            poolclass=NullPool,  # the connection is the session: never pooled, never shared
            connect_args={"application_name": owner[:63], "connect_timeout": 5, **KEEPALIVE},
        )
        self._conn: Connection | None = None
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._errors = RateLimitedLog(log, 10.0)

    def _session(self) -> Connection:
        if self._conn is None:
            self._held.clear()  # a new session holds nothing
            self._conn = self._session_engine.connect()
        return self._conn

    def _failed(self, e: DBAPIError) -> None:
        """A statement failed: a lost session loses every lease; any other error (a timeout,
        refused data) is this call's alone, and the session and its locks are kept."""
        if e.connection_invalidated or self._conn is None or self._conn.closed:
            self._drop(e)
            return
        try:
            self._conn.rollback()
        except DBAPIError as again:
            self._drop(again)

    def _drop(self, e: Exception) -> None:
        if self._held:
            log.warning(
                "refit leases of policies %s lost: %s", sorted(self._held), type(e).__name__
            )
        self._held.clear()
        if self._conn is not None:
            with contextlib.suppress(DBAPIError):
                self._conn.close()
        self._conn = None

    def try_acquire(self, policy_id: int) -> bool:
        """Own ``policy_id``'s refits if nobody does; False (never an exception) otherwise."""
        with self._lock:
            if policy_id in self._held:
                return True
            try:
                conn = self._session()
                got = bool(conn.execute(_TRY, {"cls": LOCK_CLASS, "obj": policy_id}).scalar())
                conn.commit()
            except DBAPIError as e:
                self._errors.warning("refit lease: database unreachable (%s)", type(e).__name__)
                self._failed(e)
                return False
            if got:
                self._held.add(policy_id)
                log.info("%s owns refits of policy %d", self.owner, policy_id)
            return got

    def check(self) -> set[int]:
        """Prove the session is alive; returns what it still holds (nothing once it died)."""
        with self._lock:
            if self._conn is None:
                return set()
            try:
                self._conn.execute(text("SELECT 1"))
                self._conn.commit()
            except DBAPIError as e:
                self._failed(e)
            return set(self._held)

    def owner_of(self, policy_id: int) -> str | None:
        """The application name of the replica that holds the policy's lock, if any."""
        with self.engine.connect() as conn:
            return conn.execute(_OWNER, {"cls": LOCK_CLASS, "obj": policy_id}).scalar()

    def publish(self, policy_id: int, write: Callable[[Connection], T]) -> T:
        """Run ``write`` in one transaction on the lease session, only while it holds the lock:
        the check in ``pg_locks`` and the write commit together."""
        with self._lock:
            if policy_id not in self._held or self._conn is None:
                raise LeaseLost(f"{self.owner} does not own refits of policy {policy_id}")
            conn = self._conn
            try:
                with conn.begin():
                    held = conn.execute(_HOLDS, {"cls": LOCK_CLASS, "obj": policy_id}).scalar()
                    if not held:
                        self._held.discard(policy_id)
                        raise LeaseLost(f"the lock of policy {policy_id} is gone")
                    return write(conn)
            except DBAPIError as e:
                self._failed(e)
                if policy_id not in self._held:
                    raise LeaseLost(f"lease session of policy {policy_id} failed") from e
                raise

    def close(self) -> None:
        """Give every lease back (closing the session releases its locks)."""
        with self._lock:
            if self._conn is not None:
                with contextlib.suppress(DBAPIError):
                    self._conn.close()
            self._conn = None
            self._held.clear()
            self._session_engine.dispose()
