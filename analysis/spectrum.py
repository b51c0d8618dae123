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
  from the smaller of their two Grams (XXᵀ or XᵀX, :func:`top_directions`).
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

from collections.abc import Callable, Iterator
from functools import partial

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
# The whole-sample top direction (top_directions) is an eigenvector of the smaller of the two
# Grams of a layer's centred features X (n × d): A = XXᵀ (n × n) when n ≤ d, else XᵀX (d × d),
# m × m with m = min(n, d), both in float64. Up to FORM_LIMIT, A is formed: m² · max(n, d)
# multiply-adds in one product, which runs 3-6x faster per multiply-add here than the thin products
# of applying A without forming it (about 2 · KRYLOV_BLOCK · steps · m · max(n, d) ≈ 100 m ·
# max(n, d)), so forming costs less up to m ≈ 500. Past it, A is applied as X(Xᵀ·) or Xᵀ(X·).
FORM_LIMIT = 512
# The float64 copy of X is made CHUNK elements at a time (16 MB), so a wide layer (a 224-pixel
# Mixer's blocks hold 10⁵ features per sample) never needs n·d float64 at once.
CHUNK = 1 << 21
# Block Krylov on A: vectors added to the basis per step, steps before the dense eigensolver
# takes over, and the residual that stops it. A residual of RESIDUAL·λ_1 puts the direction
# within an angle RESIDUAL·λ_1/(λ_1 - λ_2) of the exact eigenvector: 1e-7 where λ_2 = 0.99 λ_1,
# below what moves a CKA value in its sixth decimal (10x tighter stalls at float64's floor on
# trained layers: ~1e-10). Trained digits layers (λ_2/λ_1 up to 0.99, λ_9/λ_1 0.05-0.4)
# converge in 4-6 steps of 8 vectors.
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


