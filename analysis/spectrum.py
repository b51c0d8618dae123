"""Per-layer spectra of the centred Grams, and CKA with each layer's top component removed.

For a batch, K_c = HKH (H = I - 11ᵀ/n) has eigenvalues λ_1 ≥ λ_2 ≥ … ≥ 0; for the linear
kernel they are the variances (times n) of the batch's principal components.

* **Effective dimensionality**: the participation ratio ``(Σλ)² / Σλ² = tr(K_c)² / ‖K_c‖²_F``
  (no eigendecomposition needed). 1 when one direction carries all the variance, the rank
  when all carry the same. A batch of n samples has at most n - 1 directions, so this
  minibatch estimate is capped at n - 1 and averaged over batches.
* **Top-component share**: ``λ_1 / Σλ``, also averaged over batches; with the sensitivity,
  the share of the whole sample's top direction instead.
* **Sensitivity** (opt-in, :func:`whole_sample_sensitivity`): CKA after removing one side's
  top principal direction *of the whole sample*, the same direction at any batch size. The run
  keeps every selected layer's features (n × d floats per layer, as ``full`` mode does); w is
  the top right singular vector of the whole sample's centred features (an eigenvector of
  XᵀX, by block Krylov for wide layers, by a dense eigensolver for narrow ones), in float64.
  Removing it (X ↦ X(I - wwᵀ)) changes each batch's linear Gram by a rank-one update,
  ``K - zzᵀ`` with z = Xw (a constant shift of z changes no HSIC), whose HSIC with every
  other Gram is one product per layer; for the rbf kernel the deflated features' Grams are
  formed again.

The top-component share's λ_1 comes from subspace iteration with :data:`BLOCK` vectors and
:data:`ITERATIONS` steps followed by Rayleigh-Ritz (the Ritz value's error shrinks like
(λ_{BLOCK+1}/λ_1)^(2k)), in float32 on the device: a few products of the (L, n, n) stack
instead of L eigendecompositions. Where λ_1 ≈ λ_2 the "top direction" is itself ill-defined,
and any direction of that cluster is as good an answer.
"""

from __future__ import annotations

import numpy as np
import torch

from analysis.hsic import centred_rows, hsic_block, hsic_from_linear_products, hsic_self
from analysis.kernels import Kernel, gram

__all__ = [
    "BLOCK",
    "ITERATIONS",
    "SpectrumAccumulator",
    "layer_spectra",
    "top_directions",
    "whole_sample_sensitivity",
]

BLOCK = 4
ITERATIONS = 24
# The whole-sample top direction (_top_direction): vectors added to the Krylov basis per step,
# steps before the dense eigensolver takes over, and the residual that stops it. A residual
# of RESIDUAL·λ_1 puts w within an angle RESIDUAL·λ_1/(λ_1 - λ_2) of the exact eigenvector:
# 1e-7 where λ_2 = 0.99 λ_1, below what moves a CKA value in its sixth decimal (10x tighter
# stalls at float64's floor on trained layers: ~1e-10). Trained digits layers (λ_2/λ_1 up to
# 0.99, λ_9/λ_1 0.1-0.25) converge in 6 steps of 8 vectors.
KRYLOV_BLOCK = 8
KRYLOV_STEPS = 10
RESIDUAL = 1e-9


def _centre(grams: torch.Tensor) -> torch.Tensor:
    g = grams.to(torch.float32, copy=True)
    g -= g.mean(2, keepdim=True)
    g -= g.mean(1, keepdim=True)
    return (g + g.transpose(1, 2)) / 2  # exactly symmetric for the Ritz step


