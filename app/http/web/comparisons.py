"""Comparison pages: the filtered list (the home page), one atlas, and the new-atlas form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from analysis.inference.verdicts import MARKS, WORDS
from analysis.measures import FLAGS
from analysis.options import OptionSpec, option_specs
from analysis.plot import MEASURE_TITLES, learned_limit
from app.http.api.options import option_filter, option_suggestions
from app.http.api.views import comparison_view
from app.http.problems import ProblemError
from app.http.web.common import Auth, as_int, as_text, found, paged, services_of
from app.http.web.rendering import render
from app.jobs.demo import demo_status
from app.jobs.requests import ComparisonIn
from app.store import gc, repository
from app.store.cells import QUANTITIES, VERDICT_LEGEND, Cells, verdict_marks
from app.store.orm import JOB_STATES, Comparison, Dataset, JobState, Model

__all__ = ["atlas_payload", "diagnostics_view", "glance", "router"]

router = APIRouter(include_in_schema=False)
KERNEL_CHOICES = ("linear", "rbf")


def _catalog(request: Request) -> tuple[list[Model], list[Dataset], list[str]]:
    """All models and datasets (for filters and the form), and the kernels in use."""
    with services_of(request).db.session(readonly=True) as s:
        models, _ = repository.list_models(s, limit=500, offset=0)
        datasets, _ = repository.list_datasets(s, limit=500, offset=0)
        kernels = sorted(set(s.scalars(select(Comparison.kernel).distinct())) | set(KERNEL_CHOICES))
    return models, datasets, kernels


@router.get("/")
def comparisons_page(
    request: Request,
    auth: Auth,
    model: str | None = None,
    dataset: str | None = None,
    status: str | None = None,
    kernel: str | None = None,
    option: str | None = None,
    page: str | None = None,
) -> Response:
    """Newest comparisons first, filtered by model, dataset, status, kernel and options
    (``option``: NAME=VALUE filters separated by spaces, as ``GET /v1/comparisons`` reads
    them one by one)."""
    model_id, dataset_id = as_int(model, minimum=1), as_int(dataset, minimum=1)
    state = JobState(status) if status in JOB_STATES else None
    kernel = as_text(kernel, 40)
    wanted = " ".join((as_text(option, 300) or "").split())
    try:
        params = [option_filter(text) for text in wanted.split()]
        refused = None
    except ProblemError as exc:
        params, refused = [], exc.detail
    filters = {"model": model_id, "dataset": dataset_id, "status": state, "kernel": kernel}
    filters["option"] = wanted or None
    models, datasets, kernels = _catalog(request)
    with services_of(request).db.session(readonly=True) as s:
        demo = demo_status(s)
    where = {"model_id": model_id, "dataset_id": dataset_id, "status": state, "kernel": kernel}
    rows, pager = paged(
        request, page, "/", filters, repository.list_comparisons, _rows, params=params, **where
    )
    return render(
        request,
        "comparisons.html",
        auth,
        title="Comparisons",
        rows=rows,
        pager=pager,
        filters=filters,
        models=models,
        datasets={d.id: d for d in datasets},
        kernels=kernels,
        statuses=JOB_STATES,
        option_suggestions=option_suggestions(),
        option_refused=refused,
        demo=demo,
    )


def _rows(s: Session, items: Sequence[Comparison]) -> list[dict[str, Any]]:
    """The comparisons' views, each with the study it belongs to (if any)."""
    studies = repository.studies_of_comparisons(s, [c.id for c in items])
    return [comparison_view(c) | {"study": studies.get(c.id)} for c in items]


@router.get("/comparisons/new")
def new_comparison_page(request: Request, auth: Auth) -> Response:
    """The form that starts a comparison through ``POST /v1/comparisons``."""
    models, datasets, _ = _catalog(request)
    preselect = {
        m for m in (as_int(v, minimum=1) for v in request.query_params.getlist("model")) if m
    }
    return render(
        request,
        "new.html",
        auth,
        title="New comparison",
        models=models,
        datasets=datasets,
        preselect=preselect,
        options=form_options(),
    )


def form_options() -> list[OptionSpec]:
    """The options the new-comparison form draws, in their order: each its kind, default,
    description, choices, bounds and pattern as ``POST /v1/comparisons`` takes them (the
    library's :class:`analysis.CompareOptions` with the service's caps), so an option added
    there is on the form without a change here or in the template. A deprecated option
    (``bootstrap``) stays off the form: still read, but others say it now."""
    return [spec for spec in option_specs(ComparisonIn).values() if not spec.deprecated]


def atlas_payload(result: dict[str, Any]) -> dict[str, Any]:
    """What the page scripts need from a stored atlas: names, layers, and per model pair the
    CKA block with the blocks of every per-cell quantity that was computed (interval, null,
    baselines); ``has`` says which those are; ``undefined`` why a pair has no baseline; with
    other measures, per pair ``flags`` (per measure, per flag raised in the pair, its cells) and
    ``flag_labels``, each flag in words (docs/measures.md, "Flags")."""
    cells = Cells(result)
    has = [key for key in QUANTITIES if cells.has(key)]
    matrices = []
    for a, b in cells.pairs():
        blocks = cells.blocks_json(a, b)
        pair: dict[str, Any] = {"a": a, "b": b, "cka": blocks["cka"]}
        pair["undefined"] = cells.undefined(a, b)
        others = {name: cells.measure_json(name, a, b) for name in cells.measure_names[1:]}
        if others:
            pair["measures"] = others
            flagged = {name: cells.flags_json(name, a, b) for name in others}
            pair["flags"] = {name: found for name, found in flagged.items() if found}
        matrices.append(pair | {k: blocks[k] for k in has})
    random_init = (result.get("baselines") or {}).get("random_init") or {}
    learned = cells.full.get("learned")
    return {
        "random_init_draws": random_init.get("draws"),
        "verdict_words": WORDS,
        "learned_limit": None if learned is None else learned_limit(learned),
        "models": cells.models,
        "layers": cells.layers,
        "n": result.get("n"),
        "has": has,
        "permutations": (result.get("config") or {}).get("permutations") or 0,
        "matrices": matrices,
        "measures": cells.measure_names,
        "measure_titles": MEASURE_TITLES,
        "flag_labels": {flag.name: flag.label for flag in FLAGS},
    }


