"""``cka-atlas gc [--dry-run]``: remove orphaned artifacts and stale temporary files."""

from __future__ import annotations

import argparse
from typing import Any

from app.cli import help_data
from app.cli.commands import command

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add ``gc`` to the ``cka-atlas`` parser."""
    grace = help_data.load()["gc_grace_s"]  # app.store.gc's default, without SQLAlchemy
    gc = command(
        subparsers,
        "gc",
        run_gc,
        "remove stored artifacts nothing references, and stale temporary files",
        "List and remove Grams, blocks, heatmaps and blobs that no comparison, "
        "model or dataset references, and temporary files left by killed writers. Files "
        "newer than --grace seconds, or than the oldest running job, are kept.",
    )
    gc.add_argument("--dry-run", action="store_true", help="list only; remove nothing")
    gc.add_argument(
        "--grace",
        type=float,
        default=grace,
        help=f"keep files modified in the last GRACE seconds (default {grace:g})",
    )


def run_gc(args: argparse.Namespace) -> int:
    from app.cli.store import open_store
    from app.store.artifacts import ArtifactStore
    from app.store.gc import collect
    from app.store.settings import Settings

    settings = Settings()
    db = open_store(settings)
    try:
        report = collect(
            db, ArtifactStore(settings.data_dir), dry_run=args.dry_run, grace_s=args.grace
        )
    finally:
        db.dispose()
    verb = "would remove" if args.dry_run else "removed"
    for label, items in (("orphan", report.orphans), ("temporary", report.temporary)):
        for path, size in items:
            print(f"{verb} {label}\t{size}\t{path}")
    count = len(report.orphans) + len(report.temporary)
    print(f"{verb} {count} files, {report.bytes} bytes")
    return 0
