"""``cka-atlas study run | list | plan``: a study as one command, against the local database.

``study run`` queues the study exactly as ``POST /v1/studies`` does and runs it on the
workers — the Celery workers when a broker is configured, else a pool of threads in this
process — showing two progress bars: trainings k of n, then the atlas. A second run finds
every checkpoint by its training key and trains nothing; an interrupted run (Ctrl-C)
cancels its job and its trainings, and the next run resumes from the finished trainings.
The results are written to ``--out``: summary.json, results.csv, plot.png and
plot.svg, and for an identification study (``layer_identification``) its table as
identification.csv and identification.md. ``study plan`` reads a pilot run's summary.json
and answers how many seeds would detect a difference at 80 % power
(:mod:`analysis.studies.pilot`); it needs no database.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from app.cli.commands import command, no_progress_flag

__all__ = ["register"]

POLL_S = 0.25


def register(subparsers: Any) -> None:
    """Add ``study run`` and ``study list`` to the ``cka-atlas`` parser."""
    study = command(
        subparsers,
        "study",
        None,
        "run a study (sweeps × seeds → summary, table, plot) or list the stored ones",
        "Studies: the fixed-Ω experiments of Hayase & Karakida as one command.",
    )
    sub = study.add_subparsers(dest="study_command", metavar="ACTION", required=True)
    run = command(
        sub,
        "run",
        run_study_command,
        "run a built-in study (sparsity, width, layer_identification) or a YAML/JSON spec file",
        "Train (or reuse) every model of the study, compare them once, and write "
        "DIR/summary.json, DIR/results.csv, DIR/plot.png and DIR/plot.svg (and "
        "DIR/identification.csv and .md for layer_identification).",
    )
    run.add_argument(
        "study", metavar="NAME_OR_SPEC_FILE", help="a built-in study's name, or a file"
    )
    run.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: the spec's)")
    run.add_argument("--out", default=None, help="output directory (default: studies/NAME)")
    run.add_argument(
        "--quick",
        action="store_true",
        help="the spec's quick recipe (1 epoch) and its quick_seeds where it has them",
    )
    no_progress_flag(run)
    listing = command(sub, "list", list_studies_command, "list the studies in the local database")
    listing.add_argument("--limit", type=int, default=50)
    planning = command(
        sub,
        "plan",
        plan_study_command,
        "how many seeds a study needs, from a pilot run's summary.json",
        "From the variance components of a pilot run of the study (its summary.json), the "
        "seeds per arm that detect --detect (or each undecided difference as observed) at "
        "80 % power, and what they cost in trainings.",
    )
    planning.add_argument("study", metavar="NAME_OR_SPEC_FILE", help="sparsity, width, or a file")
    planning.add_argument(
        "--pilot", required=True, metavar="SUMMARY_JSON", help="a run's summary.json"
    )
    planning.add_argument(
        "--detect",
        type=float,
        default=None,
        metavar="DIFFERENCE",
        help="the difference in diagonal CKA to detect (default: the spec's detect, else each "
        "undecided difference as observed)",
    )
    planning.add_argument(
        "--power", type=float, default=None, help="the power to reach (default: 0.8)"
    )


def _services() -> Any:
    """The store's services (a context manager), from the environment, through the
    composition root; with no broker, a pool of ``CKA_WORKER_THREADS`` threads (at least
    one) in this process runs the jobs, as the server's embedded worker would."""
    from app.cli.store import ensure_store
    from app.jobs.runtime import running
    from app.store.datasets import register_builtin_datasets
    from app.store.settings import Settings

    def prepare(services: Any) -> None:
        ensure_store(services.db.engine, services.settings.data_dir)
        register_builtin_datasets(services)

    settings = Settings()
    return running(settings, threads=max(settings.worker_threads, 1), prepare=prepare)


def _requester() -> Any:
    """This command's user as the study's requester: they may stop it, as the machine's
    owner may stop anything (an admin)."""
    import getpass

    from app.jobs.cancel import Requester

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = str(os.getuid())
    return Requester(f"cli:{user}"[:80], "cka-atlas study run", admin=True)


def _request(source: str, seeds: int | None, quick: bool) -> Any:
    import yaml

    from analysis.studies import BUILTIN_STUDIES
    from app.jobs.requests import StudyIn

    if source in BUILTIN_STUDIES:
        return StudyIn(builtin=source, seeds=seeds, quick=quick)  # type: ignore[arg-type]
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(
            f"'{source}' is neither a built-in study ({', '.join(BUILTIN_STUDIES)}) nor a file"
        )
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(document, dict):
        raise FileNotFoundError(f"{source} does not hold a study spec (a YAML/JSON mapping)")
    return StudyIn(spec=document, seeds=seeds, quick=quick)


