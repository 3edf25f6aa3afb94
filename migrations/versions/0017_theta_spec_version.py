"""A policy records the version of its datapath's θ spec its stored θ are in

Stored θ are keys of values in the spec's parameter order (``ThetaSpec.key``), read back by
position. A spec version that changes a parameter's unit (gemini.toml v2: h in 1/10000 packet,
not 1/100; gear.toml v2: W_AI as a fraction of the BDP, not packets) keeps the number of
values, so a key written under the old version reads as a different θ under the new one,
silently. ``policies.theta_spec_version`` says which version a policy's θ are in; Booster holds
a policy whose version is not its spec's (serves and plans nothing for it; agents keep their
reports and retry) until a migration converts its θ or an operator renames it and creates it
again (docs/datapaths.md, "Changing a spec").

Every existing policy is taken to be in its spec's version as of this migration
(``SPEC_VERSIONS``, which ``tests/test_datapath_registry.py`` compares with the spec files: a
version bump without a migration that names it fails there).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 22:40:00
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# The spec files' versions when this migration was written (api/gemini_api/specs/*.toml).
SPEC_VERSIONS = {"cubic": 1, "dcvegas": 1, "flashpass": 1, "fusion": 1, "gear": 2, "gemini": 2}


def upgrade() -> None:
    op.execute("ALTER TABLE policies ADD COLUMN theta_spec_version integer")
    for name, version in SPEC_VERSIONS.items():
        op.execute(f"UPDATE policies SET theta_spec_version = {version} WHERE datapath = '{name}'")
    # A datapath this Booster no longer knows: version 0, which no spec has, so it is held.
    op.execute("UPDATE policies SET theta_spec_version = 0 WHERE theta_spec_version IS NULL")
    op.execute("ALTER TABLE policies ALTER COLUMN theta_spec_version SET NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE policies DROP COLUMN theta_spec_version")
