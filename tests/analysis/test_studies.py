"""Study specs: validation, expansion and keys, fixed-Ω grids, summary statistics, table, plot.

The statistics are checked against formulas written here on a synthetic atlas (random CKA
blocks), with the Student-t quantiles typed in from tables.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from analysis import load_dataset, studies
from analysis.studies import StudyError

# Two-sided 95 % Student-t quantiles t(0.975, df).
T975 = {1: 12.706204736, 2: 4.302652730, 5: 2.570581836, 8: 2.306004135}
LAYERS = [f"l{i}" for i in range(7)]


def small_spec(**changes: object) -> dict:
    spec: dict = {
        "name": "tiny",
        "dataset": "digits",
        "seeds": 2,
        "reference": {"name": "mixer", "arch": "mixer_digits"},
        "arms": [
            {"name": "sw", "arch": "sw_mlp_digits", "grid": {"density": ["matched", 0.25]}},
            {"name": "rp", "arch": "rp_mixer_digits"},
        ],
    }
    spec.update(changes)
    return spec


def keys(plan: studies.StudyPlan) -> list[str]:
    return [t.key for t in plan.trainings]


def test_sparsity_matched_density_is_computed_from_the_reference() -> None:
    plan = studies.plan("sparsity", seeds=1)
    s, c = plan.reference.structure["S"], plan.reference.structure["C"]
    assert (s, c) == (16, 32)
    densities = [e.structure["density"] for e in plan.entries if e.family == "sw_mlp"]
    assert densities == [1 / 64, (1 / s + 1 / c) / 2, 1 / 8, 1 / 4, 1 / 2]
    assert [e.arm for e in plan.entries][-2:] == ["mlp", "rp_mixer"]
    matched = next(e for e in plan.entries if e.point.get("density") == 0.046875)
    assert matched.structure["omega"] == plan.reference.structure["omega"]


def test_width_study_points_are_within_ten_percent_of_one_omega() -> None:
    plan = studies.plan("width", seeds=1)
    target = plan.reference.structure["omega"]
    per_family: dict[str, set[int]] = {}
    for entry in plan.entries:
        info = entry.structure
        s, c = info["S"], info["C"]
        # Ω from the paper's formulas, independent of models.connections.
        if entry.family == "sw_mlp":
            omega = round(info["density"] * 2 * (s * c) ** 2)
        else:
            omega = round(2 * (c * s * s + c * c * s) / 2)
        assert omega == info["omega"]
        assert abs(omega - target) <= 0.10 * target, entry.name
        per_family.setdefault(entry.family, set()).add(info["effective_width"])
    assert len(per_family["sw_mlp"]) >= 4
    assert len(per_family["mixer"]) >= 3 and len(per_family["rp_mixer"]) >= 3


def test_same_spec_gives_the_same_keys_and_changes_give_others(tmp_path) -> None:
    base = keys(studies.plan(small_spec()))
    assert base == keys(studies.plan(small_spec()))
    assert len(base) == len(set(base)) == 2 * 4
    # Spelling a default out, or an alias, is the same architecture.
    spelled = small_spec(
        reference={"name": "mixer", "arch": "mixer_digits", "options": {"depth": 4}}
    )
    assert keys(studies.plan(spelled)) == base
    # A recipe that resolves to the family default is the same training too.
    assert keys(studies.plan(small_spec(recipe={"batch_size": 64}))) == base
    changed = keys(studies.plan(small_spec(recipe={"epochs": 3})))
    assert not set(changed) & set(base)
    quick = keys(studies.plan(small_spec(), quick=True))
    assert not set(quick) & set(base)
    digits = load_dataset("digits", split="all")
    np.savez(tmp_path / "other.npz", x=digits.x[::-1, 0], y=digits.y[::-1])
    other_data = keys(studies.plan(small_spec(), dataset=str(tmp_path / "other.npz")))
    assert not set(other_data) & set(base)
    # A third seed adds trainings and keeps the first two.
    three = keys(studies.plan(small_spec(), seeds=3))
    assert set(base) < set(three) and len(three) == 12


def test_identical_points_share_one_training() -> None:
    plan = studies.plan("width", seeds=2)
    entry = next(e for e in plan.entries if e.name == "mixer[patch_size=2,embed_dim=32]")
    assert entry.keys == plan.reference.keys
    assert len(plan.trainings) == 2 * (len(plan.entries) + 1) - 2


def test_train_kwargs_build_the_planned_architecture() -> None:
    import models

    plan = studies.plan(small_spec(), seeds=1)
    t = next(t for t in plan.trainings if t.family == "sw_mlp")
    kwargs = t.train_kwargs()
    recipe = {k: kwargs.pop(k) for k in ("epochs", "batch_size", "lr", "weight_decay")}
    assert recipe == {"epochs": 15, "batch_size": 64, "lr": 1e-3, "weight_decay": 0.05}
    seed = kwargs.pop("seed")
    model = models.create(t.arch, seed=seed, **kwargs)
    assert model.atlas_config["config"] == t.config


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"arms": []}, "arms"),
        ({"seeds": [1, 1]}, "seeds"),
        ({"recipe": {"epochs": 0}}, "recipe.epochs"),
        ({"recipe": {"optimiser": "sgd"}}, "recipe.optimiser"),
        ({"reference": {"name": "sw", "arch": "mixer_digits"}}, "unique"),
        ({"plot": "pie"}, "plot"),
        ({"detect": 0}, "detect"),
        ({"detect": 1.5}, "detect"),
    ],
)
def test_invalid_specs_are_refused_with_the_field(change: dict, message: str) -> None:
    with pytest.raises(StudyError, match=message):
        studies.plan(small_spec(**change))


def test_invalid_options_in_an_arm_name_the_arm_and_key() -> None:
    arms = [{"name": "sw", "arch": "sw_mlp_digits", "options": {"density": 2}}]
    with pytest.raises(StudyError, match=r"arm 'sw': option 'density' of sw_mlp_digits"):
        studies.plan(small_spec(arms=arms))


def test_builtins_load_from_package_data_and_yaml_text() -> None:
    for name in studies.BUILTIN_STUDIES:
        spec = studies.load_spec(name)
        assert spec.name == name
        assert studies.load_spec(studies.builtin_text(name)) == spec


class FakeAtlas:
    """CKA blocks drawn at random, symmetric as an Atlas is: matrix(b, a) = matrix(a, b).T."""

    def __init__(self, names: list[str], seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.layers = {n: LAYERS for n in names}
        self.blocks: dict[tuple[str, str], np.ndarray] = {}
        for i, a in enumerate(names):
            for b in names[i:]:
                self.blocks[a, b] = rng.uniform(0.2, 1.0, size=(7, 7))

    def matrix(self, a: str, b: str | None = None) -> np.ndarray:
        b = a if b is None else b
        return self.blocks[a, b] if (a, b) in self.blocks else self.blocks[b, a].T


def t_stats(values: list[float]) -> tuple[float, float, float]:
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T975[n - 1] * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def diag_mean(m: np.ndarray) -> float:
    return sum(m[i][i] for i in range(7)) / 7


def finished(plan: studies.StudyPlan) -> list[dict]:
    return [
        {"key": t.key, "name": f"m{i}", "accuracy": 0.9 + 0.01 * i}
        for i, t in enumerate(plan.trainings)
    ]


def test_summary_statistics_match_the_formulas() -> None:
    plan = studies.plan("width", seeds=3)
    done = finished(plan)
    name = {d["key"]: d["name"] for d in done}
    accuracy = {d["key"]: d["accuracy"] for d in done}
    atlas = FakeAtlas([d["name"] for d in done])
    summary = studies.summarize(plan, done, atlas).summary

    refs = [name[plan.reference.keys[s]] for s in (0, 1, 2)]
    for arm in summary["arms"]:
        entry = next(e for e in plan.entries if e.name == arm["name"])
        models = [name[entry.keys[s]] for s in (0, 1, 2)]
        acc = t_stats([accuracy[entry.keys[s]] for s in (0, 1, 2)])
        assert arm["accuracy"]["mean"] == pytest.approx(acc[0], abs=1e-9)
        assert arm["accuracy"]["ci"] == pytest.approx(list(acc[1:]), abs=1e-9)
        pairs = [(r, m) for r in refs for m in models if r != m]
        values = [diag_mean(atlas.matrix(r, m)) for r, m in pairs]
        expected = t_stats(values)
        cka = arm["cka_diagonal"]
        assert cka["n_pairs"] == len(pairs)
        assert cka["mean"] == pytest.approx(expected[0], abs=1e-9)
        assert cka["ci"] == pytest.approx(list(expected[1:]), abs=1e-9)
        per_layer = [sum(atlas.matrix(r, m)[k][k] for r, m in pairs) / len(pairs) for k in range(7)]
        assert cka["per_layer"] == pytest.approx(per_layer, abs=1e-9)
    # The Mixer point identical to the reference: same-model pairs are left out (9 - 3).
    same = next(a for a in summary["arms"] if a["name"] == "mixer[patch_size=2,embed_dim=32]")
    assert same["cka_diagonal"]["n_pairs"] == 6
    s2s = [diag_mean(atlas.matrix(refs[i], refs[j])) for i, j in ((0, 1), (0, 2), (1, 2))]
    expected = t_stats(s2s)
    baseline = summary["baselines"]["seed_to_seed"]
    assert baseline["mean"] == pytest.approx(expected[0], abs=1e-9)
    assert baseline["ci"] == pytest.approx(list(expected[1:]), abs=1e-9)


def test_summary_shape_table_and_plots() -> None:
    plan = studies.plan("sparsity", seeds=2)
    done = finished(plan)
    atlas = FakeAtlas([d["name"] for d in done], seed=1)
    result = studies.summarize(plan, done, atlas)
    summary = result.summary
    assert summary["study"] == "sparsity" and summary["dataset"]["name"] == "digits"
    assert {"arch", "config", "omega"} <= set(summary["reference"])
    matched = next(a for a in summary["arms"] if a["config"].get("density") == 0.046875)
    assert matched["family"] == "sw_mlp" and matched["seeds"] == [0, 1]
    for arm in summary["arms"]:
        assert {"name", "family", "arch", "config", "omega", "effective_width", "seeds"} <= set(arm)
        assert set(arm["accuracy"]) >= {"mean", "ci"}
        assert set(arm["cka_diagonal"]) >= {"mean", "ci", "per_layer"}
        assert "seed" not in arm["config"]
    assert set(summary["baselines"]["seed_to_seed"]) >= {"mean", "ci"}

    table = result.table
    assert list(table.columns) == list(studies.TABLE_COLUMNS)
    # Every model: 7 × 7 layer pairs; with two reference seeds each arm model has two
    # references (mean and interval), each reference model one (no interval).
    n_models = 2 * (len(plan.entries) + 1)
    assert len(table) == n_models * 49
    ref0, ref1 = plan.reference.keys[0], plan.reference.keys[1]
    name = {d["key"]: d["name"] for d in done}
    row = table[(table.arm == "rp_mixer") & (table.seed == 1)].iloc[3 * 7 + 5]
    rp = name[plan.entries[-1].keys[1]]
    cells = [atlas.matrix(name[r], rp)[3][5] for r in (ref0, ref1)]
    assert (row.reference_layer, row.model_layer) == ("l3", "l5")
    assert row.cka == pytest.approx(sum(cells) / 2, abs=1e-9)
    assert row.ci_high - row.ci_low == pytest.approx(
        2 * T975[1] * abs(cells[0] - cells[1]) / math.sqrt(2) / math.sqrt(2), abs=1e-9
    )
    ref_rows = table[table.role == "reference"]
    assert set(ref_rows.n_references) == {1} and ref_rows.ci_low.isna().all()
    assert "arm,group,role" in result.csv().splitlines()[0]

    assert result.plots["png"].startswith(b"\x89PNG")
    assert b"<svg" in result.plots["svg"][:400]
    assert studies.render_plot(summary, "svg") == result.plots["svg"]  # deterministic
    width = studies.plan("width", seeds=1)
    done = finished(width)
    png = studies.summarize(width, done, FakeAtlas([d["name"] for d in done])).plots["png"]
    from PIL import Image

    size = Image.open(io.BytesIO(png)).size  # the plot, and the differences below it
    assert size[0] == 640 and size[1] > 420


def test_unfinished_trainings_are_left_out() -> None:
    plan = studies.plan(small_spec())
    done = finished(plan)[:-1]  # the last training (rp, seed 1) has not finished
    summary = studies.summarize(plan, done, FakeAtlas([d["name"] for d in done])).summary
    rp = next(a for a in summary["arms"] if a["name"] == "rp")
    assert rp["seeds"] == [0] and rp["accuracy"]["ci"] == [None, None]
    with pytest.raises(StudyError, match="no reference model"):
        studies.summarize(plan, [], FakeAtlas([]))


def test_the_summary_says_where_the_trainings_ran() -> None:
    """One row per device, device name, precision and determinism, with its count; checkpoints
    that record no device (older ones) have a row of their own; items outside the plan do not
    count."""
    plan = studies.plan(small_spec())
    done = finished(plan)
    gpu = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "precision": "fp32"}
    for i, item in enumerate(done):
        if i < 3:
            item["training"] = gpu | {"deterministic": True, "seed": i, "seconds": 1.0}
        elif i == 3:
            item["training"] = {"device": "cpu", "device_name": "Xeon", "precision": "bf16"}
            item["training"] |= {"deterministic": True}
        else:
            item["training"] = {"epochs": 1}  # from before trainings recorded their device
    outside = {"key": "not-in-the-plan", "name": "x", "accuracy": 0.5, "training": gpu}
    atlas = FakeAtlas([d["name"] for d in done])
    summary = studies.summarize(plan, [*done, outside], atlas).summary
    unrecorded = len(done) - 4
    rows = [gpu | {"deterministic": True, "trainings": 3}]
    rows.append({"device": None, "device_name": None, "precision": None, "deterministic": None})
    rows[-1]["trainings"] = unrecorded
    rows.append(
        {"device": "cpu", "device_name": "Xeon", "precision": "bf16", "deterministic": True}
    )
    rows[-1]["trainings"] = 1
    assert unrecorded > 1 and summary["devices"] == sorted(rows, key=lambda r: -r["trainings"])
