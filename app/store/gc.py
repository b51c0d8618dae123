"""Storage garbage collection: what each comparison references, orphans, stale temporaries.

A comparison references the Gram stacks and HSIC blocks its job read or wrote, the decoded images of
its photos (:class:`app.store.artifacts.StoreDecodedCache`), and the heatmaps rendered from its
result (rows of ``artifact_refs``, written with the result, when a job ends without one — failed,
cancelled, stopped: :func:`refs_kept` — and when a heatmap is first served). Deleting comparisons —
directly, or with the model or dataset they use — removes each of their artifacts that no remaining
comparison references (:func:`release`); a comparison's view says how many bytes that is
(:func:`unshared_bytes`). ``cka-atlas gc`` (:func:`collect`) finds the rest: artifacts nothing
references (from a job killed with its process, from a comparison deleted while it ran, or written
before references existed), blobs of deleted checkpoints and dataset files, and temporary files left
by killed writers.

A file younger than the GC horizon is never touched, whatever references it: it may belong
to an upload or a job still in progress. The horizon is ``grace_s`` ago or the start of the
oldest running job, whichever is earlier.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from app.store.artifacts import ArtifactStore
from app.store.db import Database
from app.store.orm import ArtifactRef, Comparison, ComparisonModel, Dataset, Job, JobState, Model
from app.store.repository import delete_comparison

__all__ = [
    "GcReport",
    "collect",
    "comparison_bytes",
    "delete_comparisons",
    "model_artifact_bytes",
    "record_refs",
    "referenced_by",
    "refs_kept",
    "release",
    "unshared_bytes",
]

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 3600.0
_CHUNK = 500  # paths per IN (...) list


def _size(store: ArtifactStore, path: str) -> int:
    try:
        return (store.root / path).stat().st_size
    except OSError:
        return 0


def record_refs(
    session: Session, store: ArtifactStore, comparison_id: int, paths: Iterable[str], kind: str
) -> None:
    """Add the references of a comparison it does not have yet, in the caller's transaction."""
    wanted = sorted(set(paths))
    if not wanted:
        return
    have = referenced_by(session, [comparison_id])
    rows = [
        {
            "comparison_id": comparison_id,
            "path": p,
            "kind": _kind(p, kind),
            "size_bytes": _size(store, p),
        }
        for p in wanted
        if p not in have
    ]
    if rows:
        session.execute(insert(ArtifactRef), rows)


def _kind(path: str, kind: str) -> str:
    """A reference's kind: ``decoded`` for decoded images (which a job's Gram references
    carry along), else ``kind``."""
    return "decoded" if path.startswith("decoded/") else kind


@contextmanager
def refs_kept(
    db: Database, store: ArtifactStore, comparison_id: int, touched: set[str]
) -> Iterator[None]:
    """Around a job's run: if it ends without a result (an error, a cancel, its worker
    stopping), record the Grams it read or wrote so far (``touched``, filled as it runs) as
    its comparison's, so that deleting the comparison removes those only it used, and a
    re-run finds the rest. A result records them in its own transaction instead."""
    try:
        yield
    except BaseException:
        try:
            with db.session() as s:
                if s.get(Comparison, comparison_id) is not None:  # not deleted meanwhile
                    record_refs(s, store, comparison_id, touched, "gram")
        except Exception as exc:  # the database is away: `cka-atlas gc` finds them later
            log.warning(
                "could not record the Grams of comparison %s (%s)",
                comparison_id,
                type(exc).__name__,
            )
        raise


def add_ref(db: Database, store: ArtifactStore, comparison_id: int, path: str, kind: str) -> None:
    """Record one reference unless it exists; a concurrent duplicate is harmless."""
    key = (comparison_id, path)
    with db.session(readonly=True) as s:
        if s.get(ArtifactRef, key) is not None:
            return
    try:
        with db.session() as s:
            if s.get(Comparison, comparison_id) is not None:  # not deleted meanwhile
                record_refs(s, store, comparison_id, [path], kind)
    except IntegrityError:  # the same reference, written by a parallel request
        pass


def referenced_by(session: Session, comparison_ids: Sequence[int]) -> set[str]:
    """Every artifact path that these comparisons reference."""
    if not comparison_ids:
        return set()
    stmt = select(ArtifactRef.path).where(ArtifactRef.comparison_id.in_(list(comparison_ids)))
    return set(session.scalars(stmt))


def delete_comparisons(session: Session, comparison_ids: Sequence[int]) -> set[str]:
    """Delete these comparisons (members, jobs, artifact references); returns the artifact
    paths they referenced, for :func:`release` once the transaction has committed."""
    paths = referenced_by(session, comparison_ids)
    for cid in comparison_ids:
        delete_comparison(session, cid)
    return paths


def release(db: Database, store: ArtifactStore, paths: Iterable[str]) -> int:
    """Remove each of ``paths`` that no comparison references any more; returns bytes freed.

    Called after the transaction that deleted the comparisons has committed.
    """
    candidates = sorted(set(paths))
    if not candidates:
        return 0
    still: set[str] = set()
    with db.session(readonly=True) as s:
        for start in range(0, len(candidates), _CHUNK):
            chunk = candidates[start : start + _CHUNK]
            still.update(s.scalars(select(ArtifactRef.path).where(ArtifactRef.path.in_(chunk))))
    freed = 0
    for rel in candidates:
        if rel in still:
            continue
        freed += _unlink(store.root / rel)
    if freed:
        log.info("removed %d bytes of artifacts no comparison references", freed)
    return freed


