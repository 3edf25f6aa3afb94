"""per-host agent credentials: a token bound to the host it may speak for, with an expiry

- ``api_tokens.host_id``: the host an ``agent`` token may report and read parameters for; NULL
  for operator and viewer tokens and for fleet-wide agent tokens made before this revision
  (those are refused unless ``allow_unbound_agent_tokens`` is set: see ``service/auth.py``).
  Only agent tokens may carry a host.
- ``api_tokens.expires_at``: after it the token is refused; a rotation sets it on the host's
  old token(s), so a host holds two valid tokens during the grace period. NULL: no expiry.
- ``api_tokens.name`` grows to 160 characters, room for names made from a host id (up to 128)
  and a timestamp.

Existing rows are kept as they are: every token that worked before keeps working, except that
an unbound agent token now needs the setting that allows it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 21:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column(
        "api_tokens", "name", type_=sa.String(length=160), existing_type=sa.String(length=64)
    )
    op.add_column("api_tokens", sa.Column("host_id", sa.String(length=128), nullable=True))
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        "api_tokens_host_agent_only", "api_tokens", "host_id IS NULL OR role = 'agent'"
    )
    op.create_index("api_tokens_host", "api_tokens", ["host_id"])


def downgrade() -> None:
    op.drop_index("api_tokens_host", table_name="api_tokens")
    op.drop_constraint("api_tokens_host_agent_only", "api_tokens", type_="check")
    op.drop_column("api_tokens", "expires_at")
    op.drop_column("api_tokens", "host_id")
    op.alter_column(
        "api_tokens", "name", type_=sa.String(length=64), existing_type=sa.String(length=160)
    )
