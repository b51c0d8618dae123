"""The API process's memory while it checks dataset uploads, measured in a process of its own.

:func:`make` writes the probe's uploads (issue 36): a uint8 ``.npz`` of zeros and a zipped
ImageFolder of black PNGs, each unpacking to a given number of bytes from under a megabyte or
two. ``python -m tests.app.upload_memory DATA_DIR FILE...`` builds the app (SQLite under DATA_DIR,
no worker), uploads a small warm-up ``.npz`` so that every import and cache of the upload path
is in place, takes the process's peak resident set (``ru_maxrss``) as *idle*, then uploads each
FILE in turn, and prints one JSON object: *idle*, and per file its status, body, the peak after
it (bytes) and the seconds it took. ru_maxrss is a high-water mark, so a file's *peak* − *idle*
bounds what that upload, or one before it, added at its worst.
"""

from __future__ import annotations

import io
import json
import math
import resource
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from numpy.lib import format as npy
from PIL import Image

from app.http.main import create_app
from tests.helpers import make_settings


def zeros_npz(path: Path, unpacked: int) -> int:
    """An .npz of uint8 zeros (N, 32, 32, 3) unpacking to about ``unpacked`` bytes; those bytes.

    Written as numpy.savez_compressed writes it, a slice at a time."""
    shape = (unpacked // 3072, 32, 32, 3)
    header = {"descr": "|u1", "fortran_order": False, "shape": shape}
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf,
        zf.open("x.npy", "w", force_zip64=True) as f,
    ):
        npy.write_array_header_1_0(f, header)
        left = math.prod(shape)
        block = bytes(1 << 24)
        while left:
            left -= f.write(block[: min(left, len(block))])
    return math.prod(shape)


def zeros_folder(path: Path, unpacked: int, side: int = 2000) -> int:
    """A zipped ImageFolder (two classes) of black side×side PNGs decoding to about
    ``unpacked`` bytes; those bytes."""
    buf = io.BytesIO()
    Image.fromarray(np.zeros((side, side), np.uint8)).save(buf, format="PNG")
    count = -(-unpacked // side**2)
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(count):
            zf.writestr(f"black/{'ab'[i % 2]}/{i}.png", buf.getvalue())
    return count * side**2


def make(directory: Path, unpacked: int) -> dict[str, int]:
    """``zeros.npz`` and ``black.zip`` in ``directory``; the bytes each unpacks to, by name."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "zeros.npz": zeros_npz(directory / "zeros.npz", unpacked),
        "black.zip": zeros_folder(directory / "black.zip", unpacked),
    }


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def measure(data_dir: Path, uploads: list[Path]) -> dict[str, Any]:
    settings = make_settings(f"sqlite:///{data_dir / 'cka.db'}", data_dir, worker_threads=0)
    with TestClient(create_app(settings)) as client:
        warm = io.BytesIO()
        rng = np.random.default_rng(0)
        np.savez_compressed(warm, x=rng.integers(0, 256, (64, 8, 8, 3), np.uint8))
        r = client.post("/v1/datasets", files={"file": ("warm.npz", warm.getvalue())})
        assert r.status_code == 201, r.text
        out: dict[str, Any] = {"idle": _maxrss(), "uploads": []}
        for path in uploads:
            began = time.perf_counter()
            with path.open("rb") as f:
                r = client.post("/v1/datasets", files={"file": (path.name, f)})
            out["uploads"].append(
                {
                    "file": path.name,
                    "status": r.status_code,
                    "body": r.json(),
                    "peak": _maxrss(),
                    "seconds": round(time.perf_counter() - began, 2),
                }
            )
        return out


if __name__ == "__main__":
    print(json.dumps(measure(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]])))
