"""Which factor moves layer identification at digits scale? One setting per run, linear CKA only.

Trains ``--seeds`` models of ``--arch`` on digits (the family's recipe unless ``--epochs``; none
with ``--epochs 0``: untrained models), reads every default layer on the first ``--images`` test
images (upsampled ``--upsample`` times, bilinear, when asked: 8×8 digits become 32×32 for
``tiny10_cifar``), computes linear CKA between every pair of layers of every pair of models
(biased, over all the images at once, as the ``layer_identification`` study does: the inner
product of the layers' centred, unit-norm Grams) and scores it with the study's own statistic
and interval (:func:`analysis.studies.identification.identification`), plus the accuracy per
layer. Prints one JSON line and writes it to ``--out``::

    python docs/examples/identification_factors.py --arch tiny10_digits --seeds 10 \\
        --epochs 60 --out run/factors/epochs60.json

Checkpoints are kept under ``--zoo`` and reused by name.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import models
from analysis import ImageDataset, training_data
from analysis.layers import LayerReader, default_layers
from analysis.studies.identification import hits, identification


def _upsampled(data: ImageDataset, factor: int) -> ImageDataset:
    if factor == 1:
        return data
    x = F.interpolate(torch.from_numpy(data.x), scale_factor=factor, mode="bilinear")
    return ImageDataset(name=f"{data.name}-x{factor}", x=x.numpy(), y=data.y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="tiny10_digits")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=None, help="0: untrained models")
    parser.add_argument("--width", type=int, default=None, help="tiny10's w (default 16)")
    parser.add_argument("--images", type=int, default=450, help="test images compared")
    parser.add_argument("--upsample", type=int, default=1)
    parser.add_argument("--zoo", default="run/factors/zoo")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    started = time.perf_counter()
    splits = training_data("digits")
    assert isinstance(splits, tuple)  # digits come as their fixed (train, test) split
    train, test = splits
    train, test = _upsampled(train, args.upsample), _upsampled(test, args.upsample)
    options = {} if args.width is None else {"width": args.width}
    tag = f"{args.arch}-e{args.epochs}-w{args.width}-u{args.upsample}"
    nets = []
    for seed in range(args.seeds):
        if args.epochs == 0:
            spec = {"in_chans": 1, "img_size": train.x.shape[-1]}
            nets.append(models.create(args.arch, seed=seed, **options, **spec).eval())
            continue
        path = Path(args.zoo) / tag / f"s{seed}.safetensors"
        if not path.exists():
            models.train(args.arch, (train, test), seed=seed, epochs=args.epochs,
                         out_dir=path.parent, name=path.stem, **options)  # fmt: skip
        nets.append(models.load(path)[0].eval())
    layers = default_layers(nets[0])
    x = torch.from_numpy(test.x[: args.images])
    grams = []  # each layer's centred, unit-norm Gram: ⟨G_a, G_b⟩ is biased linear CKA
    centre = torch.eye(len(x), dtype=torch.float64) - 1.0 / len(x)
    with torch.no_grad():
        for net in nets:
            for f in LayerReader(net, layers)(x):
                f = f.double()
                g = centre @ (f @ f.T) @ centre
                grams.append((g / torch.linalg.norm(g)).reshape(-1))
    stacked = torch.stack(grams)
    cka = (stacked @ stacked.T).numpy()
    k, n_layers = len(nets), len(layers)
    sims = cka.reshape(k, n_layers, k, n_layers).transpose(0, 2, 1, 3).copy()
    sims[np.arange(k), np.arange(k)] = np.nan
    result = identification("cka", sims).as_dict()
    per_layer = np.nanmean(hits(sims), axis=(0, 1))
    result |= {
        "setting": vars(args),
        "layers": {name: round(float(v), 3) for name, v in zip(layers, per_layer, strict=True)},
        "seconds": round(time.perf_counter() - started, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
