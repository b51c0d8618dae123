"""The service stores what the library computes: q-values and verdicts; progress counts every
phase.

One comparison with both baselines runs through the service (SQLite, the embedded worker) while
every progress value its job reports is recorded; the same comparison is then run with
``analysis.compare`` in this process, its siblings given as the store gives them, and the two
are set side by side: q-values and verdicts cell for cell, in the matrix payload, the cell
table and the page.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

import analysis
import models
from app.http.main import create_app
from app.jobs.control import JobControl
from app.store.cells import Cells
from tests.files import digits_npz, seed_checkpoints
from tests.helpers import make_settings, upload, wait

N, BATCH, DRAWS = 64, 32, 2


@dataclass
class Run:
    client: TestClient
    url: str
    body: dict[str, Any]
    progress: list[float]
    data_path: Path
    checkpoints: dict[str, Path]
    shas: dict[str, str]
    plain_url: str


def _array(rows: list[list[Any]] | None) -> np.ndarray:
    assert rows is not None
    return np.array([[np.nan if v is None else v for v in r] for r in rows], dtype=float)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("verdicts")
    data_path = digits_npz(root, N)
    mixers = seed_checkpoints(root, "mixer_digits", (1, 2), "mixer_s{}")
    gmlp = models.save(models.create("gmlp_digits", seed=5), root / "gmlp_digits.safetensors")
    checkpoints = {"mixer_s1": mixers[1], "mixer_s2": mixers[2], "gmlp_digits": gmlp}
    progress: list[float] = []
    on_batch = JobControl.on_batch

    def recorded(self: JobControl, done: int, total: int) -> bool:
        go = on_batch(self, done, total)
        progress.append(self.progress)
        return go

    settings = make_settings(f"sqlite:///{root / 'cka.db'}", root / "data")
    with pytest.MonkeyPatch.context() as mp, TestClient(create_app(settings)) as client:
        mp.setattr(JobControl, "on_batch", recorded)
        ids = {
            name: upload(client, path, name=name).json()["id"] for name, path in checkpoints.items()
        }
        shas = {m["name"]: m["sha256"] for m in client.get("/v1/models").json()["items"]}
        r = client.post("/v1/datasets", files={"file": (data_path.name, data_path.read_bytes())})
        dataset = r.json()["id"]
        members = [ids["mixer_s1"], ids["gmlp_digits"]]
        body = {"model_ids": members, "dataset_id": dataset, "batch_size": BATCH, "seed": 3}
        body |= {"baselines": ["random_init", "seed_ceiling"], "random_init_draws": DRAWS}
        r = client.post("/v1/comparisons", json=body)
        assert r.status_code == 202, r.text
        done = wait(client, r.headers["location"], timeout=300)
        assert done["status"] == "succeeded", done
        recorded_run = list(progress)
        plain = client.post(
            "/v1/comparisons", json={"model_ids": members, "dataset_id": dataset, "batch_size": 32}
        )
        assert wait(client, plain.headers["location"])["status"] == "succeeded"
        yield Run(
            client,
            r.headers["location"],
            done,
            recorded_run,
            data_path,
            checkpoints,
            shas,
            plain.headers["location"],
        )


@pytest.fixture(scope="module")
def library(run: Run) -> analysis.Atlas:
    """The same comparison through the library: members, the store's sibling, the same keys."""
    nets = {name: models.load(path)[0] for name, path in run.checkpoints.items()}
    return analysis.compare(
        {"mixer_s1": nets["mixer_s1"], "gmlp_digits": nets["gmlp_digits"]},
        analysis.load_dataset(run.data_path),
        batch_size=BATCH,
        seed=3,
        baselines=("random_init", "seed_ceiling"),
        random_init_draws=DRAWS,
        siblings={"mixer_s2": nets["mixer_s2"]},
        model_keys=run.shas,
        device="cpu",
    )


PAIRS = [("mixer_s1", "gmlp_digits"), ("mixer_s1", "mixer_s1"), ("gmlp_digits", "gmlp_digits")]


