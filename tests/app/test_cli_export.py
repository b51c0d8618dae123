"""`cka-atlas export` says what it wrote as the file counts it: one row per cell and measure
(issue 47: it said "wrote 304 cells" of a 1216-row file)."""

from __future__ import annotations

import io

import pandas as pd

import analysis
import models
from app.cli.export import _rows
from app.store.cells import Cells


def test_the_export_message_counts_the_files_rows() -> None:
    nets = {name: models.create("mlp_digits", seed=seed) for name, seed in (("a", 0), ("b", 1))}
    for measures, said in ((("cka",), "one per cell"), (("cka", "linreg"), "cells × 2 measures")):
        atlas = analysis.compare(nets, "digits", batch_size=150, measures=measures, device="cpu")
        cells = Cells(atlas.to_dict())
        rows = len(pd.read_csv(io.BytesIO(cells.to_csv())))
        assert _rows(cells).startswith(f"{rows} rows (") and said in _rows(cells)
