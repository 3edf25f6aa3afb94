"""Folding raw aggregates into trial sums, exactly once, behind a per-policy watermark.

Ingest only appends: a report's row and its aggregates (COPY into ``report_aggregates``), each
aggregate carrying the id of the transaction that stored it (``xid``). The refit owner of a
policy folds them into ``trial_sums`` every ``fold_interval_s`` (``service/fold.py``).

Consistency contract
--------------------
- **Watermark.** ``fold_watermarks.folded_xid`` = W: every aggregate of the policy stored by a
  transaction with id < W is in ``trial_sums``, and none with id ≥ W is.
- **Which rows a fold takes.** A fold reads X = the xmin of a snapshot taken after it locked
  the watermark row: every transaction with id < X has ended (committed or rolled back), so the
  set of committed aggregates with W ≤ xid < X can no longer change. It adds exactly that set
  and sets W = X, in one transaction. Transactions ≥ X (still running, or committed after the
  snapshot) are left to the next fold. Transaction ids are 64-bit (``xid8``): they never wrap.
- **Exactly once.** The sums and the watermark commit together or not at all: a fold killed
  anywhere (its process ``kill -9``ed, its connection cut, the server restarted) leaves
  neither, and the next fold, by whichever replica owns the policy then, takes the same rows.
  Two folds of one policy never interleave: each first locks the policy's watermark row
  (``FOR UPDATE``), so a second one waits and then reads the first's new watermark. The refit
  lease only decides who folds; correctness does not rest on it.
- **Readers** see every stored report at once, exactly once: the view ``trials`` is
  ``trial_sums`` plus the aggregates at or above the watermark, in one snapshot.
- **Delay.** A report is in ``trial_sums`` within about ``fold_interval_s`` of its commit while
  its policy has an owner, unless a transaction that writes (anywhere in the cluster) stays
  open longer: it holds xmin back, and the fold lag gauge shows it.

Retention drops a day's partition of raw aggregates only once every row in it is folded; the
trial sums are kept (they are the model's points; the history window ages them out of fits).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from .schema import TRIAL_SUMS

log = logging.getLogger(__name__)

_KEY = "policy_id, context_id, cc, theta_key, bucket"
_RAW_SUMS = TRIAL_SUMS[:-1]  # report_count is the number of aggregates folded

_LOCK_WATERMARK = text(
    "SELECT folded_xid::text FROM fold_watermarks WHERE policy_id = :p FOR UPDATE"
)
_ENSURE_WATERMARK = text(
    "INSERT INTO fold_watermarks (policy_id, folded_xid) VALUES (:p, '0'::xid8) "
    "ON CONFLICT DO NOTHING"
)
_XMIN = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text")
_FOLD = text(
    f"""
WITH new AS (
    SELECT {_KEY}, {", ".join(_RAW_SUMS)}, stored_at FROM report_aggregates
    WHERE policy_id = :p AND xid >= CAST(:w AS xid8) AND xid < CAST(:x AS xid8)
), folded AS (
    INSERT INTO trial_sums ({_KEY}, {", ".join(TRIAL_SUMS)}, first_seen, last_seen)
    SELECT {_KEY}, {", ".join(f"sum({c})" for c in _RAW_SUMS)}, count(*),
           min(stored_at), max(stored_at)
    FROM new GROUP BY {_KEY} ORDER BY {_KEY}
    ON CONFLICT ({_KEY}) DO UPDATE SET
        {", ".join(f"{c} = trial_sums.{c} + excluded.{c}" for c in TRIAL_SUMS)},
        last_seen = greatest(trial_sums.last_seen, excluded.last_seen)
    RETURNING 1
)
SELECT (SELECT count(*) FROM new), (SELECT count(*) FROM folded)
"""
)
_ADVANCE = text(
    "UPDATE fold_watermarks SET folded_xid = CAST(:x AS xid8), folded_at = now() "
    "WHERE policy_id = :p"
)


@dataclass(frozen=True)
class Folded:
    """What one fold did: aggregates added, trial rows they touched, the new watermark."""

    aggregates: int
    trials: int
    watermark: int


def fold_policy(conn: Connection, policy_id: int) -> Folded:
    """Fold the policy's aggregates stored since its watermark, in ``conn``'s transaction (the
    caller commits: the sums and the watermark go together)."""
    conn.execute(_ENSURE_WATERMARK, {"p": policy_id})
    w = int(conn.execute(_LOCK_WATERMARK, {"p": policy_id}).scalar_one())
    x = int(conn.execute(_XMIN).scalar_one())
    if x <= w:
        return Folded(0, 0, w)
    aggregates, trials = conn.execute(_FOLD, {"p": policy_id, "w": str(w), "x": str(x)}).one()
    conn.execute(_ADVANCE, {"p": policy_id, "x": str(x)})
    return Folded(aggregates, trials, x)


_LAG = text(
    """
