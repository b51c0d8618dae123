"""Studies, and the structure and training key of every model.

Adds to ``models`` the architecture's structure (family, Ω, effective width, density, S, C,
γ) and the training key studies reuse checkpoints by; to ``trainings`` the key; and the
``studies`` and ``study_members`` tables.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0004"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)
MODEL_COLUMNS = (
    ("family", sa.String(40)),
    ("omega", sa.BigInteger()),
    ("effective_width", sa.BigInteger()),
    ("density", sa.Float()),
    ("tokens", sa.Integer()),
    ("channels", sa.Integer()),
    ("gamma", sa.Float()),
    ("training_key", sa.String(64)),
)


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        for name, kind in MODEL_COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))
    for name in ("family", "omega", "training_key"):
        op.create_index(f"ix_models_{name}", "models", [name])
    with op.batch_alter_table("trainings") as batch:
        batch.add_column(sa.Column("training_key", sa.String(64), nullable=True))
    op.create_index("ix_trainings_training_key", "trainings", ["training_key"])
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, index=True),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column(
            "dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), nullable=False, index=True
        ),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False, index=True),
        sa.Column(
            "comparison_id", sa.Integer, sa.ForeignKey("comparisons.id", ondelete="SET NULL")
        ),
        sa.Column("stage", sa.String(20), nullable=False),
        sa.Column("summary", sa.JSON),
        sa.Column("artifacts", sa.JSON),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "study_members",
        sa.Column(
            "study_id",
            sa.Integer,
            sa.ForeignKey("studies.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("training_key", sa.String(64), nullable=False, index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("arch", sa.String(200), nullable=False),
        sa.Column("seed", sa.Integer, nullable=False),
        sa.Column(
            "model_id",
            sa.Integer,
            sa.ForeignKey("models.id", ondelete="SET NULL"),
            index=True,
        ),
        sa.Column("reused", sa.Boolean),
    )


def downgrade() -> None:
    op.drop_table("study_members")
    op.drop_table("studies")
    op.drop_index("ix_trainings_training_key", "trainings")
    with op.batch_alter_table("trainings") as batch:
        batch.drop_column("training_key")
    for name in ("family", "omega", "training_key"):
        op.drop_index(f"ix_models_{name}", "models")
    with op.batch_alter_table("models") as batch:
        for name, _kind in MODEL_COLUMNS:
            batch.drop_column(name)
