"""Datasets: the built-in digits, .npz arrays and ImageFolder trees, and every malformed input."""

from __future__ import annotations

import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest

from analysis import DatasetError, DatasetTooLarge, describe_dataset, load_dataset, training_data
from analysis.data.datasets import ImageDataset, content_sha256, load_image_folder, load_npz
from analysis.data.npz import NpzArchive
from tests.files import png_bytes, zip_bytes


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


# --- digits -------------------------------------------------------------------------------------


def test_digits_splits_partition_the_1797_images() -> None:
    train, test, full = (load_dataset("digits", split=s) for s in ("train", "test", "all"))
    assert (len(train), len(test), len(full)) == (1347, 450, 1797)
    assert train.shape == test.shape == (1, 8, 8)
    assert train.x.dtype == np.float32 and full.x.min() >= 0.0 and full.x.max() == 1.0
    # The split is stratified: each class keeps its share of the test set to within one image.
    assert test.y is not None and full.y is not None
    expected = np.bincount(full.y) * 450 / 1797
    assert np.all(np.abs(np.bincount(test.y) - expected) <= 1)
    # train and test are disjoint and together give every image exactly once.
    rows = {row.tobytes() + bytes([label]) for row, label in zip(full.x, full.y, strict=True)}
    ours = [
        row.tobytes() + bytes([label])
        for d in (train, test)
        for row, label in zip(d.x, d.y, strict=True)  # type: ignore[arg-type]
    ]
    assert len(ours) == 1797 and set(ours) == rows


def test_digits_is_stable() -> None:
    a, b = load_dataset("digits"), load_dataset("digits", split="test")
    assert a.sha256 == b.sha256 and len(a.sha256) == 64
    assert np.array_equal(a.x, b.x)
    assert a.sha256 != load_dataset("digits", split="train").sha256


def test_unknown_digits_split() -> None:
    with pytest.raises(DatasetError, match="split 'val'"):
        load_dataset("digits", split="val")


def test_training_data_is_digits_fixed_split_or_a_whole_file(tmp_path: Path) -> None:
    """What models.train gets: digits' (train, test) splits, hashed as the module documents
    (sklearn's split with seed 0, a quarter for testing); a file whole; mixed sizes and
    unlabelled images refused."""
    import hashlib

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    train, test = training_data("digits")  # type: ignore[misc]
    bunch = load_digits()
    index = np.arange(len(bunch.target))
    parts = train_test_split(index, test_size=0.25, stratify=bunch.target, random_state=0)
    for data, rows, name in zip((train, test), parts, ("digits:train", "digits:test"), strict=True):
        chosen = np.sort(rows)
        x = np.ascontiguousarray((bunch.images[chosen] / 16.0).astype(np.float32)[:, None])
        y = bunch.target[chosen].astype(np.int64)
        digest = hashlib.sha256(b"cka-atlas-dataset-v1")
        for a in (x, y):
            digest.update(repr(a.shape).encode())
            digest.update(a.tobytes())
        assert (data.name, data.sha256) == (name, digest.hexdigest())
    x = np.zeros((3, 1, 8, 8), np.float32)
    whole = training_data(_npz(tmp_path / "mine.npz", x=x, y=np.arange(3)))
    assert not isinstance(whole, tuple) and whole.name == "mine.npz" and len(whole) == 3
    with pytest.raises(DatasetError, match=r"'bare.npz' has no labels, so no model can be"):
        training_data(_npz(tmp_path / "bare.npz", x=x))
    mixed = tmp_path / "mixed.zip"
    blobs = [png_bytes(np.zeros(size, np.uint8)) for size in ((4, 6), (5, 5))]
    mixed.write_bytes(zip_bytes([("a/0.png", blobs[0]), ("b/1.png", blobs[1])]))
    with pytest.raises(DatasetError, match="different sizes; training needs one size"):
        training_data(mixed)


