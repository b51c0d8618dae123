"""CompareOptions: what it accepts and refuses, and that compare runs exactly what it says."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import Field, ValidationError
from timm.models.mlp_mixer import MlpMixer

from analysis import CompareOptions, EstimatorError, OptionsError, compare, option_specs


def mixer(seed: int) -> MlpMixer:
    torch.manual_seed(seed)
    return MlpMixer(num_classes=10, img_size=16, patch_size=4, embed_dim=32, num_blocks=2)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.randn(40, 3, 16, 16, generator=torch.Generator().manual_seed(1))


def test_defaults() -> None:
    # The defaults compare had as keyword arguments before the options type existed.
    assert CompareOptions().model_dump() == {
        "layers": None,
        "kernel": "linear",
        "estimator": "unbiased",
        "mode": "minibatch",
        "batch_size": 256,
        "feature": "flatten",
        "dtype": "fp32",
        "baselines": (),
        "interval": "none",
        "resamples": 1000,
        "permutations": 0,
        "null": "analytic",
        "sensitivity": False,
        "seed": 0,
        "random_init_draws": 3,
        "measures": ("cka",),
        "knn_k": 10,
        "bootstrap": None,  # deprecated: read, never kept
    }


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"kernel": "cosine"}, "kernel"),
        ({"kernel": "rbf:-1"}, "kernel"),
        ({"kernel": "linear:2"}, "kernel"),
        ({"estimator": "weird"}, "estimator"),
        ({"mode": "stream"}, "mode"),
        ({"batch_size": 3}, "batch_size"),  # the unbiased estimator needs 4
        ({"batch_size": 1, "estimator": "biased"}, "batch_size"),
        ({"batch_size": "many"}, "batch_size"),
        ({"feature": "pool"}, "feature"),
        ({"dtype": "fp8"}, "dtype"),
        ({"dtype": torch.float64}, "dtype"),
        ({"bootstrap": -1}, "bootstrap"),
        ({"bootstrap": 5, "mode": "full"}, "interval"),  # bootstrap 5 asks for an interval
        ({"interval": "images", "mode": "full"}, "interval"),
        ({"interval": "bootstrap"}, "interval"),
        ({"resamples": 0}, "resamples"),
        ({"baselines": ["random_init", "twins"]}, "baselines.1"),
        ({"permutations": -1}, "permutations"),
        ({"permutations": 10_001}, "permutations"),
        ({"null": "exact"}, "null"),
        ({"null": "permutation"}, "null"),  # without a count of permutations
        ({"null": "none", "permutations": 5}, "null"),
        ({"seed": -1}, "seed"),
        ({"random_init_draws": 0}, "random_init_draws"),
        ({"random_init_draws": 21}, "random_init_draws"),
        ({"layers": True}, "layers"),
        ({"layers": [["blocks.0"]]}, "layers"),
        ({"layers": 2.5}, "layers"),
    ],
)
def test_a_bad_option_is_refused_naming_its_field_before_any_forward(
    images: torch.Tensor, bad: dict[str, Any], field: str
) -> None:
    model = mixer(0)
    calls: list[int] = []
    model.stem.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(OptionsError) as info:
        compare({"a": model}, images, **bad)
    message = str(info.value)
    assert message.startswith(f"{field}: ") and info.value.field == field
    assert "\n" not in message and message.count(". ") == 0  # one sentence
    assert isinstance(info.value, EstimatorError)  # what compare raised before
    assert not calls
    with pytest.raises(ValidationError) as raw:
        CompareOptions(**bad)
    assert raw.value.errors()[0]["loc"] == tuple(
        int(part) if part.isdigit() else part for part in field.split(".")
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (
            {"feature": "mean_token"},
            "feature: input should be 'flatten', 'mean_tokens' or 'cls', not 'mean_token'; "
            "did you mean 'mean_tokens'?",
        ),
        ({"measures": ["cka", "pwca"]}, ", not 'pwca'; did you mean 'pwcca'?"),
        ({"kernel": "rfb"}, "; did you mean 'rbf'?"),
        ({"feature": "pixels"}, "'cls', not 'pixels'"),  # nothing close: no guess
    ],
)
def test_an_unknown_option_value_names_the_closest(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError) as info:
        CompareOptions.build(**bad)
    assert str(info.value).endswith(message)


def test_unknown_option_is_a_type_error(images: torch.Tensor) -> None:
    with pytest.raises(TypeError, match="kernal"):
        compare({"a": mixer(0)}, images, kernal="rbf")


def test_values_are_read_in_every_form_and_kept_canonical() -> None:
    opts = CompareOptions(kernel=" RBF:0.50 ", dtype=torch.bfloat16, layers=["blocks.0", -1])
    assert opts.kernel == "rbf:0.5" and opts.dtype == "bf16" and opts.layers == ("blocks.0", -1)
    assert opts.autocast is torch.bfloat16 and opts.parsed_kernel.threshold == 0.5
    assert CompareOptions(dtype=None).dtype == "fp32" and CompareOptions().autocast is None
    assert CompareOptions(dtype="half").dtype == "fp16"
    assert CompareOptions(kernel="rbf:1").kernel == "rbf"
    # the bounds themselves are allowed
    assert CompareOptions(estimator="biased", batch_size=2).batch_size == 2
    assert CompareOptions(batch_size=4).batch_size == 4
    assert CompareOptions(permutations=10_000).permutations == 10_000
    per_model = CompareOptions(layers={"a": None, "b": ["blocks.*"]})
    assert per_model.layers == {"a": None, "b": ("blocks.*",)}
    assert CompareOptions.model_validate(opts.model_dump()) == opts  # a round trip
    with pytest.raises(ValidationError):
        opts.kernel = "linear"  # type: ignore[misc]


def test_build_validates_changes_together_with_the_options() -> None:
    small = CompareOptions(estimator="biased", batch_size=2)
    assert CompareOptions.build(small) is small
    with pytest.raises(OptionsError, match=r"^batch_size: the unbiased estimator needs batches"):
        CompareOptions.build(small, estimator="unbiased")
    assert CompareOptions.build(small, batch_size=8, estimator="unbiased").batch_size == 8


def test_option_specs_describe_what_is_accepted() -> None:
    specs = option_specs()
    assert list(specs) == list(CompareOptions.model_fields)
    assert specs["estimator"].choices == ("biased", "unbiased")
    assert specs["mode"].choices == ("minibatch", "full")
    assert specs["feature"].choices == ("flatten", "mean_tokens", "cls")
    assert specs["dtype"].choices == ("fp32", "bf16", "fp16")
    assert (specs["permutations"].minimum, specs["permutations"].maximum) == (0, 10_000)
    assert specs["batch_size"].minimum == 2 and specs["kernel"].kind == "text"
    assert specs["layers"].kind == "layers" and specs["sensitivity"].kind == "flag"
    assert specs["interval"].choices == ("none", "images", "batches")
    assert specs["baselines"].kind == "choices"
    assert specs["baselines"].choices == ("random_init", "seed_ceiling")
    assert specs["bootstrap"].kind == "int" and specs["bootstrap"].deprecated
    assert all(s.description for s in specs.values())
    defaults = {name: spec.default for name, spec in specs.items()}
    assert defaults["interval"] == "none" and defaults["bootstrap"] is None
    assert CompareOptions(**defaults) == CompareOptions()
    for name, spec in specs.items():
        for choice in spec.choices:
            # shuffles need a count of them
            count = {"permutations": 10} if choice == "permutation" else {}
            want = (choice,) if spec.kind == "choices" else choice
            if name == "measures":  # CKA always runs, first
                want = tuple(dict.fromkeys(("cka", choice)))
            assert getattr(CompareOptions(**{name: choice}, **count), name) == want
    for example in specs["kernel"].examples:
        CompareOptions(kernel=example)
        assert re.fullmatch(specs["kernel"].pattern or "", example)
    assert not re.fullmatch(specs["kernel"].pattern or "", "cosine")
    assert {name for name, spec in specs.items() if spec.pattern} == {"kernel"}


class Capped(CompareOptions):
    """A service's request: its own bounds on an option, and fields that are not options."""

    batch_size: int = Field(default=256, ge=2, le=64)
    model_ids: list[int] = Field(default_factory=list)


