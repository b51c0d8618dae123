"""Declared options: validation names the key, normalisation, schema, structure and Ω grids."""

from __future__ import annotations

import pytest

import models


@pytest.mark.parametrize(
    ("arch", "config", "message"),
    [
        ("mixer_digits", {"colour": 1}, r"unknown option 'colour' for mixer_digits"),
        ("sw_mlp_digits", {"density": 0}, r"option 'density' of sw_mlp_digits: .*greater than 0"),
        ("sw_mlp_digits", {"density": 1.5}, r"option 'density' .*less than or equal to 1"),
        ("sw_mlp_digits", {"density": "0.1"}, r"option 'density' .*valid number"),
        ("mixer_digits", {"depth": 0}, r"option 'depth' .*greater than or equal to 1"),
        ("mixer_digits", {"num_blocks": 0}, r"option 'num_blocks' .*greater than or equal to 1"),
        ("mixer_digits", {"embed_dim": 1.5}, r"option 'embed_dim' .*valid integer"),
        ("mixer_digits", {"embed_dim": 10**6}, r"option 'embed_dim' .*less than or equal to 8192"),
        ("sw_mlp_digits", {"mlp_ratio": 1e9}, r"option 'mlp_ratio' .*less than or equal to 64"),
        ("mixer_digits", {"seed": True}, r"option 'seed' .*valid integer"),
        ("mixer_digits", {"patch_size": 3}, r"option 'patch_size' .*does not divide img_size 8"),
        ("mixer_digits", {"token_expansion": 0.1}, r"option 'token_expansion' .*whole number"),
        ("gmlp_digits", {"mlp_ratio": 49 / 32}, r"option 'mlp_ratio' .*even whole number"),
        ("mlp_digits", {"density": 0.5}, r"option 'density' of mlp_digits"),
        ("mixer_digits", {"depth": 2, "num_blocks": 2}, r"either 'num_blocks' or its alias"),
        ("no_such_net", {}, r"unknown architecture 'no_such_net'"),
    ],
)
def test_invalid_options_fail_with_one_sentence_naming_the_key(
    arch: str, config: dict, message: str
) -> None:
    with pytest.raises(models.ConfigError, match=message) as caught:
        models.validate_config(arch, config)
    assert "\n" not in str(caught.value)


def test_validation_is_the_same_when_building() -> None:
    with pytest.raises(models.ConfigError, match="option 'density' of sw_mlp_digits"):
        models.create("sw_mlp_digits", density=-1.0)


def test_normalised_config_is_full_and_independent_of_spelling() -> None:
    implicit = models.validate_config("sw_mlp_digits", {"depth": 6})
    explicit = models.validate_config(
        "sw_mlp_digits", {"num_blocks": 6, "density": (1 / 16 + 1 / 32) / 2, "patch_size": 2}
    )
    assert implicit == explicit
    assert implicit["num_blocks"] == 6 and "depth" not in implicit
    assert implicit["density"] == 0.046875
    assert isinstance(models.validate_config("sw_mlp_digits", {"density": 1})["density"], float)
    # The built model records exactly the validated config.
    assert models.create("sw_mlp_digits", depth=6).atlas_config["config"] == implicit


def test_schema_lists_every_option_with_type_default_and_range() -> None:
    schema = {o["key"]: o for o in models.option_schema("sw_mlp_digits")}
    assert set(schema) == set(models.validate_config("sw_mlp_digits"))
    assert schema["density"]["type"] == "float" and schema["density"]["nullable"]
    assert schema["density"]["range"] == {"gt": 0.0, "le": 1.0}
    assert schema["num_blocks"] == {
        **schema["num_blocks"],
        "type": "int",
        "default": 4,
        "range": {"ge": 1, "le": 256},
        "aliases": ["depth"],
    }
    assert all(o["description"] for o in schema.values())
    cifar = {o["key"]: o["default"] for o in models.option_schema("mixer_cifar")}
    assert cifar["embed_dim"] == 64 and cifar["token_expansion"] == 4.0


