"""Calibrated CKA: permutation null, p-values, layer spectra, top-component sensitivity, twins.

Expectations come from the textbook formulas in ``conftest`` (``ref``) or from NumPy
linear algebra written here, never from the code under test.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import models
from analysis import AnalysisError, cka_test, random_init_twin
from analysis.estimators import directions
from analysis.estimators.directions import top_directions
from analysis.estimators.hsic import centred_rows
from analysis.estimators.kernels import parse_kernel
from analysis.estimators.spectrum import layer_spectra, whole_sample_sensitivity
from analysis.inference.permutation_null import accumulate_null, summarise_null


def test_identical_features_give_cka_one_and_the_smallest_p() -> None:
    x = np.random.default_rng(0).normal(size=(80, 6))
    for batch_size in (None, 40):
        res = cka_test(x, x, permutations=99, seed=1, batch_size=batch_size)
        assert res.cka == pytest.approx(1.0, abs=1e-12)
        assert res.p_value == 1 / 100  # the +1 correction: never 0, at least 1/(P+1)
        assert res.null.shape == (99,) and res.null.max() < 0.5


def test_independent_features_give_roughly_uniform_p_values() -> None:
    ps = []
    for seed in range(60):
        rng = np.random.default_rng(100 + seed)
        x, y = rng.normal(size=(40, 5)), rng.normal(size=(40, 3))
        ps.append(cka_test(x, y, permutations=99, seed=seed).p_value)
    p = np.array(ps)
    assert np.mean(p < 0.05) <= 0.15
    # roughly uniform: each half of [0, 1] holds a fair share
    assert 0.3 <= np.mean(p < 0.5) <= 0.7
    assert p.min() >= 1 / 100


def test_null_mean_is_near_zero_and_dependence_is_detected() -> None:
    rng = np.random.default_rng(5)
    z = rng.normal(size=(120, 2))
    x = np.hstack([z, rng.normal(size=(120, 4))])
    y = np.hstack([z @ rng.normal(size=(2, 2)), rng.normal(size=(120, 3))])
    res = cka_test(x, y, permutations=199, seed=0)
    # the unbiased HSIC averages exactly 0 over all permutations; 199 of them come close
    assert abs(res.null_mean) < 0.02
    assert res.null_q95 < res.cka and res.p_value == 1 / 200
    assert np.mean(res.null) == pytest.approx(res.null_mean)
    assert np.quantile(res.null, 0.95) == pytest.approx(res.null_q95)
    assert res.p_value == (1 + np.sum(res.null >= res.cka)) / 200


@pytest.mark.parametrize("kernel", ["linear", "rbf"])
def test_cka_and_p_are_invariant_to_rotation_and_isotropic_scaling(kernel: str) -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(60, 5))
    y = x[:, :3] @ rng.normal(size=(3, 4)) + 2.0 * rng.normal(size=(60, 4))
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))  # a random orthogonal matrix
    base = cka_test(x, y, permutations=50, kernel=kernel, seed=3, batch_size=30)
    moved = cka_test(3.5 * x @ q, y, permutations=50, kernel=kernel, seed=3, batch_size=30)
    assert moved.cka == pytest.approx(base.cka, abs=1e-10)
    np.testing.assert_allclose(moved.null, base.null, atol=1e-10)
    assert moved.p_value == base.p_value


@pytest.mark.parametrize("estimator", ["unbiased", "biased"])
def test_fast_null_equals_brute_force(estimator: str, ref: types.SimpleNamespace) -> None:
    """Three 'models' (2, 3 and 1 layers), two batches, five permutations per batch and model.

    The brute force permutes the first layer's features of each cell (in stacked order) by its
    model's permutation of the batch and recomputes the minibatch HSIC by the textbook formula.
    """
    rng = np.random.default_rng(11)
    sizes, owner = [2, 3, 1], [0, 0, 1, 1, 1, 2]
    n, count, bounds = 20, 5, [slice(0, 12), slice(12, 20)]
    feats = [rng.normal(size=(n, d)) for d in (3, 7, 4, 5, 2, 6)]
    feats[3] += feats[0][:, :1]  # some dependence, so the observed cells differ from the null
    perms = [
        rng.permuted(np.tile(np.arange(s.stop - s.start), (3, count, 1)), axis=2) for s in bounds
    ]
    sums = torch.zeros(count, 6, 6, dtype=torch.float64)
    hsic = np.zeros((6, 6))
    for s, pb in zip(bounds, perms, strict=True):
        grams = torch.stack([torch.from_numpy(ref.gram(f[s], "linear")) for f in feats])
        accumulate_null(
            sums,
            centred_rows(grams, estimator),
            sizes,
            torch.from_numpy(pb),
            estimator,
            torch.float64,
        )
        for i in range(6):
            for j in range(6):
                hsic[i, j] += ref.hsic(
                    ref.gram(feats[i][s], "linear"), ref.gram(feats[j][s], "linear"), estimator
                )
    summary, null = summarise_null(sums.numpy(), hsic, sizes)

    want = np.zeros((count, 6, 6))
    for p in range(count):
        for i in range(6):
            for j in range(i, 6):
                h = 0.0
                for s, pb in zip(bounds, perms, strict=True):
                    xi = feats[i][s][pb[owner[i], p]]  # the earlier side, shuffled
                    h += ref.hsic(
                        ref.gram(xi, "linear"), ref.gram(feats[j][s], "linear"), estimator
                    )
                want[p, i, j] = want[p, j, i] = h / np.sqrt(hsic[i, i] * hsic[j, j])
    np.testing.assert_allclose(null, want, rtol=1e-9, atol=1e-12)
    observed = hsic / np.sqrt(np.outer(np.diag(hsic), np.diag(hsic)))
    np.testing.assert_array_equal(summary.p_value, (1 + (want >= observed - 1e-6).sum(0)) / 6)
    np.testing.assert_allclose(summary.null_mean, want.mean(0), atol=1e-12)
    np.testing.assert_allclose(summary.null_q95, np.quantile(want, 0.95, axis=0), atol=1e-12)


def test_layer_spectra_of_known_spectra() -> None:
    """k orthonormal centred directions of equal variance: effective dimension k, share 1/k;
    a general matrix against its singular values."""
    rng = np.random.default_rng(2)
    a = rng.normal(size=(50, 6))
    q, _ = np.linalg.qr(a - a.mean(0))  # columns orthonormal and orthogonal to 1
    b = rng.normal(size=(50, 9)) * np.geomspace(4, 0.2, 9)
    sv = np.linalg.svd(b - b.mean(0), compute_uv=False) ** 2
    grams = torch.from_numpy(np.stack([(3 * q) @ (3 * q).T, b @ b.T]))
    pr, share = layer_spectra(grams)
    for estimator in ("biased", "unbiased"):  # ‖HKH‖² from either estimator's centred rows
        rows = centred_rows(grams, estimator)
        again, _ = layer_spectra(grams, top=False, rows=rows, estimator=estimator)
        np.testing.assert_allclose(again, pr, rtol=1e-12)
    assert pr[0].item() == pytest.approx(6, rel=1e-5)
    assert share[0].item() == pytest.approx(1 / 6, rel=1e-4)
    assert pr[1].item() == pytest.approx(sv.sum() ** 2 / (sv**2).sum(), rel=1e-5)
    assert share[1].item() == pytest.approx(sv[0] / sv.sum(), rel=1e-4)


@pytest.mark.parametrize(
    ("shape", "chunk"),
    [
        ((300, 200), directions.CHUNK),  # XᵀX formed, the float64 copy whole
        ((120, 400), 4096),  # XXᵀ formed from slabs of 34 features
        ((600, 700), directions.CHUNK),  # past FORM_LIMIT: XXᵀ applied as X(Xᵀ·)
        ((700, 600), 4096),  # XᵀX applied as Xᵀ(X·), slabs of 6 samples
    ],
)
def test_top_directions_of_wide_layers_match_the_svd(
    shape: tuple[int, int], chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layers wide enough for the Krylov path, the top two variances 1 % apart (trained layers
    come this close), by each route to the smaller Gram, a narrow and two constant layers
    beside them: each direction is the SVD's to 1e-9 and carries the SVD's share; a constant
    layer has no direction."""
    monkeypatch.setattr(directions, "CHUNK", chunk)
    assert (min(shape) > directions.FORM_LIMIT) == (min(shape) == 600)
    rng = np.random.default_rng(5)
    n, d = shape
    layers = []
    for k in range(3):
        basis, _ = np.linalg.qr(rng.normal(size=(d, d)))
        sd = np.concatenate([[10.0, 9.95], np.geomspace(4.0, 0.1, d - 2)]) * (k + 1)
        layers.append(rng.normal(size=(n, d)) / np.sqrt(n) * sd @ basis.T + 3.0)
    # constant layers: a power of two, and 0.1 in float32, whose float32 mean is off by ~1e-8
    layers += [rng.normal(size=(n, 7)), np.full((n, d), 2.0), np.full((n, d), np.float32(0.1))]
    ws, zs, shares = top_directions([torch.from_numpy(x) for x in layers])
    for x, w, z, share in zip(layers[:4], ws, zs, shares, strict=False):
        xc = x - x.mean(0)
        _, sv, vt = np.linalg.svd(xc, full_matrices=False)
        assert abs(float(w.numpy() @ vt[0])) == pytest.approx(1.0, abs=1e-9)
        np.testing.assert_allclose(np.abs(z.numpy()), np.abs(xc @ vt[0]), atol=1e-8 * sv[0])
        assert share == pytest.approx(sv[0] ** 2 / (sv**2).sum(), rel=1e-9)
    for k in (4, 5):
        assert np.isnan(shares[k]) and not zs[k].any()


