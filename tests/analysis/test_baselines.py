"""The rule every baseline obeys, and the twins' seeds, without a service.

The values of the baselines are tested through the service (tests/app/test_baselines.py and
test_calibrated.py), against twins and siblings compared with ``analysis.compare`` there.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

import analysis
import models
from analysis.comparison.baselines import Candidates, StandIn, choose, twin_seed


def _net(identity: str) -> StandIn:
    return StandIn(label=identity, identity=identity, layers=("stem",), about={})


def test_choose_never_pairs_a_network_with_itself() -> None:
    a, b, c = _net("a"), _net("b"), _net("c")
    chosen = choose(
        {
            ("a", "b"): Candidates(((b, b), (c, b)), "none at all", "sibling"),
            ("a", "a"): Candidates(((a, a),), "none at all", "sibling"),
            ("b", "b"): Candidates((), "no seed sibling of b in the store", "sibling"),
        }
    )
    assert chosen[("a", "b")] == (c, b)  # the next candidate, never the one pair of b with b
    assert chosen[("a", "a")] == "no sibling other than the compared model"
    assert chosen[("b", "b")] == "no seed sibling of b in the store"


def test_twin_seeds_differ_per_model_draw_and_copy() -> None:
    digest = hashlib.sha256(b"random_init|0|k|1|0").hexdigest()
    assert twin_seed("k", 1) == int(digest[:8], 16) % 2**31
    seeds = {twin_seed(k, d, c) for k in ("k", "l") for d in range(3) for c in (0, 1)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)
    assert twin_seed("k", 0, seed=1) != twin_seed("k", 0)


def test_a_models_block_with_itself_pairs_two_twins() -> None:
    net = models.create("mixer_digits", seed=0, depth=1)
    x = torch.randn(24, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    atlas = analysis.compare(
        {"m": net}, x, layers=["stem", "norm"], batch_size=8, baselines="random_init", device="cpu"
    )
    assert atlas.baselines is not None
    out = atlas.baselines["random_init"]
    assert out["draws"] == 3 and len(set(out["seeds"]["m"])) == 3
    (block,) = out["blocks"]
    for pair in block["stand_ins"]:
        assert pair["rows"]["identity"] != pair["columns"]["identity"]
        assert pair["columns"]["seed"] == twin_seed(
            "m", out["seeds"]["m"].index(pair["rows"]["seed"]), 1
        )
    cka = np.array(out["cka"], dtype=float)
    assert np.all(np.diagonal(cka) < 1 - 1e-6)  # two untrained networks, not one twice
    sd = np.array(out["sd"], dtype=float)
    assert np.all(sd > 0)