def _count_words(counts: dict[str, int] | None, question: str) -> list[str]:
    total = sum((counts or {}).values())
    return [
        f"{n} of {total} cells {WORDS[question][v]}"
        for v in MARKS[question]
        if (n := (counts or {}).get(v))
    ]


def glance(summary: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The "Models at a glance" table: per pair one short line (value, verdict marks) and its
    company in the cell's title; the notes the table needs once (what the marks say, what a
    missing seed ceiling needs) rather than in every cell."""

    def num(v: float | None) -> str:
        return "–" if v is None else f"{v:.3f}"

    rows, marked, without_ceiling = [], False, []
    for row in summary:
        out = []
        for c in row:
            learned = verdict_marks(c.get("learned_verdicts") or {}, "learned")
            seed = verdict_marks(c.get("seed_verdicts") or {}, "seed")
            marked = marked or bool(learned or seed)
            said = [f"mean {'diagonal' if c['kind'] == 'diagonal' else 'best-match'} CKA"]
            said[0] += f" {num(c['cka'])}"
            if c.get("ci_low") is not None:
                said[0] += f" [{num(c['ci_low'])}, {num(c['ci_high'])}]"
            if c.get("random_init") is not None:
                sd = c.get("random_init_sd")
                spread = "" if sd is None else f" ± {num(sd)}"
                said.append(f"init {num(c['random_init'])}{spread}")
            if c.get("seed_ceiling") is not None:
                said.append(f"seed {num(c['seed_ceiling'])}")
            elif (why := c["undefined"].get("seed_ceiling")) is not None:
                said.append(f"no seed ceiling: {why}")
                without_ceiling.append(c)
            said += _count_words(c.get("learned_verdicts"), "learned")
            said += _count_words(c.get("seed_verdicts"), "seed")
            # learned first, then the seed verdict, apart ("?" is undecided in both)
            out.append(c | {"marks": " · ".join(m for m in (learned, seed) if m)})
            out[-1]["title"] = " · ".join(said)
        rows.append(out)
    notes = []
    if marked:
        notes.append(f"Marks: {VERDICT_LEGEND}.")
    if without_ceiling:
        pairs = len({tuple(sorted((c["a"], c["b"]))) for c in without_ceiling})
        notes.append(
            f"no seed ceiling: add a third seed ({pairs} pair{'s' if pairs != 1 else ''} "
            "have no other seed of a model's architecture, options and training data in the "
            "store but the other side of the pair; hover a cell for its reason)."
        )
    return {"rows": rows, "notes": notes}


def diagnostics_view(diagnostics: dict[str, Any] | None) -> dict[str, Any]:
    """The diagnostics card's items grouped: undefined baselines once per baseline and reason
    (naming their blocks), and the warnings (the page folds the long ones)."""
    d = diagnostics or {}
    grouped: dict[tuple[str, str], list[str]] = {}
    for u in d.get("undefined_baselines") or ():
        where = u["a"] if u["a"] == u["b"] else f"{u['a']} × {u['b']}"
        grouped.setdefault((u["baseline"].replace("_", " "), u["reason"]), []).append(where)
    layers: dict[str, list[str]] = {}
    for u in d.get("undefined_layers") or ():
        item = u if isinstance(u, dict) else {"model": "", "layer": str(u), "reason": ""}
        where = f"{item.get('layer')} of {item.get('model')}".strip()
        layers.setdefault(str(item.get("reason") or "undefined"), []).append(where)
    return {
        "undefined_baselines": [
            {"baseline": b, "reason": r, "blocks": blocks} for (b, r), blocks in grouped.items()
        ],
        "undefined_layers": [{"reason": r, "layers": names} for r, names in layers.items()],
        "warnings": [str(w) for w in d.get("warnings") or ()],
    }


@router.get("/comparisons/{comparison_id}")
def comparison_page(request: Request, auth: Auth, comparison_id: int) -> Response:
    """The atlas: heatmaps of every model pair, or a live progress bar while it runs."""
    with services_of(request).db.session(readonly=True) as s:
        cmp = found(s, Comparison, comparison_id, auth)
        view = comparison_view(
            cmp,
            gc.comparison_bytes(s, [cmp.id]).get(cmp.id, 0),
            gc.unshared_bytes(s, [cmp.id]).get(cmp.id, 0),
        )
        dataset = s.get(Dataset, cmp.dataset_id)
        result = cmp.result
    payload = atlas_payload(result) if result is not None else None
    summary = Cells(result).summaries() if result is not None else None
    return render(
        request,
        "comparison.html",
        auth,
        title=f"Comparison {comparison_id}",
        cmp=view,
        dataset=dataset,
        atlas=payload,
        summary=summary,
        glance=glance(summary) if summary else None,
        diag=diagnostics_view(view["diagnostics"]),
        meta={"id": comparison_id, "status": view["status"], "progress": view["progress"]},
    )
