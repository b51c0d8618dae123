"""A measure's flags on every surface that shows its values, on the case they are for: two
models whose layers are all wider than the sample (the digits presets over 24 images).

Every selected layer then spans the 23 centred directions of the sample (rank n − 1, which the
atlas's ranks confirm), so by the rules of docs/measures.md every cell is flagged: CCA
degenerate (23 + 23 > 23), linear regression and Procrustes saturated (both sides span the
sample), mutual k-NN with few images (k = 10 ≥ 0.1 · 23). The REST body, the CSV/Parquet
exports, the heatmap SVG, the page's payload, the tooltip drawn from it (the page's own
heatmap.js under node, with a minimal DOM) and the CLI's lines each say so.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from app.cli import main
from app.http.main import create_app
from tests.files import digits_npz
from tests.helpers import make_settings, register, wait

N = 24
FLAG_OF = {
    "cca": "cca_degenerate",
    "linreg": "linreg_saturated",
    "procrustes": "procrustes_saturated",
    "mutual_knn": "mutual_knn_few_images",
}
ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "app" / "http" / "web" / "static"


@pytest.fixture(scope="module")
def few(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return digits_npz(tmp_path_factory.mktemp("data"), N)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = make_settings(f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "data")
    with TestClient(create_app(settings)) as c:
        yield c


def _tooltips(matrix: dict[str, Any], hover: list[tuple[int, int]]) -> dict[str, Any]:
    """What heatmap.js's tooltip says over the cells ``hover`` of ``matrix``."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the tooltip's script is not run")
    given = json.dumps({"matrix": matrix, "hover": hover})
    script = str(Path(__file__).with_name("heatmap_tooltip.js"))
    done = subprocess.run(
        [node, script, str(STATIC)], input=given, capture_output=True, text=True, check=True
    )
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_every_surface_flags_wide_layers_over_few_images(
    client: TestClient, zoo: dict[str, Path], few: Path
) -> None:
    ids = register(client, zoo, "mlp_digits", "gmlp_digits")
    data = client.post("/v1/datasets", files={"file": (few.name, few.read_bytes())})
    body = {"model_ids": ids, "dataset_id": data.json()["id"], "batch_size": 12}
    r = client.post("/v1/comparisons", json=body | {"measures": list(FLAG_OF)})
    assert r.status_code == 202, r.text
    url = r.headers["location"]
    done = wait(client, url, timeout=300)
    assert done["status"] == "succeeded", done
    atlas = client.get(f"{url}/result").json()["atlas"]
    ranks = atlas["diagnostics"]["measures"]["ranks"]
    assert all(r == N - 1 for model in ranks.values() for r in model)  # every layer spans
    a, b = atlas["models"]
    layers = atlas["layers"]
    every = [[True] * len(layers[b]) for _ in layers[a]]

    # the REST body: per flag of the measure asked, its cells; none for CKA
    for measure, flag in FLAG_OF.items():
        m = client.get(f"{url}/matrix", params={"a": a, "b": b, "measure": measure}).json()
        assert m["flags"] == {flag: every}, measure
    plain = client.get(f"{url}/matrix", params={"a": a, "b": b}).json()
    assert plain["flags"] == {}
    assert plain["cca_degenerate"] == every  # the field it had before stays

    # the exports: a flags column naming the measure's flags raised at the cell
    csv = pd.read_csv(io.BytesIO(client.get(f"{url}/cells.csv").content))
    parquet = pd.read_parquet(io.BytesIO(client.get(f"{url}/cells.parquet").content))
    for frame in (csv, parquet):
        columns = list(frame.columns)
        assert columns.index("flags") == columns.index("sensitivity") + 1
        for measure, flag in FLAG_OF.items():
            assert (frame[frame.measure == measure]["flags"] == flag).all(), measure
        assert frame[frame.measure == "cka"]["flags"].isna().all()

    # the heatmap image: every cell of every panel hatched, and the title says why
    svg = client.get(f"{url}/heatmap.svg", params={"measure": "procrustes"}).content
    cells = sum(len(layers[x]) * len(layers[y]) for x in (a, b) for y in (a, b))
    assert len(re.findall(rb'id="flagged-[0-9-]+"', svg)) == cells
    assert b"hatched: Procrustes saturated" in svg
    assert b"flagged-" not in client.get(f"{url}/heatmap.svg").content

    # the page: its payload carries the flags, and the tooltip drawn from it says them
    page = client.get(f"/comparisons/{done['id']}").text
    payload = json.loads(page.split('id="atlas-data"', 1)[1].split(">", 1)[1].split("</script>")[0])
    pair = next(p for p in payload["matrices"] if (p["a"], p["b"]) == (a, b))
    assert pair["flags"]["linreg"] == {"linreg_saturated": every}
    matrix = {
        "a": a,
        "b": b,
        "rows": layers[a],
        "cols": layers[b],
        "values": pair["measures"]["linreg"],
        "measure": "linreg",
        "measureLabel": payload["measure_titles"]["linreg"],
        "flags": pair["flags"]["linreg"],
        "flagLabels": payload["flag_labels"],
    }
    shown = _tooltips(matrix, [(0, 0), (2, 1)])
    for (i, j), lines in zip([(0, 0), (2, 1)], shown["tooltips"], strict=True):
        assert lines[0] == f"linear regression R² {pair['measures']['linreg'][i][j]:.4f}"
        assert lines[1] == "Flagged: linear regression saturated: a layer spans the sample"
    assert shown["flagged"] == shown["marks"] == len(layers[a]) * len(layers[b])
    cka = matrix | {"values": pair["cka"], "measure": "cka", "measureLabel": "CKA", "flags": {}}
    unflagged = _tooltips(cka, [(0, 0)])
    assert not any("Flagged" in line for line in unflagged["tooltips"][0])
    assert unflagged["flagged"] == unflagged["marks"] == 0


def test_the_cli_warns_under_each_flagged_measure(
    zoo: dict[str, Path], few: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "atlas.json"
    argv = ["compare", str(zoo["mlp_digits"]), str(zoo["gmlp_digits"]), "--dataset", str(few)]
    argv += ["--batch-size", "12", "--measure", "linreg", "--measure", "cca", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    layers = json.loads(out.read_text())["layers"]
    a, b = list(layers)
    total = sum(len(layers[x]) * len(layers[y]) for x, y in ((a, a), (a, b), (b, b)))
    printed = capsys.readouterr().out.splitlines()
    for measure, words in (
        ("cca", "CCA degenerate: the layers' ranks add up past n − 1"),
        ("linreg", "linear regression saturated: a layer spans the sample"),
    ):
        at = next(k for k, line in enumerate(printed) if line.startswith(f"{measure}: mean"))
        assert printed[at + 1] == f"warning: {measure}: {words}, in {total} of {total} cells"
