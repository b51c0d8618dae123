"""Training jobs: train an architecture on a registered dataset and register the model.

The library's :func:`train` is imported by the first training, not with this module: it loads
torch's models and timm, which the server does not need until a job trains.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from analysis import Cancelled
from app.jobs.control import JobControl
from app.jobs.queue import LostJob
from app.store import repository
from app.store.artifacts import ArtifactStore
from app.store.checkpoints import describe_model, store_checkpoint
from app.store.datasets import dataset_key
from app.store.orm import Dataset, Job, Model, Training
from app.store.services import Services
from app.store.values import clean_name

__all__ = ["SERVICE_SOURCES", "register_checkpoint", "run_training", "train", "train_and_register"]

if TYPE_CHECKING:
    from models.training import train
else:

    def train(*args: Any, **kwargs: Any) -> Path:
        """:func:`models.training.train`, imported on the first call (a test replaces it)."""
        from models.training import train as library_train

        return library_train(*args, **kwargs)


# Model sources whose checkpoints the service wrote itself (trainings, studies, the demo zoo).
SERVICE_SOURCES = frozenset({"training", "study", "zoo"})


def register_checkpoint(
    services: Services,
    weights: Path,
    sidecar: Path,
    *,
    name: str | None,
    source: str,
    training_key: str | None = None,
    weights_name: str | None = None,
    sidecar_name: str | None = None,
) -> tuple[Model, bool]:
    """Store a checkpoint pair and add its model row; idempotent by weights sha256.

    ``name`` is the name asked for (None: the sidecar's, else the architecture). Weights
    stored already return their row, and a name asked for that the row does not have is kept
    as one of its aliases (:class:`app.store.orm.ModelAlias`), never dropped.
    ``training_key`` (a service training's identity, see :mod:`app.jobs.study`) is recorded
    on the row, also on an existing row that had none. ``weights_name`` and ``sidecar_name``:
    the files as an uploader sent them, which refusals name. Returns (model row, created).
    """
    store: ArtifactStore = services.store
    # The service's own trainings keep a stored twin's sidecar (a deterministic re-run
    # differs in its timings only); anything uploaded must match it (409 otherwise).
    keep = source in SERVICE_SOURCES
    sha, size, model = store_checkpoint(
        store,
        weights,
        sidecar,
        keep_stored=keep,
        weights_name=weights_name,
        sidecar_name=sidecar_name,
    )
    info = describe_model(model)
    sidecar_meta: dict[str, Any] = repository_sidecar(store, sha)
    with services.db.session() as s:
        existing = repository.model_by_sha(s, sha)
        if existing is not None:
            if training_key and existing.training_key is None:
                existing.training_key = training_key
                s.flush()
            if name is not None:
                repository.add_alias(s, existing, clean_name(name))
            return existing, False
        row = Model(
            name=(name or _default_name(sidecar_meta, info["arch"]))[:200],
            source=source,
            sha256=sha,
            size_bytes=size,
            sidecar=sidecar_meta,
            training_key=training_key,
            alias_rows=[],
            **info,
        )
        s.add(row)
        s.flush()
        return row, True


def repository_sidecar(store: ArtifactStore, sha: str) -> dict[str, Any]:
    meta = json.loads(store.path(sha, ".json").read_text(encoding="utf-8"))
    return meta if isinstance(meta, dict) else {}


def _default_name(meta: dict[str, Any], arch: str) -> str:
    name = meta.get("name")
    return (clean_name(name) if isinstance(name, str) else "") or arch


def run_training(services: Services, job: Job, control: JobControl) -> None:
    with services.db.session(readonly=True) as s:
        tr = repository.training_for_job(s, job.id)
        ds = s.get(Dataset, tr.dataset_id) if tr else None
    if tr is None or ds is None:
        raise LostJob(f"job {job.id} has no training any more")
    # A built-in dataset trains on its fixed (train, test) split (the row is the test split);
    # a file trains on the whole, of which training holds out a fixed fifth.
    data: Any = (
        tuple(services.datasets.get(f"builtin:{ds.spec}:{split}") for split in ("train", "test"))
        if ds.builtin
        else services.datasets.get(dataset_key(ds))
    )
    p = tr.params
    # The full validated options; the seed is train()'s own argument.
    options = {k: v for k, v in (p.get("config") or {}).items() if k != "seed"}
    model = train_and_register(
        services,
        control,
        train,
        f"training {tr.id}",
        tr.arch,
        data,
        epochs=p["epochs"],
        seed=p["seed"],
        batch_size=p["batch_size"],
        lr=p["lr"],
        name=p.get("name") or tr.arch,
        weight_decay=p.get("weight_decay"),
        register={"name": p.get("name"), "source": "training", "training_key": tr.training_key},
        **options,
    )

    def write(s: Session) -> None:
        row = s.get(Training, tr.id)
        if row is None:
            raise LostJob(f"training {tr.id} was deleted while running")
        row.model_id = model.id

    control.commit(write)


def train_and_register(
    services: Services,
    control: JobControl,
    trainer: Callable[..., Any],
    what: str,
    arch: str,
    data: Any,
    *,
    register: dict[str, Any],
    **kwargs: Any,
) -> Model:
    """Train with ``trainer`` (:func:`models.training.train`, or a test's stand-in) in the
    store's scratch space and register the checkpoint (``register``: name, source and
    training key of :func:`register_checkpoint`); its model row.

    The training runs on this worker's device (``CKA_DEVICE``, ``services.device``); its
    checkpoint records it. It stops between steps once the job is cancelled, shut down or out
    of time (:class:`analysis.Cancelled` naming ``what``); nothing is registered then.
    """
    from models.errors import TrainingCancelled

    with services.store.scratch() as tmp:
        try:
            with services.store.writing():  # a full or read-only store fails with a sentence
                path = Path(
                    trainer(
                        arch,
                        data,
                        out_dir=Path(tmp),
                        device=services.device,
                        progress=False,
                        on_step=control.on_batch,  # False once cancelled: stop between steps
                        **kwargs,
                    )
                )
        except TrainingCancelled as exc:
            # Nothing was written but the scratch directory, which is removed on the way out.
            raise Cancelled(f"{what} was cancelled: {exc}") from None
        if control.should_stop:
            raise Cancelled(f"{what} was cancelled")
        model, _ = register_checkpoint(services, path, path.with_suffix(".json"), **register)
    return model
