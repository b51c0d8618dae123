"""How much memory a comparison holds at its peak, from its plan's shape, before anything runs.

A caller with a memory bound (the service: ``CKA_JOB_MEMORY_GB``) refuses a comparison whose
estimate passes it, in one sentence that names the largest parts. The parts, in bytes:

* ``images``: the dataset as the run reads it, float32 (N × C × H × W × 4; a folder of image
  files is decoded batch by batch, but a service holds its datasets whole);
* ``activations``: one batch's features of every selected layer (b × Σ d × 4);
* ``grams``: one batch's Grams of every layer, float64 in the worst case, with their centred
  copies (2 × L × b² × 8); in full mode b is every image;
* ``kept``: what the whole-sample measures or the sensitivity keep — every image's features of
  every layer, with the measures' factorisations and working set
  (:func:`analysis.measures.estimate_bytes`); in full mode the features as float64;
* ``bootstrap``: the batch bootstrap's per-batch terms and resampled sums (3 × R × L² × 8);
* ``permutations``: the drawn null's sums (P × L² × 8).

It leaves out what does not grow with the request: the weights (bounded per model by the
service's ``CKA_MAX_MODEL_BYTES``), the analytic null's kept Grams (at most
:data:`analysis.inference.null_draws.KEEP_BYTES`) and the interpreter itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from analysis.measures import estimate_bytes
from analysis.measures.budget import gib
from analysis.options import CompareOptions

__all__ = ["comparison_bytes", "describe_bytes"]

_F32, _F64 = 4, 8


def comparison_bytes(
    options: CompareOptions, n: int, image_shape: Sequence[int], widths: Sequence[int]
) -> dict[str, int]:
    """The parts of a comparison's peak memory (see the module docstring), in bytes, for ``n``
    images of ``image_shape`` and selected layers of ``widths`` features each."""
    layers, features = len(widths), sum(widths)
    full = options.mode == "full"
    b = n if full else min(options.batch_size, n)
    parts = {
        "images": n * math.prod(image_shape) * _F32,
        "activations": b * features * _F32,
        "grams": 2 * layers * b * b * _F64,
        "kept": 0,
        "bootstrap": 0,
        "permutations": options.permutations * layers * layers * _F64,
    }
    if full:
        parts["kept"] = n * features * _F64
    elif options.whole_sample or options.sensitivity:
        kept = n * features * _F32
        measures = estimate_bytes(n, widths, options.measures, itemsize=_F32, k=options.knn_k)
        parts["kept"] = max(kept, measures)  # the measures' estimate includes what they keep
    if options.interval == "batches":
        parts["bootstrap"] = 3 * options.resamples * layers * layers * _F64
    return parts


def describe_bytes(parts: dict[str, int], largest: int = 2) -> str:
    """The total and the ``largest`` parts, as a sentence writes them: "about 9.10 GiB (grams
    6.00 GiB, images 2.90 GiB)" (MiB below a GiB)."""
    top = sorted(((v, k) for k, v in parts.items() if v), reverse=True)[:largest]
    named = ", ".join(f"{k} {_size(v)}" for v, k in top)
    return f"about {_size(sum(parts.values()))} ({named})"


def _size(size: int) -> str:
    return gib(size) if size >= 2**30 else f"{size / 2**20:.2f} MiB"
