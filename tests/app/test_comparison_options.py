"""The comparisons list shows the options that differ from the defaults and filters by them
(REST and the web page), on SQLite and PostgreSQL; docs/rest.md names every request field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import update

from app.jobs.requests import ComparisonIn
from app.store.orm import Comparison
from tests.app.payloads import assert_problem
from tests.helpers import digits_id, register

ROOT = Path(__file__).resolve().parents[2]

# Each request's options beyond the pair and the dataset, and what the list must show of them
# (written out here: a default that depends on others — null in full mode, with permutations —
# is not shown).
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "plain": ({}, {}),
    "tokens": ({"feature": "mean_tokens"}, {"feature": "mean_tokens"}),
    "company": (
        {"bootstrap": 20, "baselines": ["seed_ceiling", "random_init"], "random_init_draws": 2},
        # the deprecated bootstrap: N is read as resamples N (baselines turn the interval on),
        # which image intervals do not use, so it is not shown (issue 47: the demo's 200)
        {"random_init_draws": 2, "baselines": ["random_init", "seed_ceiling"]},
    ),
    "full": ({"mode": "full", "estimator": "biased"}, {"estimator": "biased", "mode": "full"}),
    "shuffled": ({"permutations": 50}, {"permutations": 50}),
    "glob": (
        {"layers": "blocks.*", "kernel": "rbf:0.5"},
        {"layers": "blocks.*", "kernel": "rbf:0.5"},
    ),
    "listed": (
        {"layers": ["blocks.0", "norm"], "null": "none"},
        {"layers": ["blocks.0", "norm"], "null": "none"},
    ),
    "three": ({"random_init_draws": 5, "sensitivity": True}, {"sensitivity": True}),  # no baseline
}


def _ids(c: TestClient, *filters: str) -> set[int]:
    r = c.get("/v1/comparisons", params=[("option", f) for f in filters] + [("limit", "100")])
    assert r.status_code == 200, r.text
    return {item["id"] for item in r.json()["items"]}


def test_the_list_shows_and_filters_the_options_that_differ(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    c = idle_client
    pair = {
        "model_ids": register(c, zoo, "mixer_digits", "sw_mlp_digits"),
        "dataset_id": digits_id(c),
    }
    ids = {}
    for name, (body, _) in CASES.items():
        r = c.post("/v1/comparisons", json=pair | {"batch_size": 150} | body)
        assert r.status_code == 202, r.text
        ids[name] = r.json()["id"]
    listed = {i["id"]: i["options"] for i in c.get("/v1/comparisons?limit=100").json()["items"]}
    assert listed == {ids[n]: shown | {"batch_size": 150} for n, (_, shown) in CASES.items()}
    assert c.get(f"/v1/comparisons/{ids['tokens']}").json()["options"]["feature"] == "mean_tokens"

    # A comparison stored before `feature` existed counts as the default, flatten.
    services = c.app.state.services  # type: ignore[attr-defined]
    with services.db.session() as s:
        row = s.get(Comparison, ids["plain"])
        params = {k: v for k, v in row.params.items() if k != "feature"}
        s.execute(update(Comparison).where(Comparison.id == row.id).values(params=params))
    assert _ids(c, "feature=mean_tokens") == {ids["tokens"]}
    assert _ids(c, "feature=flatten") == set(ids.values()) - {ids["tokens"]}
    assert _ids(c, "baselines=random_init") == {ids["company"]}
    assert _ids(c, "estimator=biased", "mode=full") == {ids["full"]}
    assert _ids(c, "estimator=biased", "mode=minibatch") == set()
    assert _ids(c, "null=permutation") == {ids["shuffled"]}
    assert _ids(c, "permutations=50") == {ids["shuffled"]}
    assert _ids(c, "layers=blocks.0") == {ids["listed"]}
    assert _ids(c, "layers=blocks.*") == {ids["glob"]}
    assert _ids(c, "sensitivity=true") == {ids["three"]}
    assert _ids(c, "kernel=rbf:0.5") == {ids["glob"]}
    for bad, needle in (
        ("feature=nope", "feature is one of flatten, mean_tokens, cls"),
        ("nope=1", "NAME one of layers, kernel"),
        ("resamples=many", "resamples is an integer"),
        ("bootstrap=20", "NAME one of"),  # deprecated: read into interval and resamples
        ("feature", "NAME=VALUE"),
    ):
        r = c.get("/v1/comparisons", params={"option": bad})
        assert needle in assert_problem(r, 422, "validation_error", "option")["detail"]

    page = c.get("/").text
    assert "<code>feature=mean_tokens</code>" in page
    assert "<code>baselines=random_init,seed_ceiling</code>" in page
    assert "option=baselines%3Drandom_init%20baselines%3Dseed_ceiling" in page
    filtered = c.get("/", params={"option": "feature=mean_tokens"}).text
    shown = set(map(int, re.findall(r'data-comparison-id="(\d+)"', filtered)))
    assert shown == {ids["tokens"]}
    both = c.get("/", params={"option": "estimator=biased  mode=full"}).text
    assert set(map(int, re.findall(r'data-comparison-id="(\d+)"', both))) == {ids["full"]}
    refused = c.get("/", params={"option": "feature=nope"}).text
    assert 'id="option-refused"' in refused and "feature is one of" in refused


def test_rest_md_names_every_upload_and_comparison_field() -> None:
    text = (ROOT / "docs" / "rest.md").read_text(encoding="utf-8")
    fields = set(ComparisonIn.model_fields)
    fields |= {"weights", "sidecar", "timm_name", "config", "hub", "name"}  # POST /v1/models
    missing = sorted(f for f in fields if f"| `{f}`" not in text)
    assert missing == [], f"docs/rest.md has no table row for {missing}"


def test_rbf_bandwidths_beyond_the_documented_range_are_refused_at_the_door(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    """``rbf:1e308`` (an OverflowError in the job), ``rbf:1e-320`` and ``rbf:1e-30`` (every
    cell NaN) were accepted and failed or emptied their job; now the request is 422 naming the
    field, with the range, and nothing is queued. The ends of the range are accepted."""
    c = idle_client
    pair = {"model_ids": register(c, zoo, "mixer_digits"), "dataset_id": digits_id(c)}
    for kernel in ("rbf:1e308", "rbf:1e-320", "rbf:1e-30", "rbf:0.09", "rbf:10.5", "rbf:nan"):
        body = assert_problem(
            c.post("/v1/comparisons", json={**pair, "kernel": kernel}),
            422,
            "invalid_kernel",
            "kernel",
        )
        assert body["detail"].startswith("kernel: ") and "from 0.1 to 10" in body["detail"], body
    assert c.get("/v1/comparisons").json()["total"] == 0
    for t in ("0.1", "10"):  # the documented range's ends
        r = c.post("/v1/comparisons", json={**pair, "kernel": f"rbf:{t}"})
        assert r.status_code == 202, r.text
    # the same bounds in a study's identification test (its measures' RBF bandwidths)
    spec = {
        "name": "ident",
        "seeds": 2,
        "reference": {"name": "mlp", "arch": "mlp_digits"},
        "identification": {"rbf": [0.2, 1e-30]},
    }
    body = assert_problem(c.post("/v1/studies", json={"spec": spec}), 422, "invalid_study", "spec")
    assert "identification.rbf.1" in body["detail"] and "0.1" in body["detail"], body
    recipe = {**spec, "identification": {}, "recipe": {"weight_decay": 1e308}}
    body = assert_problem(c.post("/v1/studies", json={"spec": recipe}), 422, "invalid_study")
    assert "recipe.weight_decay" in body["detail"], body