def _drop_top(x: np.ndarray) -> np.ndarray:
    xc = x - x.mean(0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    return xc - np.outer(xc @ vt[0], vt[0])


def test_one_shared_dominant_direction_is_what_the_sensitivity_removes(
    ref: types.SimpleNamespace,
) -> None:
    """X and Y share one strong direction z and are otherwise independent noise: CKA is high,
    and without either side's top component it falls to the CKA of the noise (near 0)."""
    rng = np.random.default_rng(3)
    n = 200
    z = rng.normal(size=(n, 1))
    x = np.hstack([8 * z, rng.normal(size=(n, 10))])
    y = np.hstack([-6 * z, rng.normal(size=(n, 12))])
    grams = torch.from_numpy(np.stack([ref.gram(x, "linear"), ref.gram(y, "linear")]))
    feats = [torch.from_numpy(x), torch.from_numpy(y)]
    g = grams.numpy()
    intact = np.array([[ref.hsic(a, b, "unbiased") for b in g] for a in g])
    cross, own, share = whole_sample_sensitivity(
        feats, [n], parse_kernel("linear"), "unbiased", intact
    )
    self_h = np.diag(intact)
    for k, f in enumerate((x, y)):  # the whole sample's top-component share
        sv = np.linalg.svd(f - f.mean(0), compute_uv=False) ** 2
        assert share[k] == pytest.approx(sv[0] / sv.sum(), rel=1e-9)
    drop_x = cross[0, 1] / np.sqrt(own[0] * self_h[1])
    drop_y = cross[1, 0] / np.sqrt(own[1] * self_h[0])
    assert ref.cka(x, y) > 0.8
    assert drop_x == pytest.approx(ref.cka(_drop_top(x), y), abs=1e-5)
    assert drop_y == pytest.approx(ref.cka(x, _drop_top(y)), abs=1e-5)
    assert abs(drop_x) < 0.1 and abs(drop_y) < 0.1


def test_random_init_twin_is_the_same_architecture_untrained_and_seeded() -> None:
    trained = models.create("mlp_digits", seed=3, embed_dim=16)
    with torch.no_grad():  # stand-in for training: the weights move away from their init
        for p in trained.parameters():
            p.add_(1.0)
    twin = random_init_twin(trained, seed=9)
    again = random_init_twin(trained, seed=9)
    other = random_init_twin(trained, seed=10)
    want_config = dict(trained.atlas_config["config"], seed=9)
    assert twin.atlas_config == {"arch": "mlp_digits", "family": "mlp", "config": want_config}
    fresh = models.create("mlp_digits", **want_config).state_dict()
    ts, tr = twin.state_dict(), trained.state_dict()
    assert list(ts) == list(tr) and all(ts[k].shape == tr[k].shape for k in ts)
    assert all(torch.equal(ts[k], fresh[k]) for k in ts)  # exactly the seeded untrained model
    assert all(torch.equal(ts[k], again.state_dict()[k]) for k in ts)
    assert not all(torch.equal(ts[k], other.state_dict()[k]) for k in ts)
    assert not twin.training
    with pytest.raises(AnalysisError, match="atlas_config"):
        random_init_twin(torch.nn.Linear(3, 2))


def _tiny(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(16, 12), torch.nn.Tanh(), torch.nn.Linear(12, 6)
    )


def test_compare_with_permutations_and_sensitivity(tmp_path: object) -> None:
    from analysis import Atlas, DirectoryGramCache, compare

    net, other = _tiny(0), _tiny(1)
    x = torch.randn(96, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    nets = {"a": net, "b": net, "c": other}
    kw = {"layers": ["1", "3"], "batch_size": 32, "device": "cpu", "seed": 4}
    atlas = compare(nets, x, permutations=49, sensitivity=True, **kw)
    p = atlas.p_values("a", "b")
    assert p is not None and p.shape == (2, 2)
    # a model against an identical copy: CKA 1 on the diagonal, and the smallest p
    np.testing.assert_allclose(np.diag(atlas.matrix("a", "b")), 1.0, atol=1e-6)
    np.testing.assert_array_equal(np.diag(p), 1 / 50)
    pc = atlas.p_values("a", "c")
    assert pc is not None and ((pc >= 1 / 50) & (pc <= 1)).all()
    assert atlas.null_mean("a", "c") is not None and atlas.null_q95("a", "c") is not None
    dims, share = atlas.effective_dim("a"), atlas.top_pc_share("a")
    assert dims is not None and share is not None and (dims >= 1).all() and (share <= 1).all()
    assert atlas.without_top_pc("a", "c") is not None and atlas.sensitivity("a", "c") is not None
    assert isinstance(atlas.warnings, list) and len(atlas.flags) >= len(atlas.warnings)

    back = Atlas.from_dict(atlas.to_dict())
    for name in ("p_values", "null_mean", "null_q95", "sensitivity"):
        np.testing.assert_array_equal(getattr(back, name)("a", "c"), getattr(atlas, name)("a", "c"))
    np.testing.assert_array_equal(back.effective_dim("c"), atlas.effective_dim("c"))

    # the same seed gives the same null, with or without the Gram store
    store = DirectoryGramCache(str(tmp_path))
    keys = {"a": "ka", "b": "ka", "c": "kc"}
    for _ in range(2):  # the second run reads every Gram back
        stored = compare(nets, x, permutations=49, gram_cache=store, model_keys=keys, **kw)
        np.testing.assert_allclose(stored.p_values("a", "c"), pc)

    plain = compare(nets, x, null="none", **kw).to_dict()
    for key in ("p_value", "null_mean", "effective_dim", "cka_without_top_pc"):
        assert key not in plain
    assert "p_value" not in plain["matrices"][0] and "warnings" not in plain["diagnostics"]


@pytest.mark.parametrize("option", [{"permutations": 5}, {"sensitivity": True}])
def test_calibration_needs_minibatch_mode(option: dict[str, object]) -> None:
    from analysis import CompareOptions, OptionsError, compare

    with pytest.raises(OptionsError, match="needs minibatch mode"):
        compare({"a": _tiny(0)}, torch.zeros(8, 1, 4, 4), mode="full", **option)
    assert CompareOptions(**option).model_dump()[next(iter(option))] == next(iter(option.values()))