def _top_pair(kc: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(λ_1 (L,), u_1 (L, n)) of each centred Gram, by subspace iteration + Rayleigh-Ritz."""
    n_layers, n, _ = kc.shape
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(n, min(BLOCK, n), generator=gen).to(kc)
    q = q.expand(n_layers, -1, -1)
    for _ in range(ITERATIONS):
        q, _ = torch.linalg.qr(kc @ q)
    t = q.transpose(1, 2) @ kc @ q
    vals, vecs = torch.linalg.eigh((t + t.transpose(1, 2)) / 2)
    u = (q @ vecs[:, :, -1:]).squeeze(2)
    return vals[:, -1].clamp(min=0), u


def layer_spectra(
    grams: torch.Tensor,
    top: bool = True,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    estimator: str = "biased",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Participation ratio and top-component share (each (L,), float64) of raw Grams (L, n, n).

    NaN for a layer whose centred Gram is zero (a constant layer has no directions). Without
    ``top`` the share is left at 0 (the sensitivity finds the whole sample's instead).
    ``rows``: the Grams' :func:`analysis.hsic.centred_rows` for ``estimator`` where the caller
    has them: ‖HKH‖² is then their sum of squares plus (unbiased: its zeroed diagonal) the
    diagonal's, with diag(HKH)_i = K_ii - 2 m_i + μ from the row means m and grand mean μ.
    """
    n = grams.shape[-1]
    f, _ = centred_rows(grams, estimator) if rows is None else rows
    means = grams.sum(2, dtype=torch.float64) / n
    diag = grams.diagonal(dim1=1, dim2=2) - 2 * means + means.mean(1, keepdim=True)
    tr = diag.sum(1)
    fro = torch.linalg.vecdot(f, f)
    if estimator == "unbiased":
        fro = fro + diag.square().sum(1)
    ok = tr > 0
    nan = torch.full_like(tr, float("nan"))
    pr = torch.where(ok, tr.square() / torch.where(ok, fro, 1.0), nan)
    if not top:
        return pr, torch.zeros_like(pr)
    lam, _ = _top_pair(_centre(grams))
    share = torch.where(ok, lam.double() / torch.where(ok, tr, 1.0), nan)
    return pr, share


def _dense_top(xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w (G, d), λ_1 (G,)) of XᵀX for a stack of centred features ``xc`` (G, n, d), from one
    eigendecomposition each of the smaller of XᵀX and XXᵀ."""
    n, d = xc.shape[1:]
    if d <= n:
        vals, vecs = torch.linalg.eigh(xc.mT @ xc)
        return vecs[..., -1], vals[:, -1]
    vals, vecs = torch.linalg.eigh(xc @ xc.mT)
    w = (xc.mT @ vecs[..., -1:]).squeeze(2)
    return w / torch.linalg.vector_norm(w, dim=1, keepdim=True).clamp(min=1e-300), vals[:, -1]


def _top_direction(xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(w (G, d), λ_1 (G,)) of C = XᵀX for a stack of centred features ``xc`` (G, n, d) of one
    shape, float64.

    Block Krylov with Rayleigh-Ritz, all G layers in the same batched products: the basis
    grows by C times its newest block, so after k steps it holds every polynomial of degree
    < k in C applied to the start, and the top Ritz pair converges at a rate set by the gap
    between λ_1 and the first eigenvalue past the block, not by λ_2/λ_1 (trained layers reach
    0.99). Stops once every layer has ‖Cw - λw‖ ≤ :data:`RESIDUAL`·λ; the dense eigensolver
    answers layers too narrow for a basis, or unconverged after :data:`KRYLOV_STEPS` steps,
    so the answer is always the exact top direction to rounding.
    """
    n_layers, n, d = xc.shape
    k = KRYLOV_BLOCK
    if min(n, d) <= k * KRYLOV_STEPS:
        return _dense_top(xc)
    gen = torch.Generator(device="cpu").manual_seed(0)
    start = torch.randn(n, k, generator=gen, dtype=xc.dtype).to(xc.device)
    # basis (orthonormal) and image = C · basis fill their first m columns; small = basisᵀ C
    # basis grows by the new block's column (C is symmetric, so its row is the transpose)
    xt = xc.mT
    basis = xc.new_empty(n_layers, d, k * KRYLOV_STEPS)
    image, small = torch.empty_like(basis), xc.new_empty(n_layers, basis.shape[2], basis.shape[2])
    basis[..., :k] = torch.linalg.qr(xt @ start)[0]  # a start in the row space of X
    m = 0
    while True:
        image[..., m : m + k] = xt @ (xc @ basis[..., m : m + k])
        col = basis[..., : m + k].mT @ image[..., m : m + k]
        small[:, : m + k, m : m + k] = col
        small[:, m : m + k, : m + k] = col.mT
        m += k
        vals, vecs = torch.linalg.eigh((small[:, :m, :m] + small[:, :m, :m].mT) / 2)
        lam, top = vals[:, -1], vecs[..., -1:]
        w = (basis[..., :m] @ top).squeeze(2)
        residual = (image[..., :m] @ top).squeeze(2) - lam[:, None] * w
        done = (torch.linalg.vector_norm(residual, dim=1) <= RESIDUAL * lam) | (lam <= 0)
        if bool(done.all()) or m == basis.shape[2]:
            break
        grown, old = image[..., m - k : m], basis[..., :m]
        grown = grown - old @ (old.mT @ grown)
        grown = grown - old @ (old.mT @ grown)  # twice: the basis stays orthonormal
        basis[..., m : m + k] = torch.linalg.qr(grown)[0]
    lam = lam.clamp(min=0)  # ≤ 0: a constant layer, no direction to remove
    rest = torch.nonzero(~done).squeeze(1)
    if len(rest):
        w[rest], lam[rest] = _dense_top(xc[rest])
    return w / torch.linalg.vector_norm(w, dim=1, keepdim=True).clamp(min=1e-300), lam


def top_directions(
    features: list[torch.Tensor],
) -> tuple[list[torch.Tensor], list[torch.Tensor], np.ndarray]:
    """Each layer's top principal direction over all its samples (n, d_i) as a unit float64
    (d_i,), the centred samples' projections on it (n,), and the share of the layer's variance
    it carries (λ_1 / tr XᵀX; NaN for a constant layer). Layers of one width are solved
    together."""
    ws: list[torch.Tensor] = [torch.empty(0)] * len(features)
    zs, shares = list(ws), np.full(len(features), np.nan)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, x in enumerate(features):
        groups.setdefault(tuple(x.shape), []).append(i)
    for members in groups.values():
        first = features[members[0]]
        xc = torch.empty(len(members), *first.shape, dtype=torch.float64, device=first.device)
        for k, i in enumerate(members):
            xc[k].copy_(features[i])
        xc -= xc.mean(1, keepdim=True)
        w, lam = _top_direction(xc)
        z = (xc @ w[..., None]).squeeze(2)
        total = xc.square().sum((1, 2))
        for k, i in enumerate(members):
            ws[i], zs[i] = w[k], z[k]
            shares[i] = float(lam[k] / total[k]) if total[k] > 0 else float("nan")
    return ws, zs, shares


def _carried(
    xs: list[torch.Tensor], zs: list[torch.Tensor], estimator: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """HSIC of every layer's projection Gram zzᵀ against every layer's linear Gram of one
    batch (``xs`` (n, d_j), ``zs`` (n,)), and of each zzᵀ with itself.

    ‖X_jᵀz_i‖² is one product per layer j of its centred features, in their precision (a
    shift of z changes no HSIC, so z is centred too); its row norms are summed in float64.
    """
    z = torch.stack(zs)
    z = z - z.mean(1, keepdim=True)
    kz = z.square()
    ff = torch.empty(len(zs), len(xs), dtype=torch.float64, device=z.device)
    kx = torch.empty(len(xs), z.shape[1], dtype=torch.float64, device=z.device)
    for j, x in enumerate(xs):
        xc = x - x.mean(0)
        ff[:, j] = (xc.mT @ z.T.to(x.dtype)).to(torch.float64).square().sum(0)
        kx[j] = xc.square_().sum(1, dtype=torch.float64)
    own = hsic_from_linear_products((z @ z.T).square(), kz, kz, estimator).diagonal()
    return hsic_from_linear_products(ff, kz, kx, estimator), own


def whole_sample_sensitivity(
    features: list[torch.Tensor],
    sizes: list[int],
    kern: Kernel,
    estimator: str,
    intact: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Deflated HSIC sums over the batches (of ``sizes`` samples, in order) of ``features``,
    and each layer's whole-sample top-component share.

    ``deflated_cross[i, j]``: layer i without its whole-sample top direction against layer j
    intact; ``deflated_self[i]``: layer i deflated against itself. ``intact``: the run's summed
    HSIC of the same batches. For the linear kernel the deflated Gram is ``K - zzᵀ``, and both
    estimators are symmetric bilinear forms in the Grams, so
    ``HSIC(K - zzᵀ, L) = HSIC(K, L) - HSIC(zzᵀ, L)`` and
    ``HSIC(K - zzᵀ, K - zzᵀ) = HSIC(K, K) - 2 HSIC(zzᵀ, K) + HSIC(zzᵀ, zzᵀ)``: only what the
    direction carries is computed (:func:`_carried`), and no Gram is formed again. For other
    kernels the deflated features' Grams are formed and met with the intact ones.
    """
    ws, zs, shares = top_directions(features)
    n_layers = len(features)
    carried = torch.zeros(n_layers, n_layers, dtype=torch.float64)
    own_z = torch.zeros(n_layers, dtype=torch.float64)
    cross = torch.zeros(n_layers, n_layers, dtype=torch.float64)
    own = torch.zeros(n_layers, dtype=torch.float64)
    start = 0
    for n in sizes:
        batch = slice(start, start + n)
        start += n
        xs = [f[batch] for f in features]
        if kern.name == "linear":
            c, o = _carried(xs, [z[batch] for z in zs], estimator)
            carried += c.cpu()
            own_z += o.cpu()
            continue
        grams = torch.stack([gram(x, kern) for x in xs])
        deflated = torch.stack(
            [
                gram(x64 - torch.outer(x64 @ w, w), kern)
                for x64, w in ((x.to(torch.float64), w) for x, w in zip(xs, ws, strict=True))
            ]
        )
        rows, drows = centred_rows(grams, estimator), centred_rows(deflated, estimator)
        cross += hsic_block(drows, rows, estimator).cpu()
        own += hsic_self(drows, estimator).cpu()
    if kern.name == "linear":
        h = torch.from_numpy(np.asarray(intact, dtype=np.float64))
        cross = h - carried
        own = h.diagonal() - 2 * carried.diagonal() + own_z
    return cross.numpy(), own.numpy(), shares


class SpectrumAccumulator:
    """Sums per-layer spectra (participation ratio, top-component share) over batches; with
    ``top`` False only the participation ratio (the share then comes from the whole sample)."""

    def __init__(self, n_layers: int, estimator: str, top: bool = True) -> None:
        self.top, self.estimator = top, estimator
        self.pr = torch.zeros(n_layers, dtype=torch.float64)
        self.share = torch.zeros(n_layers, dtype=torch.float64)
        self.batches = 0

    def add(self, grams: torch.Tensor, rows: tuple[torch.Tensor, torch.Tensor]) -> None:
        """One batch: its raw Grams (L, n, n) and their centred rows for the estimator."""
        pr, share = layer_spectra(grams, self.top, rows, self.estimator)
        self.pr += pr.cpu()
        self.share += share.cpu()
        self.batches += 1

    def state(self) -> dict[str, np.ndarray]:
        """The sums as float64 arrays (``batches`` a 0-d int64): summing the states of runs
        over disjoint batches gives the state of one run over all of them."""
        return {
            "pr": self.pr.numpy().copy(),
            "share": self.share.numpy().copy(),
            "batches": np.array(self.batches, dtype=np.int64),
        }

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Participation ratio and top share per layer, averaged over the batches seen."""
        return self.pr / max(self.batches, 1), self.share / max(self.batches, 1)