SELECT coalesce(extract(epoch FROM now() - min(a.stored_at)), 0)
FROM report_aggregates a JOIN fold_watermarks w ON w.policy_id = a.policy_id
WHERE a.policy_id = :p AND a.xid >= w.folded_xid
"""
)


def fold_lag_s(conn: Connection, policy_id: int) -> float:
    """Seconds since the oldest aggregate not folded yet was stored (0: none pending)."""
    return float(conn.execute(_LAG, {"p": policy_id}).scalar_one())


# -- partitions and retention ---------------------------------------------------------------

PARENT = "report_aggregates"
_DAILY = re.compile(rf"^{PARENT}_d(\d{{8}})$")  # holds rows stored before that day + 1
PARTITION_LOCK = 0x6D6F  # advisory lock: one replica at a time changes partitions
# DDL on the parent waits for an ACCESS EXCLUSIVE lock; queued, it would stall every ingest
# transaction behind it, so it gives up quickly and is tried again at the next round.
DDL_LOCK_TIMEOUT = "2s"

_PARTITIONS = text(
    """
SELECT c.relname FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = :parent
"""
)
_UNFOLDED = """
SELECT EXISTS (
    SELECT 1 FROM {part} a JOIN fold_watermarks w ON w.policy_id = a.policy_id
    WHERE a.xid >= w.folded_xid
)
"""


def partition_name(day: date) -> str:
    return f"{PARENT}_d{day:%Y%m%d}"


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time(), UTC)


def daily_partitions(conn: Connection) -> dict[str, date]:
    """The daily partitions and the last day each holds (the default partition is not one)."""
    found: dict[str, date] = {}
    for (name,) in conn.execute(_PARTITIONS, {"parent": PARENT}):
        m = _DAILY.match(name)
        if m:
            found[name] = datetime.strptime(m.group(1), "%Y%m%d").date()
    return found


def _try_ddl(conn: Connection, sql: str, what: str) -> bool:
    """One DDL statement in a transaction of its own (its lock on the parent is held only
    that long), under the short lock timeout; False if it failed."""
    try:
        conn.execute(text(f"SET LOCAL lock_timeout = '{DDL_LOCK_TIMEOUT}'"))
        conn.execute(text(sql))
        conn.commit()
        return True
    except DBAPIError as e:
        conn.rollback()
        log.warning("%s: %s", what, str(getattr(e, "orig", e)).splitlines()[0])
        return False


def ensure_partitions(conn: Connection, today: date, days_ahead: int) -> list[str]:
    """Create the daily partitions for ``today`` and ``days_ahead`` days after it that do not
    exist (new rows never land in the default partition while this runs daily)."""
    existing = daily_partitions(conn)
    created = []
    for d in range(days_ahead + 1):
        day = today + timedelta(days=d)
        name = partition_name(day)
        if name in existing:
            continue
        sql = (
            f"CREATE TABLE {name} PARTITION OF {PARENT} FOR VALUES FROM "
            f"('{_midnight(day).isoformat()}') TO ('{_midnight(day + timedelta(1)).isoformat()}')"
        )
        if _try_ddl(conn, sql, f"creating partition {name}"):
            created.append(name)
    return created


def drop_expired(conn: Connection, today: date, retention_days: int) -> list[str]:
    """Drop the daily partitions whose every row is older than ``retention_days`` and folded;
    one with rows not folded yet is kept (and logged) until a later round."""
    cutoff = today - timedelta(days=retention_days)
    dropped = []
    for name, last_day in sorted(daily_partitions(conn).items(), key=lambda kv: kv[1]):
        if last_day >= cutoff:
            continue
        if conn.execute(text(_UNFOLDED.format(part=name))).scalar_one():
            log.warning("partition %s is past retention but not folded yet: kept", name)
            continue
        if _try_ddl(conn, f"DROP TABLE {name}", f"dropping partition {name}"):
            dropped.append(name)
    return dropped


_PURGE_DEFAULT = text(
    f"""