# --- npz ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["NHW", "NHWC", "NCHW"])
def test_npz_layouts_give_nchw(tmp_path: Path, layout: str) -> None:
    rng = np.random.default_rng(0)
    nchw = rng.integers(0, 256, size=(5, 3 if layout != "NHW" else 1, 6, 7), dtype=np.uint8)
    stored = {"NHW": nchw[:, 0], "NHWC": nchw.transpose(0, 2, 3, 1), "NCHW": nchw}[layout]
    data = load_dataset(_npz(tmp_path / "d.npz", x=stored, y=np.arange(5)))
    assert data.x.shape == nchw.shape
    np.testing.assert_array_equal(data.x, nchw.astype(np.float32) / 255.0)
    assert data.y is not None and data.y.dtype == np.int64


def test_npz_hash_depends_on_content_not_layout(tmp_path: Path) -> None:
    x = np.random.default_rng(1).random((4, 2, 5, 5), dtype=np.float32)
    first = load_dataset(_npz(tmp_path / "a.npz", x=x))
    second = load_dataset(_npz(tmp_path / "b.npz", x=x.transpose(0, 2, 3, 1)))
    assert first.sha256 == second.sha256
    np.testing.assert_array_equal(first.x, x)  # floats are kept as they are
    x[0, 0, 0, 0] += 1.0
    assert load_dataset(_npz(tmp_path / "c.npz", x=x)).sha256 != first.sha256


@pytest.mark.parametrize("stored", ["NHWC uint8", "NCHW float32 Fortran", "NHW >f8"])
def test_npz_read_in_many_slices_is_the_array(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stored: str
) -> None:
    """With slices of a few rows, the images, labels and hash are those of the whole array
    converted at once, and describe_dataset gives what load_dataset gives."""
    monkeypatch.setattr("analysis.data.npz.SLICE_BYTES", 500)
    rng = np.random.default_rng(4)
    y = rng.integers(0, 3, 23)
    if stored == "NHWC uint8":
        x = rng.integers(0, 256, (23, 6, 5, 3), dtype=np.uint8)
        nchw = x.transpose(0, 3, 1, 2).astype(np.float32) / 255
    elif stored == "NCHW float32 Fortran":
        x = np.asfortranarray(rng.random((23, 2, 6, 5), dtype=np.float32))
        nchw = np.ascontiguousarray(x)
    else:
        x = rng.random((23, 7, 4)).astype(">f8")
        nchw = x.astype(np.float32)[:, None]
    path = _npz(tmp_path / "d.npz", x=x, y=y)
    with NpzArchive(path, "d.npz", max_bytes=1 << 20, max_members=10) as archive:
        assert len(list(archive.slices("x"))) > 3  # the case under test: many slices
    data = load_dataset(path)
    np.testing.assert_array_equal(data.x, nchw)
    assert data.sha256 == content_sha256(nchw, y)
    info = describe_dataset(path)
    assert (info.sha256, len(info), info.shape, info.classes) == (
        data.sha256,
        23,
        nchw.shape[1:],
        ["0", "1", "2"],
    )


@pytest.mark.parametrize("sizes", [((6, 6), (6, 6)), ((4, 6), (5, 5))])
def test_describe_an_image_folder_as_it_loads(
    tmp_path: Path, sizes: tuple[tuple[int, int], ...]
) -> None:
    rng = np.random.default_rng(5)
    entries = [
        (f"top/{cls}/{i}.png", png_bytes(rng.integers(0, 256, (*size, 3), dtype=np.uint8)))
        for i, (cls, size) in enumerate(zip("ab", sizes, strict=True))
    ]
    archive = zip_bytes(entries)
    data = load_image_folder(archive)
    path = tmp_path / "f.zip"
    path.write_bytes(archive)
    info = describe_dataset(path)
    assert (info.name, info.sha256, len(info), info.shape, info.classes) == (
        "f.zip",
        load_image_folder(path).sha256,
        2,
        data.shape,
        ["a", "b"],
    )
    assert data.sha256 == load_image_folder(path).sha256


