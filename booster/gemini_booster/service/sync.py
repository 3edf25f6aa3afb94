"""Following the database: every Booster process serves what PostgreSQL holds.

Replicas (and front processes) never talk to each other; they share one database and learn of
each other's changes through ``LISTEN gemini_changes`` (see ``storage/changes.py``). The
follower thread holds one listening connection and, on each notification, has the core reload
exactly what changed: a policy's settings, a policy's plans, the token set, or (for the refit
owner) the fact that new data arrived. A policy created or changed through one replica is
served by every other within the notification's delivery time (milliseconds), and a periodic
full comparison of generations every ``FULL_SYNC_S`` covers anything a notification could not.

After its connection is lost the follower cannot know what it missed, so it reconnects with
backoff and resynchronises everything. Meanwhile the core keeps serving what it last loaded:
plans and policies stay in memory through a database outage.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Protocol

import psycopg
from sqlalchemy import Engine

from ..storage import changes
from ..storage.database import LIBPQ_TIMEOUTS
from .ratelimit_log import RateLimitedLog

log = logging.getLogger(__name__)

FULL_SYNC_S = 5.0
RECONNECT_MIN_S = 0.5
RECONNECT_MAX_S = 5.0
READY_STALE_S = 10.0  # not ready once the database has not answered for this long
WRITE_PROBE_S = 2.0  # how often the follower proves the database still takes writes
HEARTBEAT_KEPT = "1 day"  # rows of replicas gone this long are deleted
_HEARTBEAT = (
    "INSERT INTO replica_heartbeats (replica, at) VALUES (%s, now()) "
    "ON CONFLICT (replica) DO UPDATE SET at = now()"
)
_FORGET = f"DELETE FROM replica_heartbeats WHERE at < now() - interval '{HEARTBEAT_KEPT}'"


class SyncTarget(Protocol):
    """What the follower asks of the core."""

    def sync_all(self) -> None: ...

    def policies_changed(self, policy_ids: set[int]) -> None: ...

    def plans_changed(self, policy_ids: set[int]) -> None: ...

    def data_arrived(self, policy_ids: set[int] | None) -> None: ...

    def tokens_changed(self) -> None: ...

    def experiments_changed(self, experiment_ids: set[int] | None = None) -> None: ...

    def overrides_changed(self, policy_ids: set[int]) -> None: ...


def connect_kwargs() -> dict[str, Any]:
    """The follower's connection: the same libpq timeouts as the engines' (a partition must
    not leave it waiting on a dead session while the replica claims to be ready)."""
    return dict(LIBPQ_TIMEOUTS)


def libpq_url(engine: Engine) -> str:
    """The engine's URL as libpq takes it (no SQLAlchemy driver suffix)."""
    url = engine.url.set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


class Follower:
    def __init__(self, engine: Engine, target: SyncTarget, name: str = "booster"):
        self.engine = engine
        self.target = target
        self.name = name[:200]
        self._writable = True  # the last write probe committed (or none has run yet)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="follower", daemon=True)
        self._errors = RateLimitedLog(log, 30.0)
        self._last_ok = 0.0
        self._conn: psycopg.Connection | None = None
        self._connected = False

    @property
    def ready(self) -> bool:
        return time.monotonic() - self._last_ok < READY_STALE_S

    @property
    def writable(self) -> bool:
        """The database took this replica's last write probe: a database that answers reads
        but refuses writes (disk full, read-only) refuses every report."""
        return self._writable

    def _probe_write(self) -> None:
        """Upsert this replica's heartbeat row; a refusal marks the database unwritable without
        ending the session (reads, and so the plans and notifications, still work)."""
        assert self._conn is not None
        try:
            self._conn.execute(_HEARTBEAT, (self.name,))
            self._conn.execute(_FORGET)
        except psycopg.Error as e:
            if self._conn.closed or self._conn.broken:
                raise
            if self._writable:
                log.warning("the database refuses writes (%s): not ready", type(e).__name__)
            self._writable = False
            return
        if not self._writable:
            log.info("the database takes writes again")
        self._writable = True

    def start(self) -> None:
        self._last_ok = time.monotonic()  # the core loaded everything before starting us
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = RECONNECT_MIN_S
        while not self._stopping.is_set():
            self._connected = False
            try:
                self._follow()
            except Exception as e:  # database down or restarting: serve from memory, retry
                self._errors.warning("following the database failed: %s", type(e).__name__)
            finally:
                self._close()
            # After a working session, retry soon; while the database stays away, back off.
            backoff = RECONNECT_MIN_S if self._connected else min(backoff * 2, RECONNECT_MAX_S)
            self._stopping.wait(backoff)

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None

    def _follow(self) -> None:
        self._conn = psycopg.connect(libpq_url(self.engine), autocommit=True, **connect_kwargs())
        self._conn.execute(f"LISTEN {changes.CHANNEL}")
        self._connected = True
        # Whatever happened while we were not listening: reload all, assume new data everywhere.
        self.target.sync_all()
        self.target.data_arrived(None)
        self.target.tokens_changed()
        self._probe_write()
        self._last_ok = time.monotonic()
        last_full = last_probe = time.monotonic()
        while not self._stopping.is_set():
            for n in self._conn.notifies(timeout=1.0):  # each acted on as it arrives
                self._dispatch(n.payload)
            self._conn.execute("SELECT 1")  # proves the session alive when nothing is sent
            if time.monotonic() - last_probe > WRITE_PROBE_S:
                self._probe_write()
                last_probe = time.monotonic()
            self._last_ok = time.monotonic()
            if time.monotonic() - last_full > FULL_SYNC_S:
                self.target.sync_all()
                last_full = time.monotonic()

    def _dispatch(self, payload: str) -> None:
        kind, ident = changes.parse(payload)
        ids = set() if ident is None else {ident}
        if kind == "policy":
            self.target.policies_changed(ids)
        elif kind == "plans":
            self.target.plans_changed(ids)
        elif kind == "data":
            self.target.data_arrived(ids)
        elif kind == "tokens":
            self.target.tokens_changed()
        elif kind == "experiments":
            self.target.experiments_changed(ids)
        elif kind == "overrides":
            self.target.overrides_changed(ids)
