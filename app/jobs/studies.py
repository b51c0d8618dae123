"""Submitting a study: the spec checked and expanded before anything is queued.

A study request (:class:`~app.jobs.requests.StudyIn`: a built-in name or a spec document) is
expanded by :func:`analysis.studies.plan` into its trainings, each keyed by (arch, options,
seed, dataset sha256, recipe). Everything a client can get wrong is a 422 here, with the
field to change: a spec that does not validate, an option an arm's preset does not take, a
dataset that is not built in (a spec sent to the server never names a server file), CKA
options the comparison would refuse, too many trainings. The study row keeps the expanded
spec (seeds resolved), so the job plans exactly the same trainings again, and one member row
per training, which the job fills with its model.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from analysis import studies
from analysis.studies.spec import MAX_TRAININGS  # checked by the spec, again after the plan
from app.errors import ProblemError
from app.jobs.cancel import Requester, record
from app.jobs.queue import enqueue
from app.jobs.requests import MAX_MODELS, ComparisonIn, StudyIn
from app.jobs.submit import COMMAND_LISTING, MODELS_LISTING, check_model_budget
from app.store import repository
from app.store.checkpoints import LOADER_OPTIONS
from app.store.datasets import BUILTIN_DATASETS as SERVICE_DATASETS
from app.store.datasets import builtin_dataset
from app.store.orm import Study, StudyMember
from app.store.services import Services

__all__ = ["MAX_TRAININGS", "atlas_body", "comparison_body", "plan_study", "submit_study"]

# The datasets a study may name: the built-in ones (load_dataset specs).
BUILTIN_DATASETS = tuple(spec for _name, spec, _split in SERVICE_DATASETS)


def _invalid(detail: str, field: str, code: str = "invalid_study") -> ProblemError:
    return ProblemError(422, code, detail, field=field)


def _option_keys(arm: studies.Arm) -> set[str]:
    keys = set(arm.options)
    grid = arm.grid
    if isinstance(grid, dict):
        keys |= set(grid)
    elif grid is not None:
        for item in [*(grid.widths or []), *(grid.shapes or [])]:
            if isinstance(item, dict):
                keys |= set(item)
    return keys


def _check_arms(spec: studies.StudySpec, field: str) -> None:
    """Arms are presets, without loader options (a spec never makes the server fetch)."""
    import models

    presets = set(models.list_presets())
    for where, arm in [("reference", spec.reference)] + [
        (f"arms.{i}", a) for i, a in enumerate(spec.arms)
    ]:
        if arm.arch not in presets:
            raise _invalid(
                f"arm '{arm.name}': {arm.arch!r} is not a preset; studies train the presets "
                f"({', '.join(sorted(presets))})",
                f"{field}.{where}.arch",
            )
        bad = sorted(_option_keys(arm) & LOADER_OPTIONS)
        if bad:
            raise _invalid(
                f"arm '{arm.name}': the options {bad} are not accepted", f"{field}.{where}.options"
            )


def comparison_body(cka: dict[str, Any], model_ids: list[int], dataset_id: int) -> ComparisonIn:
    """The comparison of a study's models with its ``cka`` options (ValidationError if bad).

    A study may hold more models than a client's comparison request (MAX_MODELS); the
    comparison's own size limits (layers, memory) still apply when it is submitted.
    """
    body = ComparisonIn.model_validate(
        {**cka, "model_ids": model_ids[:MAX_MODELS] or [1], "dataset_id": dataset_id}
    )
    return body.model_copy(update={"model_ids": list(model_ids)})


def atlas_body(study: Study, model_ids: list[int]) -> ComparisonIn:
    """The comparison of ``model_ids`` that a study's atlas is: its spec's ``cka`` options
    (as :func:`analysis.studies.plan` keeps them) over its dataset."""
    return comparison_body(dict(study.spec.get("cka") or {}), model_ids, study.dataset_id)


def plan_study(body: StudyIn, *, local: bool = False) -> studies.StudyPlan:
    """Expand a request into its plan, or a 422 naming what to change.

    ``local`` (the CLI on this machine) may name a dataset file; over REST only the built-in
    datasets are accepted.
    """
    import models

    field = "builtin" if body.builtin is not None else "spec"
    try:
        spec = studies.load_spec(body.builtin if body.builtin is not None else body.spec or {})
    except studies.StudyError as exc:
        raise _invalid(str(exc), field) from None
    if not local and spec.dataset not in BUILTIN_DATASETS:
        raise _invalid(
            f"study dataset {spec.dataset[:100]!r} is not a built-in dataset "
            f"({', '.join(BUILTIN_DATASETS)})",
            f"{field}.dataset",
        )
    _check_arms(spec, field)
    try:
        comparison_body(spec.cka, [1], 1)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise _invalid(
            f"study cka option {where}: {error['msg']}", f"{field}.cka.{where}"
        ) from None
    try:
        plan = studies.plan(spec, seeds=body.seeds, quick=body.quick)
    except (studies.StudyError, models.ConfigError) as exc:
        raise _invalid(str(exc), field) from None
    if len(plan.trainings) > MAX_TRAININGS:
        raise _invalid(
            f"the study has {len(plan.trainings)} trainings, more than the {MAX_TRAININGS} "
            "allowed; use fewer seeds, arms or grid points",
            "seeds" if body.seeds else field,
        )
    return plan


def _check_budgets(services: Services, plan: studies.StudyPlan, field: str) -> None:
    """422 when one of the study's trainings would need more memory than a model may."""
    import models

    seen: set[str] = set()
    for t in plan.trainings:
        options = {k: v for k, v in t.config.items() if k != "seed"}
        key = json.dumps([t.arch, options, t.recipe.get("batch_size")], sort_keys=True)
        if key not in seen:
            seen.add(key)
            batch = int(t.recipe.get("batch_size") or models.recipe("timm").batch_size)
            check_model_budget(
                services, t.arch, options, batch_size=batch, training=True, field=field
            )


