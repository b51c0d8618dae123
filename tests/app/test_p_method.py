"""What each p-value rests on (``p_method``) reaches the service's readers: the matrix payload
and the cell tables (CSV, Parquet) carry the library's, cell for cell; a comparison stored before
methods were recorded reads null there. On SQLite and on PostgreSQL.

The expectation is the library's own atlas for the same comparison (``analysis.compare`` in this
process, same models, data and seed). The tail check is made strict here (its threshold lowered
to 0.05, for the service's worker and the library alike, both in this process), so that the
analytic null's cells rest on more than one method and a misplaced block or a transposed one
shows.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient

import analysis
import models
from analysis.inference import analytic_null
from app.store.db import Database
from app.store.orm import Comparison
from app.store.settings import Settings
from tests.files import digits_npz
from tests.helpers import register, wait

N, BATCH, PERM = 96, 32, 20
NAMES = ("mixer_digits", "sw_mlp_digits")


def _words(rows: Any) -> list[list[str | None]]:
    """Per-cell labels as the payload has them: a string, or None where there is none."""
    return [[v if isinstance(v, str) and v else None for v in row] for row in rows]


def _table_block(table: pd.DataFrame, a: str, b: str, shape: tuple[int, int]) -> list[list[Any]]:
    part = table[(table.model_a == a) & (table.model_b == b) & (table.measure == "cka")]
    assert len(part) == shape[0] * shape[1]
    return _words(np.asarray(part["p_method"].tolist(), dtype=object).reshape(shape))


def _tables(client: TestClient, url: str) -> dict[str, pd.DataFrame]:
    csv = client.get(f"{url}/cells.csv")
    parquet = client.get(f"{url}/cells.parquet")
    assert csv.status_code == 200 and parquet.status_code == 200
    return {
        "csv": pd.read_csv(io.BytesIO(csv.content)),
        "parquet": pd.read_parquet(io.BytesIO(parquet.content)),
    }


def test_rest_and_exports_carry_the_librarys_p_method(
    client: TestClient,
    settings: Settings,
    zoo: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(analytic_null, "DEPARTURE", 0.05)
    ids = register(client, zoo, *NAMES)
    path = digits_npz(tmp_path, N)
    r = client.post("/v1/datasets", files={"file": (path.name, path.read_bytes())})
    assert r.status_code in (200, 201), r.text
    dataset = r.json()["id"]
    nets = {name: models.load(zoo[name])[0] for name in NAMES}
    data = analysis.load_dataset(path)
    pairs = [(a, b) for a in NAMES for b in NAMES]
    seen: set[str] = set()
    urls = {}
    for extra in ({}, {"permutations": PERM}):
        body = {"model_ids": ids, "dataset_id": dataset, "batch_size": BATCH, **extra}
        r = client.post("/v1/comparisons", json=body)
        assert r.status_code == 202, r.text
        url = r.headers["location"]
        assert wait(client, url, timeout=300)["status"] == "succeeded"
        urls[str(extra)] = url
        library = analysis.compare(nets, data, batch_size=BATCH, device="cpu", **extra)
        tables = _tables(client, url)
        for a, b in pairs:
            want = library.p_method(a, b)
            assert want is not None
            m = client.get(f"{url}/matrix", params={"a": a, "b": b}).json()
            assert m["p_method"] == _words(want), (extra, a, b)
            p = library.p_values(a, b)
            assert p is not None
            np.testing.assert_allclose(
                np.array(m["p_value"], dtype=float), p, rtol=1e-6, atol=1e-12
            )
            seen |= {v for row in m["p_method"] for v in row if v}
            if NAMES.index(a) <= NAMES.index(b):  # the tables' pairs
                for name, table in tables.items():
                    got = _table_block(table, a, b, want.shape)
                    assert got == _words(want), (extra, name, a, b)
    assert seen == {"analytic", "bound", "permutation"}

    # A comparison stored before methods were recorded: its p-values stand, p_method is null.
    url = urls["{}"]
    comparison_id = int(url.rsplit("/", 1)[1])
    db = Database(settings.resolved_database_url)
    try:
        with db.session() as s:
            row = s.get(Comparison, comparison_id)
            assert row is not None and row.result is not None
            old = {k: v for k, v in row.result.items() if k != "p_method"}
            old["matrices"] = [
                {k: v for k, v in m.items() if k != "p_method"} for m in old["matrices"]
            ]
            row.result = old
            row.result_sha256 = "0" * 64  # another result: nothing cached for it
    finally:
        db.dispose()
    m = client.get(f"{url}/matrix", params={"a": NAMES[0], "b": NAMES[1]}).json()
    assert m["p_method"] is None and m["p_value"] is not None
    for name, table in _tables(client, url).items():
        assert table["p_method"].isna().all(), name
        assert table["p_value"].notna().any(), name
