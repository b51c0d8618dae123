"""Mutual k-nearest-neighbour alignment (Huh et al. 2024).

Each side's samples are centred, scaled to unit length and given their k nearest neighbours by
cosine similarity (a sample is never its own neighbour; among exactly tied similarities the
pick is arbitrary). The measure is the mean over samples i of |N_k^X(i) ∩ N_k^Y(i)| / k: 1 when
both sides agree on every neighbourhood, about k / (n − 1) by chance. Each layer's neighbours
are found once (rows in chunks, so the n × n similarities are never held whole) and every pair
compares index lists.
"""

from __future__ import annotations

import torch

from analysis.measures.factor import centred

__all__ = ["KNN_CHUNK", "mutual_knn", "neighbours"]

# Rows of the similarity matrix formed at once.
KNN_CHUNK = 1024


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