def stored_spec(plan: studies.StudyPlan) -> dict[str, Any]:
    """The spec as stored with the study: its seeds resolved to the list that was planned."""
    document: dict[str, Any] = plan.spec.model_dump(mode="json")
    document["seeds"] = list(plan.seeds)
    document["quick_seeds"] = None  # resolved into seeds
    return document


def named_models(services: Services, body: StudyIn, listing: str = MODELS_LISTING) -> StudyIn:
    """``body`` with each arm that names a model of the store (``model``: its id, or a name or
    alias one model has) given that model's architecture and options instead (the arm's own
    ``options`` over them; the seed is the study's): "train more seeds of this model". A name
    no model has, or several have, is a 422 on ``spec.arms.N.model`` (or ``spec.reference``),
    ending with ``listing`` (where the models are listed)."""
    if body.spec is None:
        return body
    document = dict(body.spec)
    where = [("reference", document.get("reference"))]
    where += [(f"arms.{i}", arm) for i, arm in enumerate(document.get("arms") or [])]
    resolved: dict[str, Any] = {}
    for place, arm in where:
        if not isinstance(arm, dict) or "model" not in arm:
            continue
        field = f"spec.{place}.model"
        if "arch" in arm:
            raise _invalid("an arm names a model or an architecture, not both", field)
        ref = arm["model"]
        if not isinstance(ref, int | str) or isinstance(ref, bool):
            raise _invalid("model is a model's id or name", field)
        with services.db.session(readonly=True) as s:
            row = repository.model_by_reference(s, ref, listing=listing, field=field)
            arch, config = row.arch, dict(row.config)
        config.pop("seed", None)
        options = {**config, **dict(arm.get("options") or {})}
        resolved[place] = {k: v for k, v in arm.items() if k != "model"}
        resolved[place] |= {"arch": arch, "options": options}
    if not resolved:
        return body
    if "reference" in resolved:
        document["reference"] = resolved["reference"]
    document["arms"] = [
        resolved.get(f"arms.{i}", arm) for i, arm in enumerate(document.get("arms") or [])
    ]
    return body.model_copy(update={"spec": document})


def submit_study(
    services: Services,
    body: StudyIn,
    *,
    dispatch: bool = True,
    local: bool = False,
    requester: Requester | None = None,
) -> tuple[int, int]:
    """Queue a study; returns (study id, job id). ``dispatch=False`` leaves the job for the
    caller to run; ``requester`` holds its job (:mod:`app.jobs.cancel`). Arms may name models
    of the store (:func:`named_models`)."""
    listing = COMMAND_LISTING if local else MODELS_LISTING  # local: the command line
    plan = plan_study(named_models(services, body, listing), local=local)
    if plan.dataset["name"] not in BUILTIN_DATASETS:  # only ``local`` gets here
        raise _invalid("studies over a dataset file are not supported yet", "spec.dataset")
    ds = builtin_dataset(services, plan.dataset["name"])
    _check_budgets(services, plan, "builtin" if body.builtin is not None else "spec")
    with services.db.session() as s:
        job = enqueue(s, "study")
        if requester is not None:
            record(s, job.id, requester)
        study = Study(
            name=plan.spec.name,
            spec=stored_spec(plan),
            params={
                "builtin": body.builtin,
                "seeds": list(plan.seeds),
                "quick": body.quick,
                "trainings": len(plan.trainings),
                "dataset": plan.dataset,
            },
            dataset_id=ds.id,
            job_id=job.id,
            stage="queued",
            members=[
                StudyMember(
                    position=i, training_key=t.key, name=t.name[:200], arch=t.arch, seed=t.seed
                )
                for i, t in enumerate(plan.trainings)
            ],
        )
        s.add(study)
        s.flush()
        study_id, job_id = study.id, job.id
    if dispatch:
        services.dispatch(job_id)
    return study_id, job_id