def test_option_specs_read_a_subclass_bounds_and_only_the_options() -> None:
    capped = option_specs(Capped)
    assert list(capped) == list(CompareOptions.model_fields)
    assert (capped["batch_size"].minimum, capped["batch_size"].maximum) == (2, 64)
    assert option_specs()["batch_size"].maximum is None
    assert capped["knn_k"] == option_specs()["knn_k"]


def test_options_and_shortcuts_run_the_same(images: torch.Tensor) -> None:
    models = {"a": mixer(0), "b": mixer(1)}
    chosen: dict[str, Any] = {
        "layers": {"a": ["blocks.*"], "b": [0, "norm"]},
        "kernel": "rbf:0.5",
        "estimator": "biased",
        "batch_size": 16,
        "feature": "mean_tokens",
        "interval": "images",
        "permutations": 7,
        "seed": 3,
    }
    by_options = compare(models, images, CompareOptions(**chosen), device="cpu")
    by_shortcuts = compare(models, images, device="cpu", **chosen)
    assert by_options.to_dict() == by_shortcuts.to_dict()
    assert by_options.layers == {"a": ["blocks.0", "blocks.1"], "b": ["stem", "norm"]}
    config = by_options.config
    assert (config["kernel"], config["estimator"], config["batch_size"]) == (
        "rbf:0.5",
        "biased",
        16,
    )
    assert (config["feature"], config["interval"], config["seed"]) == ("mean_tokens", "images", 3)
    assert config["permutations"] == 7
    assert by_options.diagnostics["batches"] == 3  # 16, 16 and a ragged 8 (enough for biased)
    # shortcuts override the options they are given with
    mixed = compare(models, images, CompareOptions(**chosen), device="cpu", kernel="linear")
    plain = compare(models, images, device="cpu", **(chosen | {"kernel": "linear"}))
    assert mixed.to_dict() == plain.to_dict()
    assert not np.allclose(mixed.hsic, by_options.hsic)  # and the override did change things