def _state(services: Any, study_id: int) -> dict[str, Any]:
    from app.http.api.studies import study_view
    from app.store.orm import Study

    with services.db.session(readonly=True) as s:
        study = s.get(Study, study_id)
        assert study is not None
        return study_view(study)


class _Bars:
    """The two bars: trainings k of n (with how many were reused), then the atlas in %."""

    def __init__(self, total: int, enabled: bool) -> None:
        from tqdm.auto import tqdm

        self._tqdm = tqdm
        self.enabled = enabled
        self.trainings = tqdm(total=total, desc="trainings", unit="model", disable=not enabled)
        self.atlas: Any = None

    def update(self, view: dict[str, Any]) -> None:
        tr = view["trainings"]
        self.trainings.n = tr["done"]
        self.trainings.set_postfix_str(f"{tr['reused']} reused", refresh=False)
        self.trainings.refresh()
        if view["stage"] in ("comparison", "summary", "done") or view["status"] == "succeeded":
            if self.atlas is None:
                self.atlas = self._tqdm(total=100, desc="atlas", unit="%", disable=not self.enabled)
            n = tr["total"]
            share = 1.0 if view["status"] == "succeeded" else view["progress"] * (n + 1) - n
            self.atlas.n = round(100 * min(max(share, 0.0), 1.0))
            self.atlas.refresh()

    def close(self) -> None:
        self.trainings.close()
        if self.atlas is not None:
            self.atlas.close()


def _follow(services: Any, study_id: int, progress: bool) -> dict[str, Any]:
    """Follow the study in the database with the bars until it ends; Ctrl-C cancels it."""
    from app.jobs.cancel import cancel
    from app.store.orm import JobState, Study

    view = _state(services, study_id)
    bars = _Bars(view["trainings"]["total"], progress)
    try:
        while True:
            view = _state(services, study_id)
            bars.update(view)
            if not JobState(view["status"]).live:
                return view
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        with services.db.session() as s:
            study = s.get(Study, study_id)
            if study is not None:
                cancel(s, study.job_id, _requester(), what=f"study {study_id}")
        raise
    finally:
        bars.close()


def _write(services: Any, study_id: int, out: Path) -> list[Path]:
    from app.store.orm import Study

    with services.db.session(readonly=True) as s:
        study = s.get(Study, study_id)
        assert study is not None and study.summary is not None and study.artifacts is not None
        summary, artifacts = study.summary, dict(study.artifacts)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.json"]
    written[0].write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    for kind, name in (("csv", "results.csv"), ("png", "plot.png"), ("svg", "plot.svg")):
        target = out / name
        target.write_bytes(services.store.path(artifacts[kind], f".{kind}").read_bytes())
        written.append(target)
    if summary.get("identification") is not None:
        from analysis.studies.identification import identification_table, markdown_table

        items = summary["identification"]
        written += [out / "identification.csv", out / "identification.md"]
        identification_table(items).to_csv(written[-2], index=False)
        written[-1].write_text(markdown_table(items), encoding="utf-8")
    return written


def run_study_command(args: argparse.Namespace) -> int:
    from app.errors import ProblemError
    from app.jobs.studies import submit_study

    with _services() as services:
        body = _request(args.study, args.seeds, args.quick)
        try:
            study_id, _ = submit_study(services, body, local=True, requester=_requester())
        except ProblemError as exc:
            print(f"error: {exc.detail}", file=sys.stderr)
            return 2
        started = time.perf_counter()
        view = _follow(services, study_id, not args.no_progress)
        seconds = time.perf_counter() - started
        tr = view["trainings"]
        if view["status"] != "succeeded":
            print(
                f"error: study {study_id} {view['status']}: {view.get('error') or ''}".rstrip(),
                file=sys.stderr,
            )
            return 1
        out = Path(args.out) if args.out else Path("studies") / view["name"]
        files = _write(services, study_id, out)
        print(
            f"study {study_id} ({view['name']}): {tr['total']} trainings, {tr['reused']} reused "
            f"from earlier runs, {tr['trained']} trained; comparison {view['comparison_id']}; "
            f"{seconds:.1f} s"
        )
        for path in files:
            print(f"  {path}")
        return 0


