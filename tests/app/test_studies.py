"""Architecture options, model structure, and studies through REST and the CLI.

Every test runs on SQLite and PostgreSQL (the ``db_url`` fixture). Studies train through
:class:`tests.app.study_tools.FakeTrainer` (the model as training builds it, without the
optimisation), so a whole built-in study runs in seconds and the tests can count trainings.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

import analysis
from analysis import studies
from app.cli import main
from app.http.main import create_app
from app.jobs.cancel import request_cancel
from app.jobs.run import execute
from app.store.orm import Comparison
from app.store.services import Services
from app.store.settings import Settings
from models.errors import TrainingCancelled
from tests.app.payloads import assert_problem
from tests.app.study_tools import TINY, FakeTrainer, fake_accuracy
from tests.deadline import Deadline
from tests.helpers import digits_id, register, upload, wait

# mixer_digits: S = 16 tokens of C = 32 channels, γ = 2.
S, C, GAMMA = 16, 32, 2.0
MATCHED = (1 / S + 1 / C) / 2  # 3/64


@pytest.fixture
def trainer(monkeypatch: pytest.MonkeyPatch) -> FakeTrainer:
    fake = FakeTrainer()
    monkeypatch.setattr("app.jobs.study.train", fake)
    return fake


# --- architecture options ----------------------------------------------------------------


def test_training_options_are_checked_before_queuing(idle_client: TestClient) -> None:
    ds = digits_id(idle_client)

    def post(config: Any, arch: str = "sw_mlp_digits") -> Any:
        return idle_client.post(
            "/v1/trainings", json={"arch": arch, "dataset_id": ds, "config": config}
        )

    body = assert_problem(post({"densty": 0.1}), 422, "invalid_config", "config.densty")
    assert "densty" in body["detail"] and "density" in body["detail"]
    assert_problem(post({"density": 2}), 422, "invalid_config", "config.density")
    assert_problem(post({"density": 0}), 422, "invalid_config", "config.density")
    assert_problem(post({"depth": 1.5}), 422, "invalid_config", "config.depth")
    assert_problem(post({"embed_dim": "wide"}), 422, "invalid_config", "config.embed_dim")
    assert_problem(post({"patch_size": 3}), 422, "invalid_config", "config.patch_size")
    assert_problem(post([1, 2]), 422, "validation_error", "config")
    assert idle_client.get("/v1/trainings").json()["total"] == 0  # nothing was queued

    r = post({"density": 0.125, "depth": 6})
    assert r.status_code == 202, r.text
    config = r.json()["params"]["config"]
    assert config["density"] == 0.125 and config["num_blocks"] == 6 and "depth" not in config

    # A REST training carries the key a study computes for the same training, so a study
    # reuses its model: TINY's quick reference at seed 1 is mixer_digits, 1 epoch, seed 1.
    r = idle_client.post(
        "/v1/trainings", json={"arch": "mixer_digits", "dataset_id": ds, "epochs": 1, "seed": 1}
    )
    planned = studies.plan(TINY, quick=True).reference.keys[1]
    assert r.json()["training_key"] == planned
    other = idle_client.post(
        "/v1/trainings", json={"arch": "mixer_digits", "dataset_id": ds, "epochs": 2, "seed": 1}
    )
    assert other.json()["training_key"] not in (None, planned)


def test_cli_train_refuses_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.train import parse_sets

    assert parse_sets(["density=0.125", "depth=6", "act=gelu", "sizes=[1, 2]"]) == {
        "density": 0.125,
        "depth": 6,
        "act": "gelu",
        "sizes": [1, 2],
    }
    assert main(["train", "--arch", "sw_mlp_digits", "--set", "density=2"]) == 2
    assert "'density'" in capsys.readouterr().err
    assert main(["train", "--arch", "sw_mlp_digits", "--set", "widthh=3"]) == 2
    assert "unknown option 'widthh'" in capsys.readouterr().err


def test_cli_study_plan_answers_from_a_pilot(capsys: pytest.CaptureFixture[str]) -> None:
    pilot = Path(__file__).resolve().parents[2] / "docs" / "study-sparsity-3seeds.json"
    args = ["study", "plan", "sparsity", "--pilot", str(pilot), "--detect", "0.05"]
    assert main(args) == 0
    out = capsys.readouterr().out
    plan = studies.plan_seeds("sparsity", pilot, detect=0.05)
    rows = [line.split() for line in out.splitlines() if line.startswith(("sw_mlp", "mlp", "rp"))]
    assert len(rows) == 13  # one per difference; its last column the seeds for 0.05
    assert "Floors: the paired image noise of each difference" in out
    assert [int(r[-1]) for r in rows] == [d["power"]["seeds_for_detect"] for d in plan.asked]
    n = plan.seeds
    assert f"{n} seeds, {8 * n} trainings ({8 * (n - 3)} new beyond the pilot's)" in out
    assert f"cka-atlas study run sparsity --seeds {n}" in out
    assert main(["study", "plan", "width", "--pilot", str(pilot)]) == 2
    assert "is not a run of the spec 'width'" in capsys.readouterr().err


def test_model_structure_is_stored_returned_and_filterable(
    client: TestClient, zoo: dict[str, Path]
) -> None:
    mixer, sw, mlp = register(client, zoo, "mixer_digits", "sw_mlp_digits", "mlp_digits")
    m = client.get(f"/v1/models/{mixer}").json()
    # Ω of the Mixer = γ·S·C·(S + C)/2 per block; the SW-MLP of width m = S·C at its default
    # density p = (1/S + 1/C)/2 has γ·p·m² — the same number (Hayase & Karakida).
    omega = int(GAMMA * S * C * (S + C) / 2)
    assert (m["family"], m["omega"], m["S"], m["C"], m["gamma"]) == ("mixer", omega, S, C, GAMMA)
    assert m["effective_width"] == S * C and m["density"] is None
    s = client.get(f"/v1/models/{sw}").json()
    assert s["family"] == "sw_mlp" and s["density"] == MATCHED
    assert s["omega"] == round(GAMMA * MATCHED * (S * C) ** 2) == omega
    d = client.get(f"/v1/models/{mlp}").json()
    assert d["density"] == 1.0 and d["omega"] == round(GAMMA * (S * C) ** 2)
    assert client.get(f"/v1/models/{sw}/sidecar").json()["structure"]["omega"] == omega

    def ids(**params: Any) -> set[int]:
        return {x["id"] for x in client.get("/v1/models", params=params).json()["items"]}

    assert ids(family="sw_mlp") == {sw}
    assert ids(omega_min=omega, omega_max=omega) == {mixer, sw}
    assert ids(omega_min=omega + 1) == {mlp}
    assert ids(density_max=0.5) == {sw}
    page = client.get("/models/" + str(sw)).text
    assert "Density p" in page and "0.04688" in page


# --- studies over REST -------------------------------------------------------------------


def test_study_requests_are_checked_before_queuing(idle_client: TestClient) -> None:
    post = lambda **body: idle_client.post("/v1/studies", json=body)  # noqa: E731
    assert_problem(post(builtin="nope"), 422, "validation_error", "builtin")
    assert_problem(post(builtin="sparsity", spec=TINY), 422, "validation_error")
    assert_problem(post(builtin="sparsity", seeds=0), 422, "validation_error", "seeds")
    assert_problem(
        post(spec={**TINY, "dataset": "/etc/passwd"}), 422, "invalid_study", "spec.dataset"
    )
    timm_arm = {**TINY, "arms": [{"name": "r", "arch": "resnet18"}]}
    assert_problem(post(spec=timm_arm), 422, "invalid_study", "spec.arms.0.arch")
    bad_option = {**TINY, "arms": [{"name": "sw", "arch": "sw_mlp_digits", "options": {"x": 1}}]}
    body = assert_problem(post(spec=bad_option), 422, "invalid_study", "spec")
    assert "'x'" in body["detail"]
    assert_problem(
        post(spec={**TINY, "cka": {"kernel": "poly"}}), 422, "invalid_study", "spec.cka.kernel"
    )
    assert idle_client.get("/v1/studies").json()["total"] == 0


def test_a_spec_arm_names_a_model_of_the_store_by_name_or_id(
    idle_client: TestClient, zoo: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 47: an arm's ``model`` (a stored model's id or name) trains more seeds of that
    model's architecture and options; an unknown one is refused naming where models are."""
    import models

    sparse = models.save(
        models.create("sw_mlp_digits", density=0.125), tmp_path / "sparse.safetensors"
    )
    (mixer,) = register(idle_client, zoo, "mixer_digits")
    assert upload(idle_client, sparse, name="sparse_sw").status_code == 201
    spec = {
        **TINY,
        "reference": {"name": "mixer", "model": mixer},
        "arms": [{"name": "sw", "model": "sparse_sw"}],
    }
    r = idle_client.post("/v1/studies", json={"spec": spec, "quick": True})
    assert r.status_code == 202, r.text
    stored = idle_client.get(r.headers["location"]).json()["spec"]
    assert stored["reference"]["arch"] == "mixer_digits"
    assert (stored["arms"][0]["arch"], stored["arms"][0]["options"]["density"]) == (
        "sw_mlp_digits",
        0.125,
    )
    unknown = {**spec, "arms": [{"name": "sw", "model": "sparse"}]}
    body = assert_problem(
        idle_client.post("/v1/studies", json={"spec": unknown}),
        422,
        "unknown_model",
        "spec.arms.0.model",
    )
    assert body["detail"].startswith("no model is named 'sparse'; GET /v1/models lists")
    both = {**spec, "arms": [{"name": "sw", "model": "sparse_sw", "arch": "sw_mlp_digits"}]}
    assert_problem(
        idle_client.post("/v1/studies", json={"spec": both}),
        422,
        "invalid_study",
        "spec.arms.0.model",
    )


