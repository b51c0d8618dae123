"""Sharded comparisons: a shard job points at the comparison job it is part of.

Revision ID: 0005
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("parent_id", sa.Integer, nullable=True))
        batch.add_column(sa.Column("shard", sa.Integer, nullable=True))
        batch.add_column(sa.Column("detail", sa.JSON, nullable=True))
        batch.create_foreign_key(
            "fk_jobs_parent_id", "jobs", ["parent_id"], ["id"], ondelete="CASCADE"
        )
        batch.create_index("ix_jobs_parent_id", ["parent_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_parent_id")
        batch.drop_constraint("fk_jobs_parent_id", type_="foreignkey")
        batch.drop_column("detail")
        batch.drop_column("shard")
        batch.drop_column("parent_id")
