"""Change notification between Booster processes, by PostgreSQL's own LISTEN/NOTIFY.

Every transaction that changes what other replicas serve also sends a notification on one
channel, delivered to every listener when (and only if) the transaction commits:

- ``policy:<id>``: a policy's settings changed (or it was created);
- ``plans:<id>``: the refit owner published new plans for the policy;
- ``data:<id>``: new flows for the policy (no longer sent by ingest, which is append-only:
  the refit owner learns of new data by folding it, ``service/fold.py``; still understood);
- ``tokens``: a credential was created or revoked;
- ``experiments:<id>``: an A/B experiment was created, changed or stopped (replicas reload the
  arms they answer agents with);
- ``overrides:<id>``: an operator pinned, froze, rolled back or unpinned θ of the policy, or
  set or released its kill switch (replicas reload the policy's overrides).

A listener that loses its connection may miss notifications, so after reconnecting it must
resynchronise everything (``Follower`` in ``service/sync.py`` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from sqlalchemy import Connection, text

CHANNEL = "gemini_changes"
Kind = Literal["policy", "plans", "data", "tokens", "experiments", "overrides"]


def payload(kind: Kind, policy_id: int | None = None) -> str:
    return kind if policy_id is None else f"{kind}:{policy_id}"


def parse(message: str) -> tuple[str, int | None]:
    """``'plans:7'`` → ``('plans', 7)``; ``'tokens'`` → ``('tokens', None)``; junk → ('', None)."""
    kind, _, ident = message.partition(":")
    if not ident:
        return kind, None
    try:
        return kind, int(ident)
    except ValueError:
        return "", None


def notify(conn: Connection, kind: Kind, policy_ids: Iterable[int] = ()) -> None:
    """Queue notifications in ``conn``'s transaction (sent at commit, deduplicated)."""
    messages = [payload(kind, p) for p in sorted(set(policy_ids))] or [payload(kind)]
    for m in messages:
        conn.execute(
            text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": m}
        )


def notify_cursor(cur, kind: Kind, policy_ids: Iterable[int]) -> None:
    """The same on a raw psycopg cursor (the ingestion hot path), one statement for all ids."""
    ids = sorted(set(policy_ids))
    if ids:
        cur.execute(
            "SELECT pg_notify(%s::text, %s::text || p::text) FROM unnest(%s::int[]) AS p",
            (CHANNEL, f"{kind}:", ids),
        )
