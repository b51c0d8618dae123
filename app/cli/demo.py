"""The demo behind ``make run``: the model zoo registered and one atlas of it over digits.

The atlas is calibrated, so its first page shows every cell with its company: bootstrap
intervals, the comparison's default null (p- and q-values) and both baselines (random init,
seed ceiling).

Idempotent: checkpoints that exist are not retrained, registered ones are found by sha256,
and the atlas request hashes to the stored comparison, so running it again queues nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from analysis.options import BASELINES
from app.cli.store import ensure_store
from app.jobs.requests import ComparisonIn
from app.jobs.runtime import running
from app.jobs.submit import submit_comparison
from app.jobs.train import register_checkpoint
from app.store.datasets import register_builtin_datasets
from app.store.settings import Settings

__all__ = ["DEMO_BATCH_SIZE", "DEMO_BOOTSTRAP", "setup_demo"]

DEMO_BATCH_SIZE = 150
DEMO_BOOTSTRAP = 200


def setup_demo(settings: Settings, zoo_dir: str | Path, *, progress: bool = True) -> int:
    """Build/register the zoo (trained on the settings' device, ``CKA_DEVICE``) and queue the
    atlas; returns the comparison id."""
    from analysis import training_data
    from models.training import build_zoo

    # No worker here: the server's (or `cka-atlas worker`'s) runs the atlas; with a broker the
    # composition root's dispatch publishes it to the Celery workers.
    with running(settings, threads=0) as services:
        ensure_store(services.db.engine, settings.data_dir)
        digits = register_builtin_datasets(services)[0]
        entries = build_zoo(
            training_data("digits"), zoo_dir, progress=progress, device=services.device
        )
        ids = []
        for entry in entries:
            path = Path(entry.path)
            row, created = register_checkpoint(
                services, path, path.with_suffix(".json"), name=entry.name, source="zoo"
            )
            ids.append(row.id)
            if progress:
                print(
                    f"{'registered' if created else 'found'} model {row.id}: {row.name}",
                    file=sys.stderr,
                )
        body = ComparisonIn(
            model_ids=ids,
            dataset_id=digits.id,
            batch_size=DEMO_BATCH_SIZE,
            interval="images",
            resamples=DEMO_BOOTSTRAP,  # unused by image intervals; hashes as bootstrap=200 did
            baselines=BASELINES,
        )
        cmp_id, created = submit_comparison(services, body)
        print(
            f"{'queued' if created else 'found'} comparison {cmp_id} "
            f"(/v1/comparisons/{cmp_id}) of {len(ids)} models over digits",
            file=sys.stderr,
        )
        return cmp_id
