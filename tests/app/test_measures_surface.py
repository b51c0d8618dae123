"""The measures beside CKA at every surface: REST (request, result, matrix, heatmap, cells
exports), the CLI, and the memory budget's refusal."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from app.cli import main
from app.http.main import create_app
from tests.app.payloads import assert_problem
from tests.files import digits_npz
from tests.helpers import make_settings, register, wait

MEASURES = ["procrustes", "pwcca", "cca"]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digits_npz(tmp_path_factory.mktemp("data"), 96)


@pytest.fixture
def sqlite_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    with TestClient(create_app(settings)) as c:
        yield c


def _submit(client: TestClient, zoo: dict[str, Path], small: Path, **extra: object) -> str:
    ids = register(client, zoo, "mlp_digits", "gmlp_digits")
    data = client.post("/v1/datasets", files={"file": (small.name, small.read_bytes())})
    body = {"model_ids": ids, "dataset_id": data.json()["id"], "batch_size": 32} | extra
    r = client.post("/v1/comparisons", json=body)
    assert r.status_code == 202, r.text
    return str(r.headers["location"])


def _array(rows: list[list[float | None]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)


def test_rest_carries_every_measure_to_matrix_heatmap_and_exports(
    sqlite_client: TestClient, zoo: dict[str, Path], small: Path
) -> None:
    client = sqlite_client
    url = _submit(client, zoo, small, measures=MEASURES)
    done = wait(client, url, timeout=300)
    assert done["status"] == "succeeded", done
    assert done["params"]["measures"] == ["cka", "cca", "pwcca", "procrustes"]
    atlas = client.get(f"{url}/result").json()["atlas"]
    assert list(atlas["measures"]) == ["cca", "pwcca", "procrustes"]
    a, b = atlas["models"]
    offsets = np.cumsum([0, *(len(atlas["layers"][m]) for m in atlas["models"])])
    rows, cols = slice(offsets[0], offsets[1]), slice(offsets[1], offsets[2])
    for measure in ("pwcca", "cca"):
        m = client.get(f"{url}/matrix", params={"a": a, "b": b, "measure": measure}).json()
        assert m["measure"] == measure and m["measures"] == ["cka", "cca", "pwcca", "procrustes"]
        want = _array(atlas["measures"][measure])[rows, cols]
        assert np.array_equal(_array(m["values"]), want, equal_nan=True)
        assert m["p_value"] is None and m["ci_low"] is None  # CKA's company, not this measure's
        assert np.array(m["cca_degenerate"]).shape == want.shape
    plain = client.get(f"{url}/matrix", params={"a": a, "b": b}).json()
    assert plain["measure"] == "cka" and plain["values"] != m["values"]
    assert_problem(
        client.get(f"{url}/matrix", params={"measure": "linreg"}), 422, "unknown_measure", "measure"
    )
    svg = client.get(f"{url}/heatmap.svg", params={"measure": "procrustes"})
    assert svg.status_code == 200 and b"Procrustes similarity" in svg.content
    assert b"Procrustes" not in client.get(f"{url}/heatmap.svg").content
    page = client.get(f"/comparisons/{done['id']}").text
    assert 'id="measure-by"' in page
    payload = json.loads(page.split('id="atlas-data"', 1)[1].split(">", 1)[1].split("</script>")[0])
    assert payload["measures"] == ["cka", "cca", "pwcca", "procrustes"]
    pair = next(p for p in payload["matrices"] if (p["a"], p["b"]) == (a, b))
    want = _array(atlas["measures"]["procrustes"])[rows, cols]
    assert np.array_equal(_array(pair["measures"]["procrustes"]), want, equal_nan=True)
    table = pd.read_csv(io.BytesIO(client.get(f"{url}/cells.csv").content))
    parquet = pd.read_parquet(io.BytesIO(client.get(f"{url}/cells.parquet").content))
    for frame in (table, parquet):
        assert sorted(set(frame.measure)) == ["cca", "cka", "procrustes", "pwcca"]
        part = frame[(frame.measure == "pwcca") & (frame.model_a == a) & (frame.model_b == b)]
        want = _array(atlas["measures"]["pwcca"])[rows, cols].ravel()
        assert np.allclose(part.value.to_numpy(float), want, equal_nan=True)
        assert part.cka.isna().all()
        ckas = frame[(frame.measure == "cka")]
        assert np.array_equal(ckas.value.to_numpy(float), ckas.cka.to_numpy(float), equal_nan=True)


def test_rest_refuses_unknown_or_repeated_measures(
    sqlite_client: TestClient, zoo: dict[str, Path], small: Path
) -> None:
    ids = register(sqlite_client, zoo, "mlp_digits")
    for bad in (["rsa"], ["cca", "cca"]):
        r = sqlite_client.post(
            "/v1/comparisons", json={"model_ids": ids, "dataset_id": 1, "measures": bad}
        )
        assert r.status_code == 422 and "measures" in r.text, r.text


def test_over_the_memory_budget_a_request_is_refused_in_one_sentence(
    sqlite_client: TestClient,
    zoo: dict[str, Path],
    small: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = register(sqlite_client, zoo, "mlp_digits", "gmlp_digits")
    data = sqlite_client.post("/v1/datasets", files={"file": (small.name, small.read_bytes())})
    body = {"model_ids": ids, "dataset_id": data.json()["id"], "measures": ["pwcca"]}
    monkeypatch.setenv("CKA_MEASURES_MEMORY_GB", "0.00001")
    r = sqlite_client.post("/v1/comparisons", json=body)
    assert_problem(r, 422, "over_memory_budget", "measures")
    detail = r.json()["detail"]
    assert (
        detail.startswith("measures: pwcca over 96 images") and "CKA_MEASURES_MEMORY_GB" in detail
    )
    # the widths behind the estimate are the layers' own: mlp_digits's and gmlp_digits's
    assert sqlite_client.post("/v1/comparisons", json=body | {"measures": []}).status_code == 202
    monkeypatch.setenv("CKA_MEASURES_MEMORY_GB", "8")
    assert sqlite_client.post("/v1/comparisons", json=body).status_code == 202


def test_cli_measure_flag_is_repeatable(
    zoo: dict[str, Path], small: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, svg = tmp_path / "atlas.json", tmp_path / "map.svg"
    argv = ["compare", str(zoo["mlp_digits"]), str(zoo["gmlp_digits"]), "--dataset", str(small)]
    argv += ["--batch-size", "32", "--measure", "linreg", "--measure", "mutual_knn"]
    argv += ["--out", str(out), "--heatmap", str(svg), "--heatmap-measure", "linreg"]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert sorted(result["measures"]) == ["linreg", "mutual_knn"]
    assert result["config"]["measures"] == ["cka", "linreg", "mutual_knn"]
    assert b"linear regression R" in svg.read_bytes()
    printed = capsys.readouterr().out
    assert "linreg: mean diagonal" in printed and "mutual_knn: mean diagonal" in printed
    with pytest.raises(SystemExit, match="--heatmap-measure"):
        main([*argv[:7], "--heatmap", str(svg), "--heatmap-measure", "pwcca"])