DELETE FROM {PARENT}_default a USING fold_watermarks w
WHERE w.policy_id = a.policy_id AND a.xid < w.folded_xid AND a.stored_at < :cutoff
"""
)


def purge_default(conn: Connection, today: date, retention_days: int) -> int:
    """Delete the folded rows past retention from the default partition (it holds rows only
    when the daily partitions were not created in time): rows deleted."""
    cutoff = _midnight(today - timedelta(days=retention_days))
    n = conn.execute(_PURGE_DEFAULT, {"cutoff": cutoff}).rowcount
    conn.commit()
    return n


# Reports are deleted in batches of this many rows, each committed on its own, so a day's
# worth at fleet scale never becomes one long transaction holding its row locks.
REPORT_PURGE_BATCH = 10_000
# A report row can go once it is past retention (its idempotency key is then forgotten: an
# agent retrying it later would store it again) and no raw aggregate refers to it: its id is
# below the smallest report_pk left (ids rise with time; min() reads each partition's index).
_PURGE_REPORTS = text(
    f"""
DELETE FROM reports WHERE id IN (
    SELECT id FROM reports
    WHERE id < COALESCE((SELECT min(report_pk) FROM {PARENT}), 9223372036854775807)
      AND received_at < :cutoff
    ORDER BY id LIMIT :batch
)
"""
)


def purge_reports(conn: Connection, today: date, retention_days: int) -> int:
    """Delete the reports past retention whose raw aggregates are all gone (dropped with
    their partitions): rows deleted. Keeps ``reports`` bounded like the raw aggregates."""
    cutoff = _midnight(today - timedelta(days=retention_days))
    total = 0
    while True:
        n = conn.execute(_PURGE_REPORTS, {"cutoff": cutoff, "batch": REPORT_PURGE_BATCH}).rowcount
        conn.commit()
        total += n
        if n < REPORT_PURGE_BATCH:
            return total


def maintain_partitions(
    engine: Engine, now: datetime, retention_days: int, key_days: int, days_ahead: int = 2
) -> tuple[list[str], list[str]] | None:
    """Create the coming days' partitions and drop expired ones, each change committed on its
    own, unless another replica is doing it (None then). Returns (created, dropped). Report
    keys are kept ``key_days`` at least (the caller's bound on a retry's age)."""
    with engine.connect() as conn:
        lock = text("SELECT pg_try_advisory_lock(:k)")
        got = conn.execute(lock, {"k": PARTITION_LOCK}).scalar_one()
        conn.commit()
        if not got:
            return None
        try:
            today = now.astimezone(UTC).date()
            created = ensure_partitions(conn, today, days_ahead)
            dropped = drop_expired(conn, today, retention_days)
            if purge_default(conn, today, retention_days):
                dropped.append(f"{PARENT}_default (rows past retention)")
            if n := purge_reports(conn, today, max(retention_days, key_days)):
                dropped.append(f"reports ({n} rows past retention)")
            return created, dropped
        finally:
            conn.rollback()
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PARTITION_LOCK})
            conn.commit()
