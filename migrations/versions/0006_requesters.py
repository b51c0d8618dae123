"""Who asked for each job (a cancel withdraws one requester's interest), and when a queued
job was last published to the broker again.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("published_at", TS, nullable=True))
    op.create_table(
        "job_requesters",
        sa.Column(
            "job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("requester", sa.String(80), primary_key=True),
        sa.Column("label", sa.String(200)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("withdrawn_at", TS),
    )
    op.create_index("ix_job_requesters_requester", "job_requesters", ["requester"])


def downgrade() -> None:
    op.drop_index("ix_job_requesters_requester", "job_requesters")
    op.drop_table("job_requesters")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("published_at")
