"""A comparison split into ranges of batches and combined is the unsplit comparison."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.numpy import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from analysis import (
    AnalysisError,
    Atlas,
    DirectoryGramCache,
    OptionsError,
    Partial,
    batch_count,
    combine,
    compare,
    compare_partial,
    shard_ranges,
)
from analysis.data.images import ImageFiles
from analysis.data.sources import batch_source
from analysis.estimators.hsic import centred_rows
from analysis.estimators.kernels import gram, parse_kernel
from analysis.inference.permutation_null import (
    _STREAM,
    PermutationNull,
    accumulate_null,
    draw_permutations,
)

CALIBRATED = {"bootstrap": 50, "permutations": 20, "sensitivity": True, "seed": 3}
BASE = {"batch_size": 32, "device": "cpu"}


def mlp(seed: int, width: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(), nn.Linear(64, width), nn.Tanh(), nn.Linear(width, 16), nn.ReLU()
    )


@pytest.fixture(scope="module")
def nets() -> dict[str, nn.Module]:
    return {"a": mlp(0, 24), "b": mlp(1, 40)}


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    """300 samples: 10 batches of 32, the last one of 12 (kept)."""
    return torch.randn(300, 1, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def whole(nets: dict[str, nn.Module], images: torch.Tensor) -> Atlas:
    return compare(nets, images, **BASE, **CALIBRATED)


def sharded(nets: dict[str, nn.Module], data: Any, ranges: list[range], **kw: Any) -> Atlas:
    parts = [compare_partial(nets, data, batches=r, **BASE, **CALIBRATED, **kw) for r in ranges]
    return combine(parts)


def assert_same(got: Atlas, want: Atlas) -> None:
    """Every number of the result to 1e-9 and every counter exactly."""
    close = {"rtol": 0, "atol": 1e-9, "equal_nan": True}
    np.testing.assert_allclose(got.hsic, want.hsic, rtol=1e-12)
    np.testing.assert_allclose(got.cka, want.cka, **close)
    for name in ("ci_low", "ci_high", "cka_drop", "layer_effective_dim", "layer_top_share"):
        g, w = getattr(got, name), getattr(want, name)
        assert g is not None and w is not None, name
        np.testing.assert_allclose(g, w, **close, err_msg=name)
    assert got.null is not None and want.null is not None
    for name in ("p_value", "null_mean", "null_q95"):
        g, w = getattr(got.null, name), getattr(want.null, name)
        np.testing.assert_allclose(g, w, **close, err_msg=name)
    assert got.n == want.n and got.config == want.config and got.layers == want.layers
    exact = ["n_used", "batches", "dropped_batches", "dropped_samples", "forward_passes"]
    exact += ["gram_cache", "undefined_layers", "bootstrap"]
    assert {k: got.diagnostics[k] for k in exact} == {k: want.diagnostics[k] for k in exact}
    assert set(got.diagnostics) == set(want.diagnostics)
    assert got.diagnostics["warnings"] == want.diagnostics["warnings"]


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_shards_combine_to_the_unsplit_comparison(
    nets: dict[str, nn.Module], images: torch.Tensor, whole: Atlas, shards: int
) -> None:
    ranges = shard_ranges(10, shards)
    assert batch_count(images, 32) == 10
    got = sharded(nets, images, ranges[::-1])  # given out of order
    assert_same(got, whole)
    assert whole.n == 300 and whole.diagnostics["forward_passes"] == {"a": 10, "b": 10}
    # the calibration is really there: a model against itself gets the smallest p-value
    p = whole.p_values("a", "a")
    assert p is not None and np.allclose(np.diag(p), 1 / 21)


def test_a_shard_reads_and_runs_only_its_batches(
    nets: dict[str, nn.Module], images: torch.Tensor
) -> None:
    calls: list[tuple[int, int]] = []
    part = compare_partial(
        nets, images, batches=range(3, 5), on_batch=lambda d, t: calls.append((d, t)), **BASE
    )
    assert calls == [(1, 2), (2, 2)]
    assert part.counters["forwards"] == {"a": 2, "b": 2} and part.counters["n"] == 64
    assert (part.start, part.stop, part.total_batches) == (3, 5, 10)
    # batches 3 and 4 are samples 96..159: the first two batches of those samples alone
    alone = compare(nets, images[96:160], **BASE)
    np.testing.assert_allclose(part.hsic, alone.hsic, rtol=1e-12)


def test_sources_slice_arrays_and_decode_only_the_range(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.arange(10 * 2 * 2, dtype=torch.float32).reshape(10, 1, 2, 2)
    got = list(batch_source(x, 3, None).indexed(range(1, 3)))
    assert [i for i, _ in got] == [1, 2]
    assert torch.equal(torch.cat([b for _, b in got]), x[3:9])
    last = list(batch_source(x.numpy(), 3, None).indexed(range(3, 4)))
    assert last[0][0] == 3 and torch.equal(last[0][1], x[9:])

    blobs = []
    for v in range(7):
        buf = io.BytesIO()
        Image.fromarray(np.full((5, 5), v * 30, dtype=np.uint8)).save(buf, format="PNG")
        blobs.append(buf.getvalue())
    paths = tuple(f"c/{v}.png" for v in range(7))
    files = ImageFiles("tiny", tuple(blobs), paths, np.zeros(7, dtype=np.int64), ["c"], 1)
    decoded: list[int] = []
    original = ImageFiles.image
    monkeypatch.setattr(ImageFiles, "image", lambda self, i: decoded.append(i) or original(self, i))
    src = batch_source(files, 2, None, files=True)
    batches = list(src.indexed(range(2, 4)))
    assert decoded == [] and [i for i, _ in batches] == [2, 3]  # decoded when first read
    assert [np.asarray(im)[0, 0] for _, b in batches for im in b] == [120, 150, 180]
    assert sorted(decoded) == [4, 5, 6]


def test_the_null_of_a_batch_comes_from_its_own_seed() -> None:
    """PermutationNull against permutations drawn here from the documented stream."""
    rng = np.random.default_rng(0)
    x, y = torch.from_numpy(rng.normal(size=(12, 3))), torch.from_numpy(rng.normal(size=(12, 2)))
    linear = parse_kernel("linear")
    rows = centred_rows(torch.stack([gram(x, linear), gram(y, linear)]), "unbiased")
    null = PermutationNull([1, 1], 5, 7, "unbiased", torch.device("cpu"), torch.float64)
    null.add(rows, batch=4)
    draw = np.random.default_rng(np.random.SeedSequence([7, _STREAM, 4]))
    perms = torch.from_numpy(np.stack([draw_permutations(draw, 5, 12) for _ in range(2)]))
    want = torch.zeros(5, 2, 2, dtype=torch.float64)
    accumulate_null(want, rows, [1, 1], perms, "unbiased", torch.float64)
    assert torch.equal(null.sums, want)


def test_shards_share_stored_grams_with_the_unsplit_run(
    nets: dict[str, nn.Module], images: torch.Tensor, whole: Atlas, tmp_path: Path
) -> None:
    keys = {"a": "key-a", "b": "key-b"}
    first = DirectoryGramCache(tmp_path / "first")
    stored = sharded(nets, images, shard_ranges(10, 3), gram_cache=first, model_keys=keys)
    np.testing.assert_allclose(stored.cka, whole.cka, atol=1e-9)
    assert stored.diagnostics["gram_cache"]["misses"] == 20
    # the unsplit run finds every Gram the shards stored: no model runs
    again = compare(nets, images, gram_cache=first, model_keys=keys, **BASE, **CALIBRATED)
    assert again.diagnostics["forward_passes"] == {"a": 0, "b": 0}
    assert again.diagnostics["gram_cache"]["hits"] == 20
    assert_same(
        sharded(nets, images, shard_ranges(10, 2), gram_cache=first, model_keys=keys), again
    )

    second = DirectoryGramCache(tmp_path / "second")
    compare(nets, images, gram_cache=second, model_keys=keys, **BASE, **CALIBRATED)
    back = sharded(nets, images, shard_ranges(10, 3), gram_cache=second, model_keys=keys)
    assert back.diagnostics["forward_passes"] == {"a": 0, "b": 0}
    np.testing.assert_allclose(back.cka, whole.cka, atol=1e-9)
    assert back.null is not None and whole.null is not None
    np.testing.assert_allclose(back.null.p_value, whole.null.p_value, atol=1e-9)


def test_a_dropped_last_batch_keeps_its_global_index(nets: dict[str, nn.Module]) -> None:
    x = torch.randn(290, 1, 8, 8, generator=torch.Generator().manual_seed(1))  # last batch: 2
    part = compare_partial(nets, x, batches=range(7, 10), **BASE, **CALIBRATED)
    assert part.counters["dropped"] == [{"batch": 9, "size": 2}]
    assert part.counters["batches"] == 2 and "features" in part.statistics
    assert list(part.statistics["features"]["sizes"]) == [32, 32]
    got = combine([part, compare_partial(nets, x, batches=range(0, 7), **BASE, **CALIBRATED)])
    assert got.diagnostics["dropped_batches"] == [{"batch": 9, "size": 2}]
    assert got.n == 288 and got.diagnostics["dropped_samples"] == 2
    assert_same(got, compare(nets, x, **BASE, **CALIBRATED))
    # a shard of the dropped batch alone holds nothing, and still combines
    alone = compare_partial(nets, x, batches=range(9, 10), **BASE, **CALIBRATED)
    assert alone.counters["n"] == 0 and not alone.hsic.any()
    rest = compare_partial(nets, x, batches=range(0, 9), **BASE, **CALIBRATED)
    assert_same(combine([alone, rest]), got)


def identical(a: np.ndarray, b: np.ndarray) -> bool:
    """Same dtype, shape and bits (NaN included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_save_and_load_round_trip_exactly(
    nets: dict[str, nn.Module], images: torch.Tensor, tmp_path: Path
) -> None:
    part = compare_partial(nets, images, batches=range(2, 6), **BASE, **CALIBRATED)
    path = tmp_path / "part.safetensors"
    part.save(path)
    back = Partial.load(path)
    assert [p.name for p in tmp_path.iterdir()] == ["part.safetensors"]  # no temporary left
    for field in dataclasses.fields(Partial):
        got, want = getattr(back, field.name), getattr(part, field.name)
        if isinstance(want, np.ndarray):
            assert identical(got, want), field.name
        elif field.name == "statistics":
            assert got.keys() == want.keys() and {"null", "spectra", "features"} <= want.keys()
            for key, state in want.items():
                assert got[key].keys() == state.keys(), key
                for name, value in state.items():
                    mine = value.numpy() if isinstance(value, torch.Tensor) else value
                    assert identical(got[key][name], mine), f"{key}.{name}"
        else:
            assert got == want, field.name
    assert path.read_bytes()[:8] != b"\x80\x04\x95"  # not a pickle
    plain = compare_partial(nets, images, batches=range(0, 10), **BASE)
    plain.save(path)
    again = Partial.load(path)
    assert again.statistics.keys() == {"analytic"}  # the default null, and nothing else
    assert np.array_equal(combine([again]).cka, combine([plain]).cka, equal_nan=True)
    (tmp_path / "bad").write_bytes(b"not a safetensors file")
    with pytest.raises(AnalysisError, match="not a readable partial"):
        Partial.load(tmp_path / "bad")
    # a shard file of the format before the statistics protocol is refused in one sentence
    old = tmp_path / "old.safetensors"
    meta = {"partial": json.dumps({"format": "cka-atlas-partial/3"})}
    save_file({"hsic": np.zeros((2, 2))}, str(old), metadata=meta)
    with pytest.raises(AnalysisError, match=r"partial/3, written by an earlier version.*again"):
        Partial.load(old)


def test_combine_refuses_what_does_not_tile_one_comparison(
    nets: dict[str, nn.Module], images: torch.Tensor
) -> None:
    parts = {
        r.start: compare_partial(nets, images, batches=r, **BASE)
        for r in (range(0, 3), range(3, 7), range(7, 10), range(2, 5))
    }
    a, b, c, overlapping = parts[0], parts[3], parts[7], parts[2]
    combine([c, a, b])  # fine in any order
    # shards on two GPUs are parts of one comparison; the atlas names both devices
    on_gpu = dataclasses.replace(c, config=c.config | {"device": "cuda:1"})
    assert combine([a, b, on_gpu]).config["device"] == "cpu, cuda:1"
    with pytest.raises(AnalysisError, match=r"gap: batches \[3, 7\)"):
        combine([a, c])
    with pytest.raises(AnalysisError, match=r"gap: batches \[7, 10\)"):
        combine([a, b])
    with pytest.raises(AnalysisError, match=r"gap: batches \[0, 3\)"):
        combine([b, c])
    with pytest.raises(AnalysisError, match=r"overlap: batches \[2, 3\)"):
        combine([a, overlapping, b, c])
    with pytest.raises(AnalysisError, match="overlap"):
        combine([a, a, b, c])
    with pytest.raises(AnalysisError, match="seed=9"):
        combine([a, b, dataclasses.replace(c, config=c.config | {"seed": 9})])
    with pytest.raises(AnalysisError, match="other models or layers"):
        combine([a, b, dataclasses.replace(c, names=["b", "a"])])
    with pytest.raises(AnalysisError, match="plan of 11 batches"):
        combine([a, b, dataclasses.replace(c, total_batches=11)])
    with pytest.raises(AnalysisError, match="no partials"):
        combine([])
    other = compare_partial(nets, images, batches=range(7, 10), **BASE, kernel="rbf")
    with pytest.raises(AnalysisError, match="kernel"):
        combine([a, b, other])


def test_ranges_that_are_not_part_of_the_plan_are_refused(
    nets: dict[str, nn.Module], images: torch.Tensor
) -> None:
    for bad in (range(0, 11), range(4, 4), range(-1, 3), range(0, 10, 2)):
        with pytest.raises(AnalysisError):
            compare_partial(nets, images, batches=bad, **BASE)
    with pytest.raises(OptionsError, match="mode"):
        compare_partial(nets, images, batches=range(0, 5), **BASE, mode="full")
    full = compare_partial(nets, images, batches=range(0, 10), **BASE, mode="full")
    np.testing.assert_allclose(
        combine([full]).cka, compare(nets, images, **BASE, mode="full").cka, atol=1e-12
    )
    stream = (b for b in images.split(32))
    with pytest.raises(AnalysisError, match="unknown length"):
        compare_partial(nets, stream, batches=range(0, 2), **BASE)


def test_batch_count() -> None:
    x = np.zeros((300, 1, 8, 8), dtype=np.float32)
    assert batch_count(x, 32) == 10 and batch_count(torch.from_numpy(x), 300) == 1
    assert batch_count(x, 1000) == 1 and batch_count(x[:0], 32) == 0
    loader = DataLoader(TensorDataset(torch.from_numpy(x)), batch_size=50)
    assert batch_count(loader, 32) == 6  # a DataLoader's own batches
    with pytest.raises(AnalysisError, match="unknown length"):
        batch_count(iter([torch.from_numpy(x)]), 32)


def test_shard_ranges_tile_the_plan() -> None:
    for total in range(0, 70):
        for shards in range(1, 16):
            ranges = shard_ranges(total, shards)
            assert len(ranges) == min(total, shards)
            assert [i for r in ranges for i in r] == list(range(total))
            assert all(len(r) > 0 and r.step == 1 for r in ranges)
            sizes = {len(r) for r in ranges}
            assert not sizes or max(sizes) - min(sizes) <= 1
    with pytest.raises(AnalysisError):
        shard_ranges(5, 0)
