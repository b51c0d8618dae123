"""Mutual k-nearest-neighbour alignment (Huh et al. 2024).

Each side's samples are centred, scaled to unit length and given their k nearest neighbours by
cosine similarity (a sample is never its own neighbour; among exactly tied similarities the
pick is arbitrary). The measure is the mean over samples i of |N_k^X(i) ∩ N_k^Y(i)| / k: 1 when
both sides agree on every neighbourhood, about k / (n − 1) by chance. Each layer's neighbours
are found once (rows in chunks, so the n × n similarities are never held whole) and every pair
compares index lists.

Few images for k: by chance a neighbourhood shares about k / (n − 1) of itself, so where that
reaches :data:`CHANCE_FLAG` the scale between chance and 1 is short (and with fewer than k other
images the measure is undefined); those cells are flagged.
"""

from __future__ import annotations

import torch

from analysis.measures.factor import centred
from analysis.measures.protocol import Flag, Layer, Measure, Pair

__all__ = ["CHANCE_FLAG", "FEW_IMAGES", "KNN_CHUNK", "MUTUAL_KNN", "mutual_knn", "neighbours"]

# Rows of the similarity matrix formed at once.
KNN_CHUNK = 1024
# At this chance level k / (n − 1) or above, a cell is flagged.
CHANCE_FLAG = 0.1


def neighbours(features: torch.Tensor, k: int) -> torch.Tensor | None:
    """Each sample's ``k`` nearest other samples by cosine similarity of the centred features,
    (n, k) indices; None when there are not k other samples."""
    x = centred(features)
    n = x.shape[0]
    if n - 1 < k:
        return None
    z = x / x.norm(dim=1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    out = torch.empty(n, k, dtype=torch.long, device=x.device)
    for start in range(0, n, KNN_CHUNK):
        sims = z[start : start + KNN_CHUNK] @ z.T
        rows = torch.arange(sims.shape[0], device=x.device)
        sims[rows, rows + start] = -torch.inf  # not its own neighbour
        out[start : start + KNN_CHUNK] = sims.topk(k, dim=1).indices
    return out


def mutual_knn(nx: torch.Tensor | None, ny: torch.Tensor | None) -> float:
    """The mean shared share of neighbours of two layers' :func:`neighbours`; NaN without."""
    if nx is None or ny is None:
        return float("nan")
    shared = (nx[:, :, None] == ny[:, None, :]).any(dim=2).sum()
    return float(shared) / nx.numel()


def _few_images(x: Layer, y: Layer) -> bool:
    return x.n - 1 < x.k or x.k >= CHANCE_FLAG * (x.n - 1)


FEW_IMAGES = Flag(
    "mutual_knn_few_images",
    f"mutual k-NN: few images for k (chance k / (n − 1) ≥ {CHANCE_FLAG})",
    "mutual k-NN has few images for its k in {count} cells: by chance a neighbourhood shares "
    f"k / (n − 1) ≥ {CHANCE_FLAG} of itself (none is defined with fewer than k other images); "
    "use more images or a smaller knn_k (docs/measures.md)",
    _few_images,
)


def _pair(pair: Pair) -> float:
    return mutual_knn(pair.x.neighbours, pair.y.neighbours)


MUTUAL_KNN = Measure(
    "mutual_knn",
    "mutual k-NN",
    "analysis.measures.mutual_knn: shared share of k nearest neighbours",
    _pair,
    needs=frozenset({"neighbours"}),
    flags=(FEW_IMAGES,),
)
