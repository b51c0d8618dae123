"""API tokens with scopes, and the artifacts each comparison references (for storage GC).

Revision ID: 0004
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("scope", sa.String(10), nullable=False),
        sa.Column("token_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(12), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("last_used_at", TS),
        sa.Column("revoked_at", TS),
    )
    op.create_table(
        "artifact_refs",
        sa.Column(
            "comparison_id",
            sa.Integer,
            sa.ForeignKey("comparisons.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("path", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_artifact_refs_path", "artifact_refs", ["path"])


def downgrade() -> None:
    op.drop_index("ix_artifact_refs_path", "artifact_refs")
    op.drop_table("artifact_refs")
    op.drop_table("api_tokens")
