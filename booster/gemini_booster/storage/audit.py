"""The audit log: who changed what, written in the same transaction as the change.

Guarantees across replicas
--------------------------
- **Writers.** Every replica writes audit rows, through ``audit`` only, inside the transaction
  of the change it records (a policy, a credential, an experiment, an override): the row
  commits with the change or not at all, so the log never shows a change that did not happen
  nor misses one that did. Rows are only appended.
- **Readers.** ``audit_entries`` reads committed rows at READ COMMITTED (PostgreSQL's
  default); nothing caches them.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .schema import AuditEntry


def audit(conn: Connection, actor: str, action: str, target: str, detail: dict) -> None:
    conn.execute(
        pg_insert(AuditEntry).values(actor=actor, action=action, target=target, detail=detail)
    )


def audit_entries(engine: Engine, limit: int = 100) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(AuditEntry.__table__).order_by(AuditEntry.id.desc()).limit(limit)
        ).mappings()
        return [{**r, "at": r["at"].isoformat()} for r in rows]
