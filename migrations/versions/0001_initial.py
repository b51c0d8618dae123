"""Initial schema: models, datasets, jobs, comparisons, comparison_models, trainings.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, index=True),
        sa.Column("arch", sa.String(200), nullable=False, index=True),
        sa.Column("source", sa.String(20), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("sidecar", sa.JSON, nullable=False),
        sa.Column("input_shape", sa.JSON, nullable=False),
        sa.Column("num_classes", sa.Integer),
        sa.Column("parameters", sa.BigInteger, nullable=False),
        sa.Column("connections", sa.BigInteger),
        sa.Column("default_layers", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, index=True),
        sa.Column("builtin", sa.Boolean, nullable=False),
        sa.Column("spec", sa.String(100)),
        sa.Column("split", sa.String(20), nullable=False),
        sa.Column("file_sha256", sa.String(64)),
        sa.Column("file_suffix", sa.String(8)),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("shape", sa.JSON, nullable=False),
        sa.Column("classes", sa.JSON),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("status", sa.String(20), nullable=False, index=True),
        sa.Column("progress", sa.Float, nullable=False),
        sa.Column("cancel_requested", sa.Boolean, nullable=False),
        sa.Column("worker_id", sa.String(200)),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("error_code", sa.String(60)),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("started_at", TS),
        sa.Column("heartbeat_at", TS),
        sa.Column("finished_at", TS),
    )
    op.create_table(
        "comparisons",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("request_hash", sa.String(64), unique=True),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("kernel", sa.String(20), nullable=False, index=True),
        sa.Column("result", sa.JSON),
        sa.Column("result_sha256", sa.String(64)),
        sa.Column("diagnostics", sa.JSON),
        sa.Column("provenance", sa.JSON),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_comparisons_dataset_id", "comparisons", ["dataset_id"])
    op.create_index("ix_comparisons_job_id", "comparisons", ["job_id"])
    op.create_table(
        "comparison_models",
        sa.Column(
            "comparison_id",
            sa.Integer,
            sa.ForeignKey("comparisons.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id"), nullable=False),
        sa.Column("label", sa.String(220), nullable=False),
    )
    op.create_index("ix_comparison_models_model_id", "comparison_models", ["model_id"])
    op.create_table(
        "trainings",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("arch", sa.String(200), nullable=False),
        sa.Column("dataset_id", sa.Integer, sa.ForeignKey("datasets.id"), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("model_id", sa.Integer, sa.ForeignKey("models.id", ondelete="SET NULL")),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_trainings_dataset_id", "trainings", ["dataset_id"])
    op.create_index("ix_trainings_job_id", "trainings", ["job_id"])


def downgrade() -> None:
    for table in ("trainings", "comparison_models", "comparisons", "jobs", "datasets", "models"):
        op.drop_table(table)