def test_a_dataset_over_its_decoded_limit_is_refused_before_decoding(tmp_path: Path) -> None:
    path = _npz(tmp_path / "big.npz", x=np.zeros((10, 8, 8), np.uint8))  # 2560 B as float32
    assert len(load_npz(path, max_decoded=2560)) == 10
    with pytest.raises(DatasetTooLarge, match="holds 10 images of 1×8×8: 2560 bytes as float32"):
        describe_dataset(path, max_decoded=2559)
    folder = zip_bytes([(f"a/{i}.png", png_bytes(np.zeros((8, 8), np.uint8))) for i in range(10)])
    with pytest.raises(DatasetTooLarge, match="more than the 2559 bytes allowed"):
        load_image_folder(folder, max_decoded=2559)


def test_npz_from_bytes(tmp_path: Path) -> None:
    path = _npz(tmp_path / "a.npz", x=np.zeros((3, 4, 4), dtype=np.uint8))
    assert len(load_npz(path.read_bytes())) == 3


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"x": np.zeros((4, 4), np.float32)}, "not 2-dimensional"),
        ({"x": np.zeros((2, 1, 1, 4, 4), np.float32)}, "not 5-dimensional"),
        ({"x": np.zeros((2, 9, 9, 9), np.float32)}, "no axis of at most 4 channels"),
        ({"x": np.zeros((0, 4, 4), np.uint8)}, "holds no samples"),
        ({"x": np.full((2, 4, 4), np.nan, np.float32)}, "NaN or infinite"),
        ({"x": np.array([[[np.inf]]], np.float32)}, "1 pixel values that are NaN or infinite"),
        ({"x": np.zeros((3, 4, 4), np.uint8), "y": np.arange(2)}, "3 images but 2 labels"),
        ({"x": np.zeros((3, 4, 4), np.uint8), "y": np.ones(3) * 0.5}, "must be integers"),
        ({"x": np.zeros((3, 4, 4), np.uint8), "y": -np.ones(3, int)}, "non-negative"),
        ({"x": np.zeros((3, 4, 4), np.int32)}, "must be uint8"),
        ({"x": np.array(["a", "b"])}, "uint8 or float"),
        ({"images": np.zeros((3, 4, 4), np.uint8)}, "no array named 'x'"),
    ],
)
def test_npz_errors_are_one_sentence(
    tmp_path: Path, arrays: dict[str, np.ndarray], message: str
) -> None:
    with pytest.raises(DatasetError, match=message) as info:
        load_dataset(_npz(tmp_path / "bad.npz", **arrays))
    assert "\n" not in str(info.value) and str(info.value).endswith(".")


def test_npz_value_range_is_uint8_declared_or_inferred(tmp_path: Path) -> None:
    """What stands for black and white: uint8 by its type, a declared ``value_range`` (which
    names other images, so another hash), else the first of [0, 1], [-1, 1], [0, 255] that
    holds every value, else the values' own [min, max]."""
    pixels = np.random.default_rng(4).integers(0, 256, size=(3, 4, 4), dtype=np.uint8)
    assert load_npz(_npz(tmp_path / "u8.npz", x=pixels)).pixel_range().source == "uint8"
    floats = pixels.astype(np.float32)
    for scaled, want in [
        (floats / 255, (0.0, 1.0)),
        (floats / 127.5 - 1, (-1.0, 1.0)),
        (floats, (0.0, 255.0)),
        (floats * 4 - 3, (float(pixels.min()) * 4 - 3, float(pixels.max()) * 4 - 3)),
    ]:
        found = load_npz(_npz(tmp_path / "f.npz", x=scaled)).pixel_range()
        assert (found.low, found.high, found.source) == (*want, "inferred")
    plain = load_npz(_npz(tmp_path / "plain.npz", x=floats / 255))
    declared = load_npz(_npz(tmp_path / "d.npz", x=floats / 255, value_range=[0.1, 0.9]))
    found = declared.pixel_range()
    assert (found.low, found.high, found.source) == (0.1, 0.9, "declared")
    assert declared.sha256 != plain.sha256 == content_sha256(plain.x, None)
    for bad, message in [
        ({"x": floats, "value_range": [1.0, 0.0]}, "low < high"),
        ({"x": floats, "value_range": [0.0, 1.0, 2.0]}, "two numbers"),
        ({"x": pixels, "value_range": [0.0, 1.0]}, "uint8 images"),
    ]:
        with pytest.raises(DatasetError, match=message):
            load_npz(_npz(tmp_path / "bad.npz", **bad))


