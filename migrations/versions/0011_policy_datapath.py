"""A policy names its datapath: ``policies.datapath`` replaces ``policies.target_cc``

Until now a policy named a congestion control, and the datapath whose θ it searched was guessed
from it: the CC's own spec when it had one (cubic), else Fusion's, whatever the CC. Datapaths are
now a registry (api/gemini_api/datapaths.py) and a policy names one explicitly; the CC agents
are told to run is the datapath's own, so storing it beside the datapath would be a second truth.

The rename keeps what every stored policy searched: ``cubic`` stays cubic, and every other
target CC (fusion, or a CC without a spec, which searched Fusion's θ) becomes ``fusion``.
Downgrade writes the datapath's CC back, which is the datapath's name for every datapath this
revision knows.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 19:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# The datapaths with a spec at this revision besides Fusion; a migration does not follow later
# additions to the registry.
OWN_SPEC = ("cubic",)


def upgrade() -> None:
    op.alter_column("policies", "target_cc", new_column_name="datapath")
    op.execute(
        sa.text(
            "UPDATE policies SET datapath = 'fusion', revision = revision + 1"
            " WHERE datapath NOT IN :own AND datapath <> 'fusion'"
        ).bindparams(sa.bindparam("own", value=OWN_SPEC, expanding=True))
    )


def downgrade() -> None:
    """Every datapath's CC is its name at this revision."""
    op.alter_column("policies", "datapath", new_column_name="target_cc")
