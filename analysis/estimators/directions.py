"""Each layer's top principal direction over the whole sample, exactly, at any width.

The direction is the top right singular vector of a layer's centred features X (n × d), in
float64. It comes from the smaller of X's two Grams, XXᵀ (n × n) or XᵀX (d × d), so a
224-pixel Mixer's blocks (10⁵ features a sample, a few hundred samples) cost an n × n
problem: formed up to :data:`FORM_LIMIT` wide (layers of one size solved together), applied
without forming it past that; block Krylov with Rayleigh-Ritz to a residual of
:data:`RESIDUAL`·λ_1, the dense eigensolver for what it leaves. :mod:`analysis.estimators.spectrum`
removes the direction from each batch (the sensitivity).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

import numpy as np
import torch

__all__ = [
    "CHUNK",
    "FORM_LIMIT",
    "FormedGrams",
    "directions_and_grams",
    "top_directions",
]

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
# Where the Grams are on a GPU, the Ritz matrices (at most KRYLOV_BLOCK · KRYLOV_STEPS wide)
# are solved on the host: on an H100 the whole-sample step of bench_gpu.py's timm pair took
# 0.19 s that way against 0.25 s with them on the GPU. Grams that Krylov leaves unconverged
# (up to FORM_LIMIT wide) stay on the GPU: 26 of 256 × 256 took 0.06 s there, 0.11 s on 16
# host cores.
EIGH_ON_HOST = True


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


def _eigh(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh`` of a batch of symmetric matrices, small ones on the host where
    :data:`EIGH_ON_HOST`."""
    on_host = a.device.type != "cpu" and EIGH_ON_HOST and a.shape[-1] <= KRYLOV_BLOCK * KRYLOV_STEPS
    vals, vecs = torch.linalg.eigh(a.cpu() if on_host else a)
    return vals.to(a.device), vecs.to(a.device)


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
        vals, vecs = _eigh((small[:, :used, :used] + small[:, :used, :used].mT) / 2)
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
        vals, vecs = _eigh(layers[0].gram()[None] if formed is None else formed[left])
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
    ws, zs, shares, _ = directions_and_grams(features)
    return ws, zs, shares


def directions_and_grams(
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
        # every layer has the same n, so a group of one size is all XXᵀ (m = n) or all XᵀX
        if grams is not None and layers[0].samples_short:
            formed.append((members, grams))
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