@pytest.mark.parametrize(
    ("given", "interval", "resamples"),
    [
        ({"bootstrap": 0}, "none", 1000),
        ({"bootstrap": 0, "interval": "images"}, "none", 1000),  # 0 always meant none
        ({"bootstrap": 200}, "images", 200),  # the unit a positive count gave before
        ({"bootstrap": 50, "interval": "batches"}, "batches", 50),
        ({"interval": "batches", "resamples": 300}, "batches", 300),
        ({"interval": "images"}, "images", 1000),
        ({}, "none", 1000),
    ],
)
def test_the_intervals_switch_is_apart_from_their_count_and_bootstrap_still_reads(
    given: dict[str, Any], interval: str, resamples: int
) -> None:
    opts = CompareOptions(**given)
    assert (opts.interval, opts.resamples, opts.bootstrap) == (interval, resamples, None)
    assert CompareOptions.model_validate(opts.model_dump()) == opts  # a round trip


def test_baselines_are_canonical_and_turn_the_interval_on() -> None:
    """A verdict weighs a cell's difference from its baseline against the cell's interval, so
    asking for baselines asks for image intervals (unless another unit is given, or none can
    be had: full mode)."""
    opts = CompareOptions(baselines="seed_ceiling, random_init,seed_ceiling")
    assert opts.baselines == ("random_init", "seed_ceiling") and opts.interval == "images"
    assert CompareOptions(baselines=["seed_ceiling"], interval="batches").interval == "batches"
    assert CompareOptions(baselines=["random_init"], mode="full").interval == "none"
    assert CompareOptions(baselines=()).interval == "none"