def test_npz_never_unpickles(tmp_path: Path) -> None:
    path = tmp_path / "obj.npz"
    np.savez(path, x=np.array([{"evil": 1}], dtype=object))
    with pytest.raises(DatasetError, match=r"not a readable \.npz"):
        load_dataset(path)


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip file")
    with pytest.raises(DatasetError, match=r"not an \.npz archive"):
        load_dataset(garbage)
    with pytest.raises(DatasetError, match="neither 'digits' nor an existing"):
        load_dataset(tmp_path / "absent.npz")
    other = tmp_path / "data.csv"
    other.write_text("1,2,3")
    with pytest.raises(DatasetError, match="unsupported type"):
        load_dataset(other)


# --- ImageFolder --------------------------------------------------------------------------------


def _folder_images() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {
        f"{cls}/{i}.png": rng.integers(0, 256, size=(6, 6), dtype=np.uint8)
        for cls in ("cat", "dog")
        for i in range(3)
    }


def test_image_folder_directory(tmp_path: Path) -> None:
    images = _folder_images()
    for name, array in images.items():
        (tmp_path / "pets" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pets" / name).write_bytes(png_bytes(array))
    data = load_dataset(tmp_path / "pets")
    assert data.classes == ["cat", "dog"] and data.x.shape == (6, 1, 6, 6)
    assert list(data.y) == [0, 0, 0, 1, 1, 1]  # type: ignore[arg-type]
    expected = np.stack([images[k] for k in sorted(images)]).astype(np.float32)[:, None] / 255
    np.testing.assert_array_equal(data.x, expected)


def test_image_folder_zip_with_top_folder_matches_directory(tmp_path: Path) -> None:
    images = _folder_images()
    archive = tmp_path / "pets.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, array in images.items():
            zf.writestr(f"pets/{name}", png_bytes(array))
    data = load_dataset(archive)
    assert data.classes == ["cat", "dog"] and len(data) == 6
    assert load_image_folder(archive.read_bytes()).sha256 == data.sha256


@pytest.mark.parametrize(
    "paths",
    [
        ["0.png", "1.png", "2.png"],  # at the top of the zip
        ["photos/0.png", "photos/1.png", "photos/2.png"],  # in one folder
        ["a/b/0.png", "a/b/1.png", "a/b/2.png", "__MACOSX/a/b/._0.png", "a/.hidden.png"],
    ],
)
def test_images_in_one_folder_are_a_dataset_without_labels(
    tmp_path: Path, paths: list[str]
) -> None:
    """Images at one level are a dataset without classes, wherever that level is; class
    folders stay the labelled form. Hidden files and macOS's __MACOSX copies are skipped."""
    rng = np.random.default_rng(5)
    arrays = [rng.integers(0, 256, size=(4, 4), dtype=np.uint8) for _ in paths]
    archive = tmp_path / "flat.zip"
    archive.write_bytes(zip_bytes([(p, png_bytes(a)) for p, a in zip(paths, arrays, strict=True)]))
    data = load_image_folder(archive)
    assert isinstance(data, ImageDataset) and len(data) == 3
    assert data.y is None and data.classes is None and data.num_classes is None
    np.testing.assert_array_equal(data.x[:, 0], np.stack(arrays[:3]) / np.float32(255))
    labelled = load_image_folder(
        zip_bytes(
            [
                (f"{c}/{i}.png", png_bytes(a))
                for i, (c, a) in enumerate(zip("aab", arrays[:3], strict=True))
            ]
        )
    )
    assert labelled.classes == ["a", "b"] and labelled.sha256 != data.sha256
    info = describe_dataset(archive)
    assert (info.classes, info.sha256) == (None, data.sha256)


def test_rgb_images_keep_three_channels(tmp_path: Path) -> None:
    rgb = np.random.default_rng(3).integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    archive = tmp_path / "rgb.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("a/0.png", png_bytes(rgb))
    data = load_dataset(archive)
    np.testing.assert_array_equal(data.x[0], rgb.transpose(2, 0, 1) / np.float32(255))


def test_zip_slip_symlink_and_bomb_are_refused() -> None:
    image = png_bytes(np.zeros((4, 4), np.uint8))
    with pytest.raises(DatasetError, match="unsafe path"):
        load_image_folder(zip_bytes([("../../etc/a/0.png", image)]))
    with pytest.raises(DatasetError, match="unsafe path"):
        load_image_folder(zip_bytes([("/abs/a/0.png", image)]))
    link = zipfile.ZipInfo("a/link.png")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with pytest.raises(DatasetError, match="symbolic link"):
        load_image_folder(zip_bytes([(link, b"/etc/passwd")]))
    bomb = zip_bytes([("a/0.png", b"\0" * 10_000_000)])
    with pytest.raises(DatasetError, match="compressed suspiciously well"):
        load_image_folder(bomb)
    with pytest.raises(DatasetError, match="more than 100 bytes"):
        load_image_folder(zip_bytes([("a/0.png", image), ("a/1.png", image)]), max_bytes=100)
    with pytest.raises(DatasetError, match="more than the 1 allowed"):
        load_image_folder(zip_bytes([("a/0.png", image), ("a/1.png", image)]), max_members=1)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([], "holds no images"),
        ([("a/0.png", b"not a png")], "not a readable image"),
        (
            [("0.png", "small"), ("a/1.png", "small")],
            r"in one folder \(a dataset without labels\) or in one folder per class "
            r"\(labelled\), but '0.png' and 'a/1.png' are at different depths\.",
        ),
        (
            [("a/b/0.png", "small"), ("c/d/1.png", "small")],
            r"but 'a/b/0.png' is 2 folders deep\.",
        ),
    ],
)
def test_image_folder_errors(entries: list[tuple[str, str | bytes]], message: str) -> None:
    payloads = {
        "small": png_bytes(np.zeros((4, 4), np.uint8)),
        "large": png_bytes(np.zeros((5, 5), np.uint8)),
    }
    members = [(n, payloads.get(p, p) if isinstance(p, str) else p) for n, p in entries]
    with pytest.raises(DatasetError, match=message):
        load_image_folder(zip_bytes(members))  # type: ignore[arg-type]


