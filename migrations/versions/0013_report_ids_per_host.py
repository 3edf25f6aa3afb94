"""Report ids are unique per host: ``reports`` is keyed by ``(host_id, report_id)``

The idempotency key was ``report_id`` alone, unique across every host. Agents derive their ids
from host, policy and interval start, so any other host with a valid token (its own) could send
a report under a victim's next id first: the victim's report then met ALREADY_EXISTS (same key,
other content) and its agent set it aside for good (issue #35, hardening defect 1). A report id
is now the sending host's own key, the host authenticated by its token or certificate; the same
id from two hosts is two reports.

Upgrade swaps the unique constraint for one on ``(host_id, report_id)``, whose index also
serves the lookups by host. It builds the index in the migration's transaction (the table is
locked against writes meanwhile; ``booster migrate`` runs before replicas of this version
start). Downgrade restores uniqueness across hosts and fails if two hosts have since stored the
same id: delete one of each such pair first.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 19:40:00
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_unique_constraint(
        "reports_host_id_report_id_key", "reports", ["host_id", "report_id"]
    )
    op.drop_constraint("reports_report_id_key", "reports", type_="unique")


def downgrade() -> None:
    op.create_unique_constraint("reports_report_id_key", "reports", ["report_id"])
    op.drop_constraint("reports_host_id_report_id_key", "reports", type_="unique")