class _CentredSlabs:
    """A layer's centred features as S (m × D): X if n ≤ d, else Xᵀ, so that A = SSᵀ is the
    smaller Gram; float64 slabs of S's columns, :data:`CHUNK` elements at a time, copied into
    one buffer a pass (a fresh allocation per slab costs the kernel's page zeroing), or kept
    whole where S fits in one slab.

    Means are float64, so a constant feature centres to exactly 0: where S's columns are
    features, each slab's own columns' (a float64 mean over the rows of a 10⁵-wide float32
    layer is 15x slower than a pass of the slab); else one mean over all samples first.
    """

    def __init__(self, x: torch.Tensor) -> None:
        n, d = x.shape
        self.x, self.samples_short = x, n <= d
        self.mean = None if self.samples_short else x.mean(0, dtype=torch.float64)
        self.m, self.long = (n, d) if self.samples_short else (d, n)
        self.step = max(1, CHUNK // self.m)
        self.whole = next(iter(self._slabs()))[1] if self.step >= self.long else None

    def _slabs(self) -> Iterator[tuple[slice, torch.Tensor]]:
        buffer = self.x.new_empty(self.m * min(self.step, self.long), dtype=torch.float64)
        for start in range(0, self.long, self.step):
            part = slice(start, min(start + self.step, self.long))
            width = part.stop - part.start
            if self.mean is None:  # columns of S are features: centre each
                slab = buffer[: self.m * width].view(self.m, width).copy_(self.x[:, part])
                yield part, slab.sub_(slab.mean(0))
            else:  # columns of S are samples
                rows = buffer[: self.m * width].view(width, self.m).copy_(self.x[part])
                yield part, rows.sub_(self.mean).T

    def __iter__(self) -> Iterator[tuple[slice, torch.Tensor]]:
        if self.whole is not None:
            return iter([(slice(0, self.long), self.whole)])
        return self._slabs()

    def gram(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """A = SSᵀ (m × m), into ``out`` where given."""
        a = self.x.new_empty(self.m, self.m, dtype=torch.float64) if out is None else out
        for part, s in self:
            if part.start == 0:
                torch.mm(s, s.T, out=a)
            else:
                a.addmm_(s, s.T)
        return a

    def apply(self, v: torch.Tensor) -> torch.Tensor:
        """A v = S (Sᵀ v) without forming A (v: (…, m, b))."""
        out = torch.zeros_like(v)
        for _, s in self:
            out += s @ (s.T @ v)
        return out

    def transpose_times(self, u: torch.Tensor) -> torch.Tensor:
        """Sᵀ u (D,)."""
        out = u.new_empty(self.long)
        for part, s in self:
            out[part] = s.T @ u
        return out


def _krylov_top(
    apply: Callable[[torch.Tensor], torch.Tensor], shape: tuple[int, int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(λ_1 (G,), unit u_1 (G, m), converged (G,)) of G symmetric positive semi-definite m × m
    operators at once (``apply``: (G, m, b) ↦ A_g times each), converged where the residual
    is at most :data:`RESIDUAL`·λ_1 within :data:`KRYLOV_STEPS` steps.

    Block Krylov with Rayleigh-Ritz: the basis grows by A times its newest block, so after k
    steps it holds every polynomial of degree < k in A applied to the start, and the top Ritz
    pair converges at a rate set by the gap between λ_1 and the first eigenvalue past the block,
    not by λ_2/λ_1 (trained layers reach 0.99).
    """
    count, m = shape
    k = KRYLOV_BLOCK
    gen = torch.Generator(device="cpu").manual_seed(0)
    size = k * KRYLOV_STEPS
    basis = torch.empty(count, m, size, dtype=torch.float64, device=device)
    image, small = torch.empty_like(basis), basis.new_empty(count, size, size)
    start = torch.randn(m, k, generator=gen, dtype=torch.float64).to(device)
    basis[..., :k] = torch.linalg.qr(start)[0]
    used = 0
    while True:
        block = slice(used, used + k)
        image[..., block] = apply(basis[..., block])
        col = basis[..., : block.stop].mT @ image[..., block]  # A is symmetric: row = col ᵀ
        small[:, : block.stop, block], small[:, block, : block.stop] = col, col.mT
        used = block.stop
        vals, vecs = torch.linalg.eigh((small[:, :used, :used] + small[:, :used, :used].mT) / 2)
        lam, top = vals[:, -1], vecs[..., -1:]
        u = (basis[..., :used] @ top).squeeze(2)
        residual = (image[..., :used] @ top).squeeze(2) - lam[:, None] * u
        done = (torch.linalg.vector_norm(residual, dim=1) <= RESIDUAL * lam) | (lam <= 0)
        if bool(done.all()) or used == size:
            return lam.clamp(min=0), u, done  # λ ≤ 0: a constant layer, nothing to remove
        grown, old = image[..., block], basis[..., :used]
        grown = grown - old @ (old.mT @ grown)
        grown = grown - old @ (old.mT @ grown)  # twice: the basis stays orthonormal
        basis[..., used : used + k] = torch.linalg.qr(grown)[0]


def _top_eigenpairs(
    layers: list[_CentredSlabs],
) -> tuple[torch.Tensor, torch.Tensor, list[float], torch.Tensor | None]:
    """(λ_1 (G,), unit u_1 (G, m), tr A per layer, the formed A (G, m, m) or None) of the
    smaller Grams A of layers whose A has one size m: formed and solved together up to
    :data:`FORM_LIMIT`, one layer applied without forming past it. Block Krylov where m
    leaves room for a basis; the dense eigensolver where it does not, or answers layers the
    Krylov steps leave unconverged, so the answer is always the exact top pair to rounding."""
    m, device = layers[0].m, layers[0].x.device
    formed = None
    if m <= FORM_LIMIT:
        formed = layers[0].x.new_empty(len(layers), m, m, dtype=torch.float64)
        for layer, out in zip(layers, formed, strict=True):
            layer.gram(out)
        totals = formed.diagonal(dim1=1, dim2=2).sum(1).tolist()
    else:
        totals = [sum(float(s.square().sum()) for _, s in layer) for layer in layers]
    if m > KRYLOV_BLOCK * KRYLOV_STEPS:
        # past FORM_LIMIT a group is one layer (top_directions), so its apply broadcasts
        apply = partial(torch.matmul, formed) if formed is not None else layers[0].apply
        lam, u, done = _krylov_top(apply, (len(layers), m), device)
    else:
        lam = torch.zeros(len(layers), dtype=torch.float64, device=device)
        u, done = lam.new_empty(len(layers), m), torch.zeros(len(layers), dtype=torch.bool)
    left = torch.nonzero(~done).flatten().tolist()
    if left:  # one batched call (past FORM_LIMIT a group is one layer)
        vals, vecs = torch.linalg.eigh(layers[0].gram()[None] if formed is None else formed[left])
        lam[left], u[left] = vals[:, -1].clamp(min=0), vecs[..., -1]
    return lam, u, totals, formed


# Layers whose whole-sample Gram XXᵀ was formed (n ≤ d, n ≤ FORM_LIMIT): their indices and
# those Grams (G, n, n), float64, from the centred features.
FormedGrams = list[tuple[list[int], torch.Tensor]]


def top_directions(
    features: list[torch.Tensor],
) -> tuple[list[torch.Tensor], list[torch.Tensor], np.ndarray]:
    """Each layer's top principal direction over all its samples (n, d_i) as a unit float64
    (d_i,), the centred samples' projections on it (n,), and the share of the layer's variance
    it carries (λ_1 / tr XᵀX; NaN for a constant layer).

    With S the centred features arranged so that A = SSᵀ is the smaller Gram, the top
    eigenvector u of A gives the other side as Sᵀu: if A = XXᵀ, u is the projections' direction
    (z = √λ_1 u) and w = Xᵀu/√λ_1; if A = XᵀX, w = u and z = Xw.
    """
    ws, zs, shares, _ = _top_directions(features)
    return ws, zs, shares


def _top_directions(
    features: list[torch.Tensor], directions: bool = True
) -> tuple[list[torch.Tensor], list[torch.Tensor], np.ndarray, FormedGrams]:
    """:func:`top_directions`, and the whole-sample Grams XXᵀ it formed on the way. Without
    ``directions`` a layer whose Gram was XXᵀ gets no w (an empty tensor): its projections
    z come from u alone, and w would cost another pass over its features."""
    ws: list[torch.Tensor] = [torch.empty(0)] * len(features)
    zs, shares = list(ws), np.full(len(features), np.nan)
    groups: dict[int, list[int]] = {}
    formed: FormedGrams = []
    for i, x in enumerate(features):
        m = min(x.shape)
        groups.setdefault(m if m <= FORM_LIMIT else -1 - i, []).append(i)  # formed: by size
    for members in groups.values():
        layers = [_CentredSlabs(features[i]) for i in members]
        lams, us, totals, grams = _top_eigenpairs(layers)
        short = [k for k, layer in enumerate(layers) if layer.samples_short]
        if grams is not None and short:
            formed.append(([members[k] for k in short], grams[short]))
        for i, layer, lam, u, total in zip(members, layers, lams.tolist(), us, totals, strict=True):
            if layer.samples_short:
                z = u * lam**0.5
                w = layer.transpose_times(u) if directions else None
            else:
                w, z = u, layer.transpose_times(u)
            if lam > 0:
                shares[i] = lam / total
            else:
                z = torch.zeros_like(z)
            zs[i] = z
            if w is not None:
                ws[i] = w / torch.linalg.vector_norm(w).clamp(min=1e-300)
    return ws, zs, shares, formed


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
    are diag(HGH) (a common shift of X's rows changes neither): where :func:`_top_directions`
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
        means = g.mean(2)
        kx[members] = g.diagonal(dim1=1, dim2=2) - 2 * means + means.mean(1, keepdim=True)
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
    ws, zs, shares, formed = _top_directions(features, directions=kern.name != "linear")
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
