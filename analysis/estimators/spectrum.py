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
  the top right singular vector of the whole sample's centred features, in float64, found
  from the smaller of their two Grams (XXᵀ or XᵀX, :mod:`analysis.estimators.directions`).
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

from analysis.estimators.directions import FormedGrams, directions_and_grams
from analysis.estimators.hsic import centred_rows, hsic_block, hsic_from_linear_products, hsic_self
from analysis.estimators.kernels import Kernel, gram

__all__ = [
    "BLOCK",
    "ITERATIONS",
    "SpectrumAccumulator",
    "layer_spectra",
    "whole_sample_sensitivity",
]

BLOCK = 4
ITERATIONS = 24


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


def _centred_diagonal(grams: torch.Tensor) -> torch.Tensor:
    """diag(HKH) (L, n), float64, of Grams K (L, n, n): K_ii - 2 m_i + μ from the row means m
    and the grand mean μ, without centring the Grams."""
    means = grams.sum(2, dtype=torch.float64) / grams.shape[-1]
    return grams.diagonal(dim1=1, dim2=2) - 2 * means + means.mean(1, keepdim=True)


def layer_spectra(
    grams: torch.Tensor,
    top: bool = True,
    rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    estimator: str = "biased",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Participation ratio and top-component share (each (L,), float64) of raw Grams (L, n, n).

    NaN for a layer whose centred Gram is zero (a constant layer has no directions). Without
    ``top`` the share is left at 0 (the sensitivity finds the whole sample's instead).
    ``rows``: the Grams' :func:`analysis.estimators.hsic.centred_rows` for ``estimator`` where the
    caller has them: ‖HKH‖² is then their sum of squares plus (unbiased: its zeroed diagonal) the
    diagonal's, with diag(HKH)_i = K_ii - 2 m_i + μ from the row means m and grand mean μ.
    """
    f, _ = centred_rows(grams, estimator) if rows is None else rows
    diag = _centred_diagonal(grams)
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


def _carried(
    xs: list[torch.Tensor],
    zs: list[torch.Tensor],
    estimator: str,
    formed: FormedGrams,
    batch: slice,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HSIC of every layer's projection Gram zzᵀ against every layer's linear Gram of one
    batch (``xs`` (n, d_j) and ``zs`` (n,): the samples ``batch`` of the whole), and of each
    zzᵀ with itself.

    A shift of z changes no HSIC, so z is centred, and then ‖X_jᵀz_i‖² is z_iᵀGz_i for G the
    batch's block of layer j's whole-sample Gram XXᵀ, and the batch-centred rows' squared norms
    are diag(HGH) (a common shift of X's rows changes neither): where
    :func:`analysis.estimators.directions.directions_and_grams`
    formed that Gram, every layer's term is one batched product with no pass over the
    features. Elsewhere it is one product per layer of its centred features, in float64: the
    deflated self-HSIC is a difference of terms that nearly cancel where the direction carries
    most of a layer, and float32 products of a batch's rows are only good to ~1e-6 relative,
    which reached 3e-6 in a deflated CKA.
    """
    z = torch.stack(zs)
    z = z - z.mean(1, keepdim=True)
    kz = z.square()
    ff = torch.empty(len(zs), len(xs), dtype=torch.float64, device=z.device)
    kx = torch.empty(len(xs), z.shape[1], dtype=torch.float64, device=z.device)
    rest = set(range(len(xs)))
    for members, grams in formed:
        g = grams[:, batch, batch]
        ff[:, members] = torch.linalg.vecdot(z @ g, z).T
        kx[members] = _centred_diagonal(g)
        rest -= set(members)
    if rest:
        scratch = z.new_empty(max(xs[j].numel() for j in rest))  # one allocation for all
        for j in sorted(rest):
            xc = scratch[: xs[j].numel()].view(xs[j].shape).copy_(xs[j])
            xc -= xc.mean(0)
            carried = z @ xc  # (L, d_j); as xcᵀzᵀ it takes MKL 6x longer
            ff[:, j] = torch.linalg.vecdot(carried, carried)
            kx[j] = torch.linalg.vecdot(xc, xc)
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
    ws, zs, shares, formed = directions_and_grams(features, directions=kern.name != "linear")
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
            c, o = _carried(xs, [z[batch] for z in zs], estimator, formed, batch)
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
