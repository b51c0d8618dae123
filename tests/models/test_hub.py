"""Model-folder archives are read like hostile uploads: no traversal, links, bombs or pickles."""

from __future__ import annotations

import io
import json
import stat
import zipfile
from pathlib import Path

import pytest

from models import CheckpointError
from models.hub import read_hub

CONFIG = json.dumps({"architecture": "resmlp_12_224", "num_classes": 10}).encode()


def _zip(tmp: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in entries:
            zf.writestr(info, data)
    out = tmp / "folder.zip"
    out.write_bytes(buf.getvalue())
    return out


def test_hostile_archives_are_refused(tmp_path: Path) -> None:
    scratch = tmp_path / "s"
    scratch.mkdir()
    cases: list[tuple[list[tuple[zipfile.ZipInfo | str, bytes]], str]] = [
        ([("m/../../config.json", CONFIG)], "unsafe path"),
        ([("/config.json", CONFIG)], "unsafe path"),
        ([("m/config.json", CONFIG), ("m/model.safetensors", b"\0" * 5_000_000)], "suspicious"),
        ([("m/config.json", CONFIG), ("m/pytorch_model.bin", b"\x80\x02.")], "weights_only"),
        ([("m/config.json", b"[1]"), ("m/model.safetensors", b"w")], "JSON object"),
        ([("a/config.json", CONFIG), ("b/config.json", CONFIG)], "one model folder"),
    ]
    link = zipfile.ZipInfo("m/model.safetensors")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    cases.append(([("m/config.json", CONFIG), (link, b"/etc/passwd")], "symbolic link"))
    for entries, message in cases:
        with pytest.raises(CheckpointError, match=message):
            read_hub(_zip(tmp_path, entries), scratch)
    assert sorted(p.name for p in scratch.iterdir()) in ([], ["config.json"])
    big = _zip(tmp_path, [("m/config.json", CONFIG), ("m/model.safetensors", b"x" * 2000)])
    with pytest.raises(CheckpointError, match="more than 1000 bytes"):
        read_hub(big, scratch, max_bytes=1000)
    pth = tmp_path / "weights.pth"
    pth.write_bytes(b"\x80\x02.")
    with pytest.raises(CheckpointError, match=r"torch\.load\(path, weights_only=True\)"):
        read_hub(pth, scratch)
    bad_args = json.dumps({"architecture": "resmlp_12_224", "model_args": {"pretrained": True}})
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "config.json").write_text(bad_args)
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="not accepted"):
        read_hub(folder, scratch)
