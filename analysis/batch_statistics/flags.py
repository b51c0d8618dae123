"""Warnings about an atlas's cells: one sentence each for people, a dict each for programs.

Two rules, with their thresholds as documented constants:

* **Small n against the effective dimension.** Every HSIC term comes from one batch of b
  samples, and a batch can show at most b - 1 directions. A layer whose minibatch effective
  dimension d_eff (:mod:`analysis.estimators.spectrum`) is more than b / :data:`MIN_SAMPLES_PER_DIM`
  has fewer than that many samples per direction in each batch: its spectrum is poorly resolved
  and its CKA values are noisy (and the biased estimator drifts towards 1). Flag ``small_n``.
* **One direction dominates a cell** (Davari et al. 2022: CKA can be carried by a single
  high-variance direction, so two layers look alike while the rest of their representations
  differ). With ``sensitivity=True``, a cell is flagged ``top_pc`` when removing either side's
  top principal direction *of the whole sample* (:mod:`analysis.estimators.spectrum`) takes away
  more than :data:`DOMINANCE` (half) of its CKA: ``CKA - CKA_without ≥ DOMINANCE · CKA``, i.e. that
  one direction carries most of the similarity. A fixed absolute move (the former rule, 0.1)
  marked nearly every cell of a trained atlas, since removing the top direction of any layer
  moves CKA somewhat; a move of half the value is what "dominated" means. Cells with CKA
  below :data:`MIN_CKA` are skipped (half of almost nothing is noise), and so is a layer
  against itself. One sentence per model pair summarises its flagged cells.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from analysis.batch_statistics.protocol import AtlasView

__all__ = ["DOMINANCE", "MIN_CKA", "MIN_SAMPLES_PER_DIM", "calibration_flags"]

MIN_SAMPLES_PER_DIM = 5.0
DOMINANCE = 0.5
MIN_CKA = 0.1


def _small_n(atlas: AtlasView, batch: float) -> tuple[list[str], list[dict[str, Any]]]:
    """One flag per layer, one sentence per model (naming its flagged layers)."""
    sentences: list[str] = []
    flags: list[dict[str, Any]] = []
    for m in atlas.models:
        dims = atlas.effective_dim(m)
        if dims is None:
            continue
        hit = []
        for layer, d in zip(atlas.layers[m], dims, strict=True):
            if not np.isfinite(d) or batch >= MIN_SAMPLES_PER_DIM * d:
                continue
            hit.append((layer, float(d)))
            flags.append(
                {"kind": "small_n", "model": m, "layer": layer, "effective_dim": float(d)}
                | {"batch_size": batch, "min_samples_per_dim": MIN_SAMPLES_PER_DIM}
            )
        if not hit:
            continue
        named = ", ".join(f"{layer} ({d:.0f})" for layer, d in hit)
        which = f"Layer {named} of {m} has" if len(hit) == 1 else f"Layers {named} of {m} have"
        sentences.append(
            f"{which} an effective dimension above batches of {batch:.0f} samples can resolve "
            f"(fewer than {MIN_SAMPLES_PER_DIM:g} samples per dimension), so "
            f"{'its' if len(hit) == 1 else 'their'} CKA values are noisy; use larger batches."
        )
    return sentences, flags


def _top_pc(atlas: AtlasView, a: str, b: str) -> tuple[list[str], list[dict[str, Any]]]:
    drop = atlas.without_top_pc(a, b)
    if drop is None:
        return [], []
    cka = atlas.matrix(a, b)
    lost = np.fmax(cka - drop[0], cka - drop[1])  # the larger loss of either side
    with np.errstate(invalid="ignore"):
        dominated = (cka >= MIN_CKA) & (lost >= DOMINANCE * cka)
    if a == b:
        dominated &= np.triu(np.ones_like(dominated, dtype=bool), 1)
    hit = np.argwhere(dominated)
    flags = [
        {
            "kind": "top_pc",
            "a": a,
            "layer_a": atlas.layers[a][i],
            "b": b,
            "layer_b": atlas.layers[b][j],
            "cka": float(cka[i, j]),
            "without_top_pc_a": float(drop[0][i, j]),
            "without_top_pc_b": float(drop[1][i, j]),
            "shift": float(lost[i, j]),
            "threshold": DOMINANCE,
        }
        for i, j in hit
    ]
    if not flags:
        return [], []
    worst = max(flags, key=lambda f: f["shift"] / f["cka"])
    moved = min(worst["without_top_pc_a"], worst["without_top_pc_b"])
    sentence = (
        f"{len(flags)} cell{'s' if len(flags) > 1 else ''} of {a} × {b} lose more than "
        f"{DOMINANCE:.0%} of their CKA when one side's top principal direction is removed "
        f"(largest: {worst['layer_a']} × {worst['layer_b']}, {worst['cka']:.2f} → "
        f"{moved:.2f}), so a single direction dominates them."
    )
    return [sentence], flags


def calibration_flags(
    atlas: AtlasView, batch_size: float
) -> tuple[list[str], list[dict[str, Any]]]:
    """(warnings, flags) for ``atlas``, whose batches averaged ``batch_size`` samples."""
    sentences, flags = _small_n(atlas, batch_size)
    for a, b in atlas.pairs():
        s, f = _top_pc(atlas, a, b)
        sentences += s
        flags += f
    return sentences, flags