@pytest.mark.parametrize(
    ("arch", "config", "s", "c"),
    [
        ("mixer_digits", {}, 16, 32),
        ("rp_mixer_digits", {"patch_size": 1, "embed_dim": 6}, 64, 6),
        ("mixer_cifar", {}, 64, 64),
    ],
)
def test_mixer_structure_follows_the_papers_formula(
    arch: str, config: dict, s: int, c: int
) -> None:
    gamma = 2.0 if arch.endswith("digits") else 4.0
    info = models.structure(arch, config)
    assert info == {
        "family": arch.removesuffix("_digits").removesuffix("_cifar"),
        "omega": round(gamma * (c * s * s + c * c * s) / 2),
        "effective_width": s * c,
        "density": None,
        "S": s,
        "C": c,
        "gamma": gamma,
    }


def test_sw_mlp_and_mlp_structure() -> None:
    info = models.structure("sw_mlp_digits", {"density": 0.125, "depth": 6})
    m = 16 * 32
    assert info["omega"] == round(0.125 * 2 * m * m) and info["density"] == 0.125
    assert (info["S"], info["C"], info["effective_width"], info["gamma"]) == (16, 32, m, 2.0)
    assert models.structure("mlp_digits")["omega"] == 2 * m * m
    assert models.structure("mlp_digits")["density"] == 1.0
    # gMLP: γ·C·S·(3C + S)/6 with γ = 6.
    assert models.structure("gmlp_digits")["omega"] == 6 * 32 * 16 * (3 * 32 + 16) // 6


def test_sw_mlp_grid_hits_omega_exactly_at_every_width() -> None:
    target = 24576
    points = models.fixed_omega_grid("sw_mlp_digits", target, widths=[64, 128, 256, 512, 1024])
    widths = [p.structure["effective_width"] for p in points]
    assert widths == [128, 256, 512, 1024]  # m = 64 would need p = 3 > 1
    for p in points:
        m = p.structure["effective_width"]
        assert p.options["density"] == target / (2 * m * m)
        assert p.omega == target


def test_mixer_grid_solves_c_and_reports_the_real_omega() -> None:
    target = 24576
    shapes = [{"patch_size": k} for k in (1, 2, 4, 8)]
    points = models.fixed_omega_grid("mixer_digits", target, shapes=shapes, keep_all=True)
    for p in points:
        s = (8 // p.options["patch_size"]) ** 2
        c = p.options["embed_dim"]
        assert p.omega == (2 * c * s * s + 2 * c * c * s) // 2
        # No other whole C is closer to the target.
        for other in (c - 1, c + 1):
            assert abs((2 * other * s * s + 2 * other * other * s) // 2 - target) >= abs(
                p.omega - target
            )
    kept = models.fixed_omega_grid("mixer_digits", target, shapes=shapes, tolerance=0.05)
    assert [p.options["patch_size"] for p in kept] == [2, 4, 8]  # S = 64 is 9.4 % off


def test_grid_rejects_what_it_cannot_build() -> None:
    with pytest.raises(models.ConfigError, match="multiple of its S = 16"):
        models.fixed_omega_grid("sw_mlp_digits", 24576, widths=[100])
    with pytest.raises(models.ConfigError, match="takes 'shapes'"):
        models.fixed_omega_grid("mixer_digits", 24576, widths=[512])
    with pytest.raises(models.ConfigError, match="no fixed-Ω grid"):
        models.fixed_omega_grid("mlp_digits", 24576, widths=[512])


@pytest.mark.parametrize(
    ("arch", "options"),
    [("sw_mlp_digits", {"density": 0.25}), ("rp_mixer_digits", {}), ("mixer_digits", {})],
)
def test_a_seed_changes_weights_never_shapes(arch: str, options: dict[str, float]) -> None:
    """What :func:`models.shape_config` leaves out, so that the shape caches (structure, budget,
    skeleton) kept under it serve every seed: built for real, three seeds give the same
    parameter and buffer names and shapes, and different weights."""
    nets = [models.create(arch, seed=seed, **options) for seed in (0, 1, 7)]
    shapes = {tuple((k, tuple(v.shape)) for k, v in net.state_dict().items()) for net in nets}
    assert len(shapes) == 1
    first, second = (next(iter(net.parameters())) for net in nets[:2])
    assert not bool((first == second).all())
    assert models.shape_config({**options, "seed": 3}) == options
    structures = [models.structure(arch, {**options, "seed": s}) for s in (0, 1, 7)]
    assert structures[0] == structures[1] == structures[2]
