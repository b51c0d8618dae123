"""Every model's input pipeline: ``models.preprocessing`` (JSON, NULL for older rows).

Revision ID: 0003
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("preprocessing", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("preprocessing")
