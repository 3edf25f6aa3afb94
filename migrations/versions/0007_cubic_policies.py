"""Policies that target cubic search CUBIC's θ space

Until now every policy searched Fusion's θ, whatever its target CC. A policy whose target CC
has a θ spec of its own (cubic: api/gemini_api/specs/cubic.toml) now searches that spec's
space, so its stored bounds are rewritten in CUBIC's parameters: those of its named region, and
for a custom region (bounds in Fusion's parameters, which mean nothing for CUBIC) the
production region, with the revision bumped so every replica reloads it. The bounds are the
spec's as of this revision (a migration does not follow later edits of the spec).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 05:10:00
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

CUBIC_BOUNDS = {
    "production": {
        "beta": [512, 922],
        "fast_convergence": [0, 1],
        "tcp_friendliness": [0, 1],
        "hystart": [0, 1],
        "hystart_detect": [1, 3],
        "hystart_low_window": [4, 64],
        "hystart_ack_delta_us": [500, 8000],
    },
    "wide": {
        "beta": [103, 1000],
        "fast_convergence": [0, 1],
        "tcp_friendliness": [0, 1],
        "hystart": [0, 1],
        "hystart_detect": [1, 3],
        "hystart_low_window": [2, 1024],
        "hystart_ack_delta_us": [100, 100000],
    },
}


def upgrade() -> None:
    for region in ("production", "wide"):
        op.execute(
            sa.text(
                "UPDATE policies SET bounds = CAST(:bounds AS jsonb), revision = revision + 1"
                " WHERE target_cc = 'cubic' AND region = :region"
            ).bindparams(bounds=json.dumps(CUBIC_BOUNDS[region]), region=region)
        )
    op.execute(
        sa.text(
            "UPDATE policies SET region = 'production', bounds = CAST(:bounds AS jsonb),"
            " revision = revision + 1 WHERE target_cc = 'cubic' AND region = 'custom'"
            " AND NOT (bounds ? 'beta')"
        ).bindparams(bounds=json.dumps(CUBIC_BOUNDS["production"]))
    )


def downgrade() -> None:
    """Nothing to undo: Fusion's bounds come back from the spec when such a policy is saved."""
