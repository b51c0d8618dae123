"""A comparison request's options come from CompareOptions: REST reads every one (interval,
resamples, dtype, seed, the deprecated bootstrap), a request means what it meant before (its
hash), and a model that cannot give the asked-for feature is refused before anything is queued.

The digests below were computed by the code before ``interval`` became the switch and
``resamples`` its count (commit cf027c1, ``app.jobs.submit.request_hash``) from the params it
built for each request; the first is the one stored by the first release
(``upgrade_data/first_release.sql``).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.jobs.requests import ComparisonIn
from app.jobs.submit import comparison_params, request_hash
from tests.app.payloads import assert_problem
from tests.helpers import digits_id, register

LAYERS = ["stem", "blocks.0", "blocks.1", "blocks.2", "blocks.3", "norm", "pre_logits"]
LABELS = ["mixer_digits#1", "rp_mixer_digits", "mixer_digits#3"]
ROWS = [
    SimpleNamespace(sha256=s)
    for s in (
        "8a2fcb4eef05871406858f2c896cc547f5894116b5c1fe0506fb31a42c486207",
        "cfe5fdbf15c27be96e558da2a465cf9ef4f7e1109df6c46771809539b4fb5505",
        "812778cd2c2ca8c89c8f1a3fdc824dab742f81d7be08e40fd72a1312a4822a98",
    )
]
DATASET = SimpleNamespace(sha256="9d66c71108272a248087ecbd67c48f7e28c3dc4fff6902528479f2a323e9b03d")
BOTH = ["random_init", "seed_ceiling"]


@pytest.mark.parametrize(
    ("body", "digest"),
    [
        # the first release's stored comparison (it had no null: "none" now)
        ({"null": "none"}, "3b55a84f52fdaba9ff874010649f884c29f00620c54f1b519c893b8761c3118d"),
        # the demo atlas, as it asked before and in today's words
        (
            {"bootstrap": 200, "baselines": BOTH},
            "7b90e4388523db294ab7a5cc38356003efbe9faa7e3cce7ffb577df0a61e89b1",
        ),
        (
            {"interval": "images", "resamples": 200, "baselines": BOTH},
            "7b90e4388523db294ab7a5cc38356003efbe9faa7e3cce7ffb577df0a61e89b1",
        ),
        (
            {"permutations": 3, "sensitivity": True},
            "2e5ca1bff9194d11f731d96b3c638d189cccf9293695487c1f05955f1a188451",
        ),
        (
            {"batch_size": 64, "kernel": "RBF:0.50", "estimator": "biased"}
            | {"feature": "mean_tokens", "bootstrap": 7},
            "845dec624428c712a5bdf25d43675b0c561899c73698771a0e20cb67c1df5d4d",
        ),
        ({}, "99f4e8655341227c749b7d6ff25e4f4da4ba04553de4e6afe03f074e7c858fe0"),
        ({"bootstrap": 0}, "99f4e8655341227c749b7d6ff25e4f4da4ba04553de4e6afe03f074e7c858fe0"),
        (
            {"interval": "none", "dtype": "fp32", "seed": 0},
            "99f4e8655341227c749b7d6ff25e4f4da4ba04553de4e6afe03f074e7c858fe0",
        ),
        (
            {"bootstrap": 1, "baselines": ["random_init"], "random_init_draws": 5},
            "4f6c1adaaa4cc7021948ce36c7beddb20da888dc2cbf28512232426f34cf9bbf",
        ),
    ],
)
def test_a_request_hashes_as_it_did_before_the_options_moved(
    body: dict[str, Any], digest: str
) -> None:
    request = ComparisonIn(**({"model_ids": [1, 2, 3], "dataset_id": 1, "batch_size": 150} | body))
    resolved = {label: LAYERS for label in LABELS}
    params = comparison_params(request, request.options(), LABELS, resolved, 1)
    assert request_hash(ROWS, DATASET, params) == digest  # type: ignore[arg-type]


def test_new_options_hash_apart_from_the_defaults() -> None:
    def digest(**body: Any) -> str:
        request = ComparisonIn(model_ids=[1, 2, 3], dataset_id=1, batch_size=150, **body)
        resolved = {label: LAYERS for label in LABELS}
        params = comparison_params(request, request.options(), LABELS, resolved, 1)
        return request_hash(ROWS, DATASET, params)  # type: ignore[arg-type]

    seen = {
        digest(),
        digest(dtype="bf16"),
        digest(seed=3),
        digest(interval="images"),
        digest(interval="batches"),
        digest(interval="batches", resamples=300),
    }
    assert len(seen) == 6
    # image intervals have no resamples of their own: the count only names the request as the
    # old bootstrap count did
    assert digest(interval="images", resamples=200) == digest(bootstrap=200)


def test_rest_reads_every_option_and_the_old_bootstrap(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    ids = register(idle_client, zoo, "mixer_digits")
    base = {"model_ids": ids, "dataset_id": digits_id(idle_client), "batch_size": 150}

    def post(**extra: Any) -> Any:
        return idle_client.post("/v1/comparisons", json=base | extra)

    first = post(interval="batches", resamples=300, dtype="bf16", seed=7)
    assert first.status_code == 202, first.text
    params = first.json()["params"]
    assert (params["interval"], params["resamples"]) == ("batches", 300)
    assert (params["dtype"], params["seed"]) == ("bf16", 7)
    assert "bootstrap" not in params
    # the deprecated count: 0 is no interval, N is N resamples of the unit given (images else)
    old = post(bootstrap=200)
    assert old.status_code == 202 and old.json()["params"]["interval"] == "images"
    assert old.json()["params"]["resamples"] == 200
    same = post(interval="images", resamples=200)
    assert same.status_code == 200 and same.json()["id"] == old.json()["id"]
    plain = post()
    assert plain.status_code == 202 and plain.json()["params"]["interval"] == "none"
    again = post(bootstrap=0)
    assert again.status_code == 200 and again.json()["id"] == plain.json()["id"]
    assert (
        post(bootstrap=300, interval="batches", dtype="bf16", seed=7).json()["id"]
        == (first.json()["id"])
    )
    # refused, each naming its field: the rules between options are CompareOptions'
    assert_problem(
        post(interval="images", mode="full"), 422, "interval_needs_minibatch", "interval"
    )
    assert_problem(post(dtype="fp8"), 422, "invalid_dtype", "dtype")
    assert_problem(post(seed=-1), 422, "validation_error", "seed")
    assert_problem(post(resamples=0), 422, "validation_error", "resamples")
    assert_problem(post(interval="bootstrap"), 422, "validation_error", "interval")
    # baselines need an interval for their verdicts: asked for, it is on
    judged = post(baselines=["random_init"])
    assert judged.json()["params"]["interval"] == "images"


def test_the_cls_feature_on_a_model_without_a_class_token_is_refused_at_submit(
    idle_client: TestClient, zoo: dict[str, Path]
) -> None:
    ids = register(idle_client, zoo, "mixer_digits", "gmlp_digits")
    body = {"model_ids": ids, "dataset_id": digits_id(idle_client), "feature": "cls"}
    problem = assert_problem(
        idle_client.post("/v1/comparisons", json=body),
        422,
        "feature_needs_class_token",
        "feature",
    )
    assert f"model {ids[0]} (mixer_digits)" in problem["detail"]
    assert "class token" in problem["detail"] and "\n" not in problem["detail"]
    assert idle_client.get("/v1/comparisons").json()["total"] == 0
    assert idle_client.get("/v1/jobs").json()["total"] == 0