def test_mixed_sizes_and_modes_keep_the_original_files() -> None:
    """Images of several sizes load as ImageFiles: original bytes in path order, labels,
    and a hash of exactly those bytes; only a comparison (per-model pipelines) reads them."""
    import hashlib

    from analysis.data.images import ImageFiles

    gray = png_bytes(np.full((4, 6), 7, np.uint8))
    rgba = png_bytes(np.full((9, 5, 4), 200, np.uint8))
    data = load_image_folder(zip_bytes([("b/1.png", rgba), ("a/0.png", gray)]))
    assert isinstance(data, ImageFiles)
    assert data.paths == ("a/0.png", "b/1.png") and data.blobs == (gray, rgba)
    assert data.y.tolist() == [0, 1] and data.classes == ["a", "b"]
    assert data.shape == (3, 0, 0) and data.sizes == ((6, 4), (5, 9))
    assert data.image(1).mode == "RGBA" and data.image(1).size == (5, 9)
    digest = hashlib.sha256(b"cka-atlas-image-files-v1")
    for blob, label in ((gray, 0), (rgba, 1)):
        digest.update(hashlib.sha256(blob).digest() + label.to_bytes(8, "little"))
    assert data.sha256 == digest.hexdigest()


def test_not_a_zip() -> None:
    with pytest.raises(DatasetError, match="not a readable zip"):
        load_image_folder(b"PK but not really")