def list_studies_command(args: argparse.Namespace) -> int:
    from app.cli.store import open_store
    from app.http.api.studies import study_view
    from app.store import repository
    from app.store.settings import Settings

    db = open_store(Settings())
    try:
        with db.session(readonly=True) as s:
            items, total = repository.list_studies(s, limit=args.limit, offset=0)
            views = [study_view(st) for st in items]
    finally:
        db.dispose()
    print(f"{'id':>4}  {'name':<16} {'status':<10} {'trainings':>11}  created")
    for v in views:
        tr = v["trainings"]
        print(
            f"{v['id']:>4}  {v['name']:<16} {v['status']!s:<10} "
            f"{tr['done']:>5}/{tr['total']:<5}  {v['created_at']:%Y-%m-%d %H:%M}"
        )
    print(f"{total} studies")
    return 0


def _number(value: float | None, fmt: str = ".3f") -> str:
    return "—" if value is None else format(value, fmt)


def _plan_rows(plan: Any) -> list[list[str]]:
    """One row per difference of the pilot: observed, decision, what its seeds detect, the
    floor, and the seeds for the plan's target ("never" out of reach, "—" without interval)."""
    rows = []
    for d in plan.differences:
        power = d.get("power") or {}
        rows.append(
            [
                d["arm"],
                "seed to seed" if d["versus"] == "seed_to_seed" else d["versus"],
                _number(d["estimate"], "+.3f"),
                d["decision"] or "no interval",
                _number(power.get("detectable")),
                _number(power.get("floor")),
                "—" if not power else _number(plan.needed(d), "d").replace("—", "never"),
            ]
        )
    return rows


def plan_study_command(args: argparse.Namespace) -> int:
    from analysis.studies.pilot import plan_seeds
    from analysis.studies.power import SEARCH_SEEDS
    from analysis.studies.spec import MAX_TRAININGS

    plan = plan_seeds(args.study, args.pilot, detect=args.detect, target=args.power)
    settings, pilot_n = plan.settings, len(plan.pilot_seeds)
    target = "observed" if plan.detect is None else f"{plan.detect:.3f}"
    goal = (
        "each undecided difference, were it as observed,"
        if plan.detect is None
        else f"a difference of {target}"
    )
    print(
        f"{plan.study}: the seeds (per arm, the reference's too) that detect {goal} in diagonal "
        f"CKA with {100 * settings['target']:.0f} % power, two-sided α = {settings['alpha']:g}, "
        f"from a {pilot_n}-seed pilot"
    )
    pairing = {d.get("images") for d in plan.differences if d.get("power")}
    if "summed" in pairing:
        print(
            "The pilot keeps no per-image terms: each floor sums the two sides' image noise as "
            "if independent (an upper bound); a pilot run with this release pairs them."
        )
    elif "paired" in pairing:
        print("Floors: the paired image noise of each difference, over the same test images.")
    header = ["arm", "minus", "observed", "decision", f"detectable ({pilot_n})", "floor"]
    rows = [[*header, f"seeds for {target}"], *_plan_rows(plan)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) + 1)]
    for row in rows:
        cells = [
            c.ljust(w) if i in (0, 1, 3) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
    print()
    if not plan.asked:
        print("Nothing to plan: every difference is decided or has no interval.")
    elif plan.seeds is not None:
        n = plan.seeds
        aim = (
            "decide every undecided difference that seeds can, were it as observed"
            if plan.detect is None
            else f"detect {target} in every difference where seeds can"
        )
        print(
            f"To {aim}: {n} seeds, {plan.trainings(n)} trainings "
            f"({plan.new_trainings(n)} new beyond the pilot's)."
        )
        if n > settings["max_seeds"]:
            print(
                f"That is more than a study of this size may train ({settings['max_seeds']} "
                f"seeds, {MAX_TRAININGS} trainings): split its arms into smaller studies."
            )
        else:
            print(f"  cka-atlas study run {args.study} --seeds {n}")
    blind = [d for d in plan.differences if not d.get("power")]
    if blind:
        print(
            f"{len(blind)} differences have no interval in the pilot, so nothing to plan them "
            "from: against the seed-to-seed baseline a pilot needs 3 seeds, elsewhere 2."
        )
    if plan.out_of_reach:
        floors = [d["power"]["floor"] for d in plan.out_of_reach]
        print(
            f"never: {len(plan.out_of_reach)} of {len(plan.asked)} differences are out of reach "
            f"of any number of seeds up to {SEARCH_SEEDS}; the images' sampling noise alone "
            f"hides a difference below its floor ({min(floors):.3f}–{max(floors):.3f} here), "
            "which more seeds do not lower and more test images do."
        )
    return 0
