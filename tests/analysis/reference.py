"""An independent float64 NumPy CKA, the reference the analysis tests compare against.

Written from the formulas in the papers; it never calls engine code.
"""

from __future__ import annotations

import numpy as np


def gram(x: np.ndarray, kernel: str, t: float = 1.0) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if kernel == "linear":
        return x @ x.T
    sq = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    med = np.median(sq[np.triu_indices(len(x), 1)])
    return np.exp(-sq / (2 * t**2 * med))


def hsic(k: np.ndarray, l: np.ndarray, estimator: str) -> float:  # noqa: E741
    n = len(k)
    if estimator == "biased":
        h = np.eye(n) - 1.0 / n
        return float(np.trace(k @ h @ l @ h)) / (n - 1) ** 2
    kt, lt = k.copy(), l.copy()
    np.fill_diagonal(kt, 0)
    np.fill_diagonal(lt, 0)
    one = np.ones(n)
    value = (
        np.trace(kt @ lt)
        + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
        - 2 / (n - 2) * (one @ kt @ lt @ one)
    )
    return float(value) / (n * (n - 3))


def batches(n: int, batch_size: int, estimator: str) -> list[slice]:
    smallest = 4 if estimator == "unbiased" else 2
    return [
        slice(i, min(i + batch_size, n))
        for i in range(0, n, batch_size)
        if min(i + batch_size, n) - i >= smallest
    ]


def cka(
    x: np.ndarray,
    y: np.ndarray,
    *,
    kernel: str = "linear",
    estimator: str = "unbiased",
    batch_size: int | None = None,
    t: float = 1.0,
) -> float:
    """CKA of two (n, d) feature matrices; ``batch_size`` None means one batch of everything."""
    n = len(x)
    xy = xx = yy = 0.0
    for s in batches(n, batch_size or n, estimator):
        k, l = gram(x[s], kernel, t), gram(y[s], kernel, t)  # noqa: E741
        xy += hsic(k, l, estimator)
        xx += hsic(k, k, estimator)
        yy += hsic(l, l, estimator)
    return xy / np.sqrt(xx * yy)


def cka_matrix(xs: list[np.ndarray], ys: list[np.ndarray], **kw: object) -> np.ndarray:
    return np.array([[cka(x, y, **kw) for y in ys] for x in xs])  # type: ignore[arg-type]