# The built-in study end to end (16 trainings, a 16-model atlas) on PostgreSQL, the GPU host's
# database; the same study through the CLI runs on SQLite below, and each step's rows on both in
# the smaller tests of this file.
@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_builtin_study_through_rest_then_reused(client: TestClient, trainer: FakeTrainer) -> None:
    r = client.post("/v1/studies", json={"builtin": "sparsity", "seeds": 2, "quick": True})
    assert r.status_code == 202, r.text
    url = r.headers["location"]
    done = wait(client, url, timeout=300)
    assert done["status"] == "succeeded", done
    # reference + 5 densities + dense MLP + RP-Mixer, two seeds each
    n = 8 * 2
    assert done["trainings"] == {"total": n, "done": n, "reused": 0, "trained": n}
    assert len(trainer.calls) == n and done["stage"] == "done"
    summary = client.get(f"{url}/summary").json()
    assert [a["name"] for a in summary["arms"]][:2] == [
        "sw_mlp[density=0.015625]",
        f"sw_mlp[density={MATCHED}]",
    ]
    model_ids = {m["model_id"] for m in done["models"]}
    comparison = client.get(f"/v1/comparisons/{done['comparison_id']}").json()
    assert {m["id"] for m in comparison["models"]} == model_ids and len(model_ids) == n
    csv = client.get(f"{url}/results.csv")
    assert csv.headers["content-type"].startswith("text/csv")
    assert csv.text.splitlines()[0].startswith("model,key,arm")
    assert client.get(f"{url}/plot.png").content[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in client.get(f"{url}/plot.svg").content[:500]

    again = client.post("/v1/studies", json={"builtin": "sparsity", "seeds": 2, "quick": True})
    second = wait(client, again.headers["location"], timeout=300)
    assert second["status"] == "succeeded"
    assert second["trainings"] == {"total": n, "done": n, "reused": n, "trained": 0}
    assert len(trainer.calls) == n  # nothing was trained again
    assert second["comparison_id"] == done["comparison_id"]  # the same atlas, by its hash
    listing = client.get("/v1/studies", params={"limit": 1}).json()
    assert listing["total"] == 2 and listing["items"][0]["id"] == second["id"]
    assert_problem(client.get("/v1/studies/999/summary"), 404, "not_found")

    page = client.get(f"/studies/{done['id']}").text  # the study page, server-rendered
    assert (
        f'src="{url}/plot.svg"' in page and f'href="/comparisons/{done["comparison_id"]}"' in page
    )
    assert page.count('<tr data-arm="') == 8
    assert page.count('class="training-device" data-device="cpu"') == 1
    assert f"{summary['devices'][0]['device_name']}, fp32, deterministic): {n} trainings" in page
    assert page.count('<td class="training-state"><span class="pill status-succeeded">') == n
    reused_page = client.get(f"/studies/{second['id']}")  # no training job: all reused
    assert reused_page.status_code == 200
    assert reused_page.text.count('<td class="training-state">reused</td>') == n
    # Differences: 7 arms against the seed-to-seed baseline, 6 against the matched SW-MLP; with
    # two reference seeds the baseline has one pair, too few for an interval.
    assert page.count('<tr data-versus="seed_to_seed"') == 7
    assert page.count(f'<tr data-versus="sw_mlp[density={MATCHED}]"') == 6
    assert page.count("no interval (too few seeds)") == 7
    assert page.count("closer to mixer than sw_mlp[density=") == 6
    assert [d["versus"] for d in summary["differences"]].count("seed_to_seed") == 7
    # What the seeds detect, on every row with an interval; whether more seeds would decide
    # each undecided one (analysis/studies/power.py)
    assert page.count('<td class="num detectable">—</td>') == 7
    assert page.count('<td class="num detectable">') == 13 and summary["power"]["max_seeds"] == 16
    undecided = [d for d in summary["differences"] if d["decision"] == "undecided"]
    assert page.count("data-more-seeds=") == len(undecided) > 0
    assert all(f'href="/models/{i}"' in page for i in model_ids)
    assert "Start a built-in study" in client.get("/studies").text
    # In the comparisons list the atlas is marked as the study's, with a link to it.
    home = client.get("/").text
    badge = re.search(r'class="pill study-badge" href="/studies/(\d+)"[^>]*>study ([^<]+)<', home)
    assert badge and int(badge[1]) in (done["id"], second["id"]) and badge[2] == "sparsity"
    form = client.get("/trainings/new").text
    assert 'name="config.density"' in form and 'name="config.num_blocks"' in form


@pytest.fixture
def services(settings: Settings) -> Iterator[Services]:
    """The services of a store with its schema and built-in datasets, and no worker: the
    test runs the jobs in its own thread (:func:`_drain`)."""
    from app.store.datasets import register_builtin_datasets
    from app.store.db import ensure_schema

    made = Services(settings)
    ensure_schema(made.db.engine)
    register_builtin_datasets(made)
    yield made
    made.close()


def _drain(services: Services, worker: str, stop: threading.Event | None = None) -> None:
    """Run queued jobs in this thread, as one worker would, until none is left (or ``stop``)."""
    stop = stop or threading.Event()
    while not stop.is_set() and execute(services, worker, shutdown=stop) is not None:
        pass


def test_study_trainings_are_jobs_cancel_cascades_and_a_new_run_resumes(
    settings: Settings, trainer: FakeTrainer
) -> None:
    from app.jobs.requests import StudyIn
    from app.jobs.studies import submit_study
    from app.store.datasets import register_builtin_datasets
    from app.store.db import ensure_schema
    from app.store.orm import Job, JobState, Study

    services = Services(settings)
    ensure_schema(services.db.engine)
    register_builtin_datasets(services)
    try:
        body = StudyIn(spec=TINY, quick=True)
        queued_id, queued_job = submit_study(services, body, dispatch=False)
        with services.db.session() as s:
            request_cancel(s, queued_job)  # a queued study is cancelled at once
        study_id, job_id = submit_study(services, body, dispatch=False)

        # One worker runs the study (it queues its 6 trainings and parks), then two of them.
        stop = threading.Event()
        trainer.after = lambda calls: stop.set() if calls == 2 else None
        _drain(services, "w1", stop)
        with services.db.session(readonly=True) as s:
            st = s.get(Study, study_id)
            assert st is not None and st.job.status == JobState.RUNNING and st.stage == "trainings"
            children = list(s.scalars(select(Job).where(Job.parent_id == job_id).order_by(Job.id)))
            assert [c.kind for c in children] == ["training"] * 6
            assert [c.status for c in children] == [JobState.SUCCEEDED] * 2 + [JobState.QUEUED] * 4
            # queued longest first: the four SW-MLPs (4.2 M weights, dense under their masks),
            # then the two Mixers (22 k), each in the plan's order
            assert [c.detail["position"] for c in children] == [2, 3, 4, 5, 0, 1]
            assert children[0].detail["worker"] == "w1" and children[0].detail["seconds"] >= 0
            assert sum(m.model_id is not None for m in st.members) == 2
            # progress: trainings done of n, the atlas being the (n + 1)-th part
            assert st.job.progress == pytest.approx(2 / 7)
            cancelled = s.get(Study, queued_id)
            assert cancelled is not None and cancelled.job.status == JobState.CANCELLED

        with services.db.session() as s:  # the cancel reaches every queued training at once
            request_cancel(s, job_id)
        with services.db.session(readonly=True) as s:
            stmt = select(Job.status).where(Job.parent_id == job_id).order_by(Job.id)
            states = s.scalars(stmt).all()
            assert states == [JobState.SUCCEEDED] * 2 + [JobState.CANCELLED] * 4
            assert s.get(Job, job_id).status == JobState.CANCELLED  # type: ignore[union-attr]
        _drain(services, "w1")
        assert len(trainer.calls) == 2

        # Started again, the study finds the two finished trainings by their keys.
        again_id, _ = submit_study(services, body)
        _drain(services, "w2")
        with services.db.session(readonly=True) as s:
            st = s.get(Study, again_id)
            assert st is not None and st.job.status == JobState.SUCCEEDED, st.job.error
            # the two trained first (positions 2 and 3, the first SW-MLP point) are reused
            assert [m.reused for m in st.members] == [False, False, True, True, False, False]
            assert st.job.progress == 1.0 and st.stage == "done"
            kinds = s.scalars(select(Job.kind).where(Job.parent_id == st.job_id)).all()
            assert sorted(kinds) == ["comparison"] + ["training"] * 4  # the atlas is a child too
        assert len(trainer.calls) == 6  # 3 entries × 2 seeds, each trained once
    finally:
        services.close()


def test_two_studies_share_trainings_and_one_is_cancelled_midway(
    services: Services, trainer: FakeTrainer
) -> None:
    """Not tried before (issue 48): studies A and B of one spec, both queued before either
    trains, so each queues its own six trainings of the same six keys (and would share one
    atlas). A is cancelled from inside its third training. A ends cancelled with every one of
    its children ended (that training cancelled too, though it came back after the cancel);
    B carries on alone: it reuses by key what A trained, trains only the rest, and succeeds
    with six models, one per key; no job is left queued or running."""
    from app.jobs.requests import StudyIn
    from app.jobs.studies import submit_study
    from app.store.orm import Job, JobState, Model, Study

    body = StudyIn(spec=TINY, quick=True)
    a_id, a_job = submit_study(services, body, dispatch=False)
    b_id, b_job = submit_study(services, body, dispatch=False)
    assert a_id != b_id

    def cancel_a(calls: int) -> None:
        if calls == 3:  # inside A's third training, before it registers its model
            with services.db.session() as s:
                request_cancel(s, a_job)

    trainer.after = cancel_a
    _drain(services, "w1")
    with services.db.session(readonly=True) as s:
        a, b = s.get(Study, a_id), s.get(Study, b_id)
        assert a is not None and b is not None
        assert a.job.status == JobState.CANCELLED, (a.job.status, a.job.error)
        assert b.job.status == JobState.SUCCEEDED, (b.job.status, b.job.error)
        a_children = s.scalars(select(Job).where(Job.parent_id == a_job)).all()
        assert {c.status for c in a_children} <= {JobState.SUCCEEDED, JobState.CANCELLED}
        assert [c.status for c in a_children].count(JobState.SUCCEEDED) == 2, [
            (c.id, c.status) for c in a_children
        ]
        b_children = s.scalars(select(Job).where(Job.parent_id == b_job)).all()
        assert all(c.status == JobState.SUCCEEDED for c in b_children)
        live = s.scalars(select(Job.id).where(Job.status.in_(["queued", "running"]))).all()
        assert live == [], live
        keys = s.scalars(select(Model.training_key).where(Model.training_key.is_not(None)))
        keys = list(keys)
        assert len(keys) == len(set(keys)) == 6  # one model per key
        assert all(m.model_id is not None for m in b.members) and len(b.members) == 6
        assert b.summary is not None
    # Each key trained once — A's third training was cancelled once it had trained: its
    # model is registered (B reuses it) unless its heartbeat saw the cancel between the
    # training and the registration, and then B trains that key again: 6 calls or 7.
    assert len({(arch, seed, str(o)) for arch, seed, o in trainer.calls}) == 6
    assert len(trainer.calls) in (6, 7)


def test_two_identical_studies_share_one_atlas_on_one_worker_and_survive_a_cancel(
    services: Services, trainer: FakeTrainer, deadline: Deadline
) -> None:
    """Studies A and B of one spec on a single worker (the laptop's default, one thread): A
    queues the atlas, B finds it (one request) and waits for it. B used to wait by polling
    on the only worker, so the atlas never ran and both hung until their time limit. B now
    waits parked (``waits_for``) and is woken when the atlas ends. Here A is cancelled while
    both wait: the atlas, which B still holds, is detached from A and runs for B, which
    succeeds with it; A ends cancelled; nothing is left queued or running."""
    from app.jobs.parking import PARKED
    from app.jobs.requests import StudyIn
    from app.jobs.studies import submit_study
    from app.store.orm import Job, JobState, Study

    body = StudyIn(spec=TINY, quick=True)
    a_id, a_job = submit_study(services, body, dispatch=False)
    b_id, b_job = submit_study(services, body, dispatch=False)
    stop = threading.Event()

    def both_wait_for_the_atlas() -> bool:
        with services.db.session(readonly=True) as s:
            atlas = s.scalars(select(Job).where(Job.kind == "comparison")).all()
            b = s.get(Job, b_job)
            parked = b is not None and b.worker_id == PARKED
            return len(atlas) == 1 and parked and "waits_for" in (b.detail or {})  # type: ignore[union-attr]

    def work(until: Any = lambda: False) -> None:
        while not stop.is_set() and not until():
            if execute(services, "w1", shutdown=stop) is None:
                return

    try:
        first = threading.Thread(target=work, args=(both_wait_for_the_atlas,), daemon=True)
        first.start()
        first.join(deadline.left())
        assert not first.is_alive(), "the only worker is still busy: a study holds it waiting"
        assert both_wait_for_the_atlas()
        with services.db.session(readonly=True) as s:
            atlas = s.scalars(select(Job).where(Job.kind == "comparison")).one()
            assert atlas.status == JobState.QUEUED and atlas.parent_id == a_job
            b_detail = s.get(Job, b_job).detail  # type: ignore[union-attr]
            assert b_detail["waits_for"] == [atlas.id], b_detail
        with services.db.session() as s:
            request_cancel(s, a_job)
        rest = threading.Thread(target=work, daemon=True)
        rest.start()
        rest.join(deadline.left())
        assert not rest.is_alive(), "the worker did not end the atlas and study B"
        with services.db.session(readonly=True) as s:
            a, b = s.get(Study, a_id), s.get(Study, b_id)
            assert a is not None and b is not None
            assert a.job.status == JobState.CANCELLED, (a.job.status, a.job.error)
            assert b.job.status == JobState.SUCCEEDED, (b.job.status, b.job.error)
            atlas = s.get(Job, atlas.id)
            assert atlas is not None and atlas.status == JobState.SUCCEEDED
            assert b.comparison_id is not None and b.summary is not None
            live = s.scalars(select(Job.id).where(Job.status.in_(["queued", "running"]))).all()
            assert live == [], live
        assert len(trainer.calls) == 6  # B reused every training of A's by its key
    finally:
        stop.set()  # a worker left waiting gives its job back and returns


# --- the CLI -------------------------------------------------------------------------------


def _diagonal_mean(atlas: Any, a: str, b: str) -> float:
    return float(np.mean(np.diagonal(atlas.matrix(a, b))))


# SQLite, the laptop's database; PostgreSQL runs the same study through REST above.
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_study_run_writes_summary_and_reuses(
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    trainer: FakeTrainer,
) -> None:
    monkeypatch.setenv("CKA_DATABASE_URL", db_url)
    monkeypatch.setenv("CKA_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CKA_DEVICE", "cpu")
    out = tmp_path / "D"
    argv = ["study", "run", "sparsity", "--seeds", "2", "--quick", "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    first = capsys.readouterr().out
    assert "16 trainings, 0 reused" in first and len(trainer.calls) == 16
    assert {p.name for p in out.iterdir()} == {
        "summary.json",
        "results.csv",
        "plot.png",
        "plot.svg",
    }
    summary = json.loads((out / "summary.json").read_text())
    assert summary["study"] == "sparsity" and summary["dataset"]["name"] == "digits"
    ref = summary["reference"]
    assert ref["arch"] == "mixer_digits" and ref["omega"] == GAMMA * S * C * (S + C) / 2
    assert ref["config"]["patch_size"] == 2
    matched = next(a for a in summary["arms"] if a["name"] == f"sw_mlp[density={MATCHED}]")
    assert matched["config"]["density"] == (1 / ref["S"] + 1 / ref["C"]) / 2 == 0.046875
    for arm in summary["arms"]:
        assert {"name", "family", "arch", "config", "omega", "effective_width", "seeds"} <= set(arm)
        assert set(arm["accuracy"]) >= {"mean", "ci"} and len(arm["accuracy"]["ci"]) == 2
        assert set(arm["cka_diagonal"]) >= {"mean", "ci", "per_layer"}
        assert arm["seeds"] == [0, 1]
    assert set(summary["baselines"]["seed_to_seed"]) >= {"mean", "ci"}
    # Every training ran on the worker's device (CKA_DEVICE), as its checkpoint records.
    assert trainer.devices == ["cpu"] * 16
    [where] = summary["devices"]
    assert where["device"] == "cpu" and where["precision"] == "fp32" and where["trainings"] == 16
    assert where["deterministic"] is True and where["device_name"]

    # The numbers, from the stored models and atlas by the formulas of issue 12 §4.
    accs = [fake_accuracy("sw_mlp_digits", {"density": MATCHED}, seed) for seed in (0, 1)]
    assert matched["accuracy"]["mean"] == pytest.approx(np.mean(accs))
    services = Services(Settings())
    try:
        with services.db.session(readonly=True) as s:
            cmp = s.get(Comparison, summary["comparison_id"])
            assert cmp is not None and cmp.result is not None
            atlas = analysis.Atlas.from_dict(cmp.result)
            label = {m.model_id: m.label for m in cmp.members}
    finally:
        services.close()
    refs = [label[i] for i in ref["model_ids"]]
    arms = [label[i] for i in matched["model_ids"]]
    pairs = [_diagonal_mean(atlas, r, a) for r in refs for a in arms]
    assert matched["cka_diagonal"]["mean"] == pytest.approx(np.mean(pairs))
    baseline = _diagonal_mean(atlas, refs[0], refs[1])
    assert summary["baselines"]["seed_to_seed"]["mean"] == pytest.approx(baseline)

    assert main(argv) == 0  # with progress bars this time
    captured = capsys.readouterr()
    assert "16 trainings, 16 reused" in captured.out and len(trainer.calls) == 16
    assert "trainings" in captured.err and "atlas" in captured.err  # the two tqdm bars
    assert main(["study", "list"]) == 0
    listing = capsys.readouterr().out
    assert listing.count("sparsity") == 2 and "16/16" in listing


# --- every job cancellable and bounded in time (issue 26) -----------------------------------


class SlowTrainer:
    """A training of many short steps that asks ``on_step`` after each, as the real one does;
    it records every step, and never finishes within a test."""

    TOTAL = 100_000  # steps: its end is never reached unless ``on_step`` is ignored

    def __init__(self) -> None:
        self.steps = 0
        self.stopped = False

    def __call__(self, arch: str, dataset: Any = "digits", **kwargs: Any) -> Path:
        on_step = kwargs.get("on_step")
        total = self.TOTAL
        for i in range(total):
            self.steps += 1
            if on_step is not None and not on_step(i, total):
                self.stopped = True
                raise TrainingCancelled("stopped by its callback")
            time.sleep(0.005)
        raise AssertionError("the slow training ran to its end")


def test_a_running_study_cancels_within_one_training_step(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = SlowTrainer()
    monkeypatch.setattr("app.jobs.study.train", slow)
    r = client.post("/v1/studies", json={"spec": TINY, "quick": True})
    url = r.headers["location"]
    deadline = time.monotonic() + 60
    while slow.steps < 5:
        assert time.monotonic() < deadline, "the study's first training never started"
        time.sleep(0.01)
    running = [m for m in client.get(url).json()["models"] if m["status"] == "running"]
    assert len(running) == 1 and running[0]["worker"].startswith("embedded"), running
    assert client.post(f"{url}/cancel").status_code == 200
    done = wait(client, url, timeout=30)  # a give-up limit, not a bound
    assert done["status"] == "cancelled", done
    # The flag reaches the training with its next heartbeat; the training stops at the step
    # after that, through its callback, long before its last step.
    assert slow.stopped and slow.steps < SlowTrainer.TOTAL
    trainings = client.get("/v1/jobs", params={"parent_id": done["job_id"]}).json()["items"]
    assert {j["status"] for j in trainings} == {"cancelled"}


def test_the_embedded_worker_stops_a_job_past_its_time_limit(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = SlowTrainer()
    monkeypatch.setattr("app.jobs.study.train", slow)
    with TestClient(create_app(settings.model_copy(update={"job_timeout_s": 1}))) as client:
        r = client.post("/v1/studies", json={"spec": TINY, "quick": True})
        done = wait(client, r.headers["location"], timeout=60)  # a give-up limit
        # Failed for its time limit (not for the slow training's end, which it never reaches).
        assert done["status"] == "failed", done
        assert "CKA_JOB_TIMEOUT_S (1 s)" in done["error"], done
        trainings = client.get("/v1/jobs", params={"parent_id": done["job_id"]}).json()["items"]
        first = next(j for j in trainings if j["detail"]["position"] == 0)
        assert first["status"] == "failed" and first["error_code"] == "job_timeout"
        assert slow.stopped


def test_sigterm_stops_the_server_while_a_study_trains_and_requeues_the_training(
    db_url: str, tmp_path: Path
) -> None:
    """``cka-atlas serve`` with its embedded worker, a real training running: SIGTERM ends the
    process (it exits by itself, not killed), and the training goes back to the queue."""
    from app.jobs.parking import PARKED
    from app.store.db import Database
    from app.store.orm import Job, JobState
    from tests.app.fault_tools import Proc, poll, service_env, wait_serving
    from tests.servers import free_port

    port = free_port()
    env = service_env(db_url, tmp_path / "data", CKA_WORKER_THREADS="1")
    server = Proc(["serve", "--port", str(port)], env, tmp_path / "serve.log")
    db = Database(db_url)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            wait_serving(http, server)
            # the full recipe (30 epochs for the Mixer): each training takes a while
            full = {k: v for k, v in TINY.items() if k != "quick"}
            r = http.post("/v1/studies", json={"spec": full})
            assert r.status_code == 202, r.text

            def working() -> list[int]:  # jobs a worker runs (a parked study is nobody's)
                with db.session(readonly=True) as s:
                    stmt = select(Job.id).where(
                        Job.status == JobState.RUNNING, Job.worker_id != PARKED
                    )
                    return list(s.scalars(stmt))

            poll(working, 120, "the study started", (server,))
            time.sleep(3)  # well into its first training (each takes tens of seconds)
            busy = working()
        # The process exits on its own after SIGTERM (stop() would SIGKILL it after 30 s,
        # a give-up limit, and the code would say so) ...
        code = server.stop(signal.SIGTERM, timeout=30)
        assert code in (0, -signal.SIGTERM), server.output()
        # ... its training stopped and went back to the queue.
        assert working() == [], server.output()
        with db.session(readonly=True) as s:
            states = s.scalars(select(Job.status).where(Job.id.in_(busy))).all()
            assert states == [JobState.QUEUED], server.output()
    finally:
        server.stop(signal.SIGKILL, timeout=5)
        db.dispose()


# Two summaries compared, not the database's rows (shards run on both in test_shards.py).
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_study_atlas_is_sharded_as_configured_with_the_same_summary(
    settings: Settings, tmp_path: Path, trainer: FakeTrainer
) -> None:
    """With ``CKA_SHARD_BATCHES = 1`` the study's atlas (3 batches) runs as 3 shards; the
    summary equals that of the same study with its atlas in one piece, to 1e-12."""
    from app.jobs.requests import StudyIn
    from app.jobs.studies import submit_study
    from app.store.datasets import register_builtin_datasets
    from app.store.db import ensure_schema
    from app.store.orm import Job, JobState, Study
    from tests.helpers import assert_same_numbers, make_settings

    def run(config: Settings) -> tuple[dict[str, Any], list[Job]]:
        services = Services(config)
        ensure_schema(services.db.engine)
        register_builtin_datasets(services)
        try:
            study_id, job_id = submit_study(services, StudyIn(spec=TINY, quick=True))
            _drain(services, "w1")
            with services.db.session(readonly=True) as s:
                st = s.get(Study, study_id)
                assert st is not None and st.job.status == JobState.SUCCEEDED, st.job.error
                atlas = s.scalars(
                    select(Job).where(Job.parent_id == job_id, Job.kind == "comparison")
                ).one()
                shards = list(s.scalars(select(Job).where(Job.parent_id == atlas.id)))
                return dict(st.summary or {}), shards
        finally:
            services.close()

    sharded, shards = run(settings.model_copy(update={"shard_batches": 1}))
    assert len(shards) == 3 and {j.status for j in shards} == {JobState.SUCCEEDED}
    one_piece = make_settings(f"sqlite:///{tmp_path / 'one.db'}", tmp_path / "one")
    whole, none = run(one_piece)
    assert none == []
    ignore = ("comparison_id", "model_ids")
    assert_same_numbers(whole, sharded, tol=1e-12, ignore=ignore)