def test_the_service_q_values_and_verdicts_are_the_librarys(
    run: Run, library: analysis.Atlas
) -> None:
    stored = run.client.get(f"{run.url}/result").json()["atlas"]
    assert stored["verdicts"]["margin"] == 0.05 and "q_value" in stored
    for a, b in [*PAIRS, ("gmlp_digits", "mixer_s1")]:
        m = run.client.get(f"{run.url}/matrix", params={"a": a, "b": b}).json()
        q = library.q_values(a, b)
        assert q is not None
        np.testing.assert_allclose(_array(m["q_value"]), q, rtol=1e-6, err_msg=f"{a} × {b}")
        verdicts = library.verdicts(a, b)
        assert verdicts is not None
        for key in ("learned", "learned_low", "learned_high", "seed_gap"):
            if key in verdicts:
                np.testing.assert_allclose(
                    _array(m["verdicts"][key]), verdicts[key], atol=1e-6, err_msg=key
                )
        for key in ("learned_verdict", "seed_verdict"):
            assert m["verdicts"][key] == verdicts[key].tolist(), (a, b, key)
        # the image terms paired, as the library's: the twins and the sibling saw its images
        assert (
            m["verdict_images"]
            == library.verdict_images()
            == {
                "learned": "paired",
                "seed": "paired",
            }
        )
    assert stored["verdicts"]["verdict_images"] == {"learned": "paired", "seed": "paired"}
    # the learned part exists wherever the twins do, but for a layer with itself (no question);
    # the seed verdict where a sibling does
    m = run.client.get(f"{run.url}/matrix", params={"a": "gmlp_digits", "b": "gmlp_digits"})
    assert all(v is None for row in m.json()["verdicts"]["seed_verdict"] for v in row)
    own = m.json()["verdicts"]["learned_verdict"]
    assert all((v is None) == (i == j) for i, row in enumerate(own) for j, v in enumerate(row))
    # a result stored before verdicts (and their paired image terms) were: derived, summed
    before = {k: v for k, v in stored.items() if k != "verdicts"}
    before["baselines"] = {
        name: {k: v for k, v in baseline.items() if k != "image_var"}
        for name, baseline in stored["baselines"].items()
    }
    assert Cells(before).verdict_images == {"learned": "summed", "seed": "summed"}


def test_the_cell_table_and_the_page_carry_the_verdicts(run: Run) -> None:
    table = pd.read_csv(io.BytesIO(run.client.get(f"{run.url}/cells.csv").content))
    assert list(table.columns[-8:]) == [
        "learned",
        "learned_low",
        "learned_high",
        "learned_verdict",
        "seed_gap",
        "seed_gap_low",
        "seed_gap_high",
        "seed_verdict",
    ]
    m = run.client.get(f"{run.url}/matrix", params={"a": "mixer_s1", "b": "gmlp_digits"}).json()
    part = table[(table.model_a == "mixer_s1") & (table.model_b == "gmlp_digits")]
    flat = [v for row in m["verdicts"]["learned_verdict"] for v in row]
    assert part.learned_verdict.tolist() == flat
    np.testing.assert_allclose(
        part.seed_gap.to_numpy().reshape(np.shape(m["values"])), _array(m["verdicts"]["seed_gap"])
    )
    parquet = pd.read_parquet(io.BytesIO(run.client.get(f"{run.url}/cells.parquet").content))

    def words(column: pd.Series) -> list[str | None]:
        return [v if isinstance(v, str) else None for v in column.tolist()]

    assert words(parquet.seed_verdict) == words(table.seed_verdict)
    assert words(parquet.learned_verdict) == words(table.learned_verdict)
    assert {"above_untrained", "not_above_untrained", "undecided"} >= set(
        filter(None, words(table.learned_verdict))
    )
    # the glance table: one line per pair (value and marks), the missing ceiling said once
    page = run.client.get(f"/comparisons/{run.body['id']}").text
    start = page.index('data-a="mixer_s1" data-b="gmlp_digits"')
    cell = page[start : page.index("</button>", start)]
    summary = run.client.get(f"{run.url}/result").json()["summary"][0][1]
    counts = summary["learned_verdicts"]
    marks = {"above_untrained": "▲", "not_above_untrained": "▽", "undecided": "?"}
    for verdict, n in counts.items():
        assert f"{marks[verdict]}{n}" in cell
        assert sum(counts.values()) == len(np.diagonal(_array(m["values"])))
    assert page.count("no seed ceiling: add a third seed") == 1


def test_a_heatmap_coloured_by_what_training_added(run: Run) -> None:
    cka = run.client.get(f"{run.url}/heatmap.png")
    learned = run.client.get(f"{run.url}/heatmap.png", params={"colour": "learned"})
    assert learned.status_code == 200 and learned.content.startswith(b"\x89PNG")
    assert learned.content != cka.content and learned.headers["etag"] != cka.headers["etag"]
    r = run.client.get(f"{run.plain_url}/heatmap.png", params={"colour": "learned"})
    assert r.status_code == 422 and r.json()["code"] == "needs_random_init"


def test_progress_reaches_one_only_at_the_end(run: Run) -> None:
    """Progress counts the baselines' work: the comparison's own batches are its first part,
    the twins' and the siblings' the rest; the last batch of the last stops one unit short, and
    1 comes only once the result is complete."""
    values = run.progress
    batches = N // BATCH
    # phases: the 2 members, then DRAWS draws of 2 twins of each, then the ceiling's stand-ins;
    # then the one report of the finished result
    assert len(values) == batches * (1 + DRAWS + 1) + 1, values
    assert values[-2] < 1.0
    assert values == sorted(values)
    members, twins = 2, DRAWS * 2 * 2
    stand_ins = round(members / values[batches - 1]) - members - twins
    assert stand_ins == 3  # the sibling of mixer_s1, mixer_s1 and gmlp_digits
    assert values[-1] == 1.0 and max(values[:-1]) < 1.0
    whole = members + twins + stand_ins
    assert values[batches * (1 + DRAWS) - 1] == pytest.approx((members + twins) / whole)
    final = run.client.get(run.url).json()
    assert final["status"] == "succeeded" and final["progress"] == 1.0
