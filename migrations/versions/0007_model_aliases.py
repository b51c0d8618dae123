"""Other names of a model: the names its weights were uploaded under again.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_aliases",
        sa.Column(
            "model_id",
            sa.Integer,
            sa.ForeignKey("models.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_model_aliases_name", "model_aliases", ["name"])


def downgrade() -> None:
    op.drop_index("ix_model_aliases_name", "model_aliases")
    op.drop_table("model_aliases")