def _unlink(path: Path) -> int:
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    return size


def comparison_bytes(session: Session, comparison_ids: Sequence[int]) -> dict[int, int]:
    """Bytes of the stored artifacts each comparison references (shared ones count fully)."""
    if not comparison_ids:
        return {}
    stmt = (
        select(ArtifactRef.comparison_id, func.coalesce(func.sum(ArtifactRef.size_bytes), 0))
        .where(ArtifactRef.comparison_id.in_(list(comparison_ids)))
        .group_by(ArtifactRef.comparison_id)
    )
    return {int(cid): int(n) for cid, n in session.execute(stmt)}


def unshared_bytes(session: Session, comparison_ids: Sequence[int]) -> dict[int, int]:
    """Bytes of the stored artifacts each comparison alone references: what deleting it frees."""
    if not comparison_ids:
        return {}
    other = aliased(ArtifactRef)
    shared = (
        select(other.path)
        .where(other.path == ArtifactRef.path, other.comparison_id != ArtifactRef.comparison_id)
        .exists()
    )
    stmt = (
        select(ArtifactRef.comparison_id, func.coalesce(func.sum(ArtifactRef.size_bytes), 0))
        .where(ArtifactRef.comparison_id.in_(list(comparison_ids)), ~shared)
        .group_by(ArtifactRef.comparison_id)
    )
    return {int(cid): int(n) for cid, n in session.execute(stmt)}


def model_artifact_bytes(session: Session, model_ids: Sequence[int]) -> dict[int, int]:
    """Bytes of the distinct artifacts referenced by the comparisons that include each model."""
    if not model_ids:
        return {}
    pairs = (
        select(ComparisonModel.model_id, ArtifactRef.path, ArtifactRef.size_bytes)
        .join(ArtifactRef, ArtifactRef.comparison_id == ComparisonModel.comparison_id)
        .where(ComparisonModel.model_id.in_(list(model_ids)))
        .distinct()
        .subquery()
    )
    stmt = select(pairs.c.model_id, func.sum(pairs.c.size_bytes)).group_by(pairs.c.model_id)
    return {int(mid): int(n or 0) for mid, n in session.execute(stmt)}


@dataclass
class GcReport:
    """What :func:`collect` found (and, unless a dry run, removed)."""

    orphans: list[tuple[str, int]] = field(default_factory=list)
    temporary: list[tuple[str, int]] = field(default_factory=list)
    horizon: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(n for _, n in self.orphans) + sum(n for _, n in self.temporary)


def _horizon(db: Database, grace_s: float) -> float:
    """Files modified at or after this time (epoch seconds) are left alone."""
    horizon = time.time() - grace_s
    with db.session(readonly=True) as s:
        oldest = s.scalar(select(func.min(Job.started_at)).where(Job.status == JobState.RUNNING))
    if oldest is not None:
        horizon = min(horizon, oldest.timestamp())
    return horizon


def _live_blobs(s: Session, store: ArtifactStore) -> set[str]:
    live: set[str] = set(s.scalars(select(ArtifactRef.path).distinct()))
    for sha in s.scalars(select(Model.sha256)):
        live.add(store.relative(sha, ".safetensors"))
        live.add(store.relative(sha, ".json"))
    files = select(Dataset.file_sha256, Dataset.file_suffix)
    for file_sha, suffix in s.execute(files.where(Dataset.file_sha256.is_not(None))):
        if file_sha is not None:
            live.add(store.relative(file_sha, suffix or ""))
    return live


def _tree_size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def collect(
    db: Database, store: ArtifactStore, *, dry_run: bool = False, grace_s: float = DEFAULT_GRACE_S
) -> GcReport:
    """Find orphaned artifacts and stale temporary files older than the horizon; remove them.

    Orphans: Grams and blocks under ``grams/``, decoded images under ``decoded/`` and blobs
    under ``blobs/`` that no comparison reference, model or dataset row names. Temporary:
    anything in ``tmp/`` (scratch directories, ``.part`` files) and ``*.tmp`` files a killed
    writer left beside a target.
    """
    report = GcReport(horizon=_horizon(db, grace_s))
    with db.session(readonly=True) as s:
        live = _live_blobs(s, store)

    def old(path: Path) -> bool:
        try:
            return path.stat().st_mtime < report.horizon
        except FileNotFoundError:
            return False

    for root in (store.grams, store.decoded, store.blobs):
        for path in sorted(root.rglob("*")):
            if not path.is_file() or not old(path):
                continue
            rel = path.relative_to(store.root).as_posix()
            if path.suffix == ".tmp" or path.name.endswith(".part"):
                report.temporary.append((rel, path.stat().st_size))
            elif rel not in live:
                report.orphans.append((rel, path.stat().st_size))
    for path in sorted(store.tmp.iterdir()) if store.tmp.is_dir() else []:
        if old(path):
            report.temporary.append((path.relative_to(store.root).as_posix(), _tree_size(path)))
    if not dry_run:
        for rel, _ in report.orphans + report.temporary:
            target = store.root / rel
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        if report.orphans or report.temporary:
            log.info(
                "gc removed %d orphans and %d temporary files (%d bytes)",
                len(report.orphans),
                len(report.temporary),
                report.bytes,
            )
    return report
