"""``cka-atlas compare``: CKA between every layer pair of checkpoints, from the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from app.cli.commands import command

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = command(
        subparsers,
        "compare",
        run,
        "CKA between every layer pair of the given checkpoints",
        "Run every checkpoint once per batch over a dataset and write the CKA atlas: every "
        "layer pair of every model pair, each model with itself included.",
    )
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help=".safetensors checkpoints")
    p.add_argument("--dataset", required=True, help="'digits' or a .npz / ImageFolder / .zip")
    p.add_argument("--split", default="test", help="split of the built-in digits (default test)")
    p.add_argument(
        "--layers",
        nargs="+",
        help="layer names, globs (blocks.*) or indices into the default list (default: all)",
    )
    _add_option_flags(p)
    p.add_argument(
        "--baselines",
        default="",
        metavar="LIST",
        help="comma-separated: random_init (untrained twins, same pipeline), seed_ceiling "
        "(a checkpoint's seed sibling among CKPT and --sibling in its place)",
    )
    p.add_argument(
        "--sibling",
        type=Path,
        action="append",
        default=[],
        metavar="CKPT",
        help="a checkpoint that is only a candidate seed sibling (repeatable)",
    )
    p.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    p.add_argument("--gram-cache", type=Path, metavar="DIR", help="keep per-batch Grams here")
    p.add_argument("--out", type=Path, help="write the atlas as JSON here")
    p.add_argument("--heatmap", type=Path, help="write the heatmap grid here (.png or .svg)")


def _add_option_flags(p: argparse.ArgumentParser) -> None:
    """One flag per :class:`analysis.CompareOptions` field, typed, bounded and described by it
    (``--layers`` is taken above, with ``nargs``)."""
    from analysis import option_specs

    for spec in option_specs().values():
        flag = "--" + spec.name.replace("_", "-")
        described = spec.description.replace("%", "%%")  # argparse formats help with %
        help_text = f"{described} (default {spec.default})"
        if spec.kind == "flag":
            p.add_argument(flag, action="store_true", help=described)
        elif spec.kind == "choice":
            p.add_argument(flag, choices=spec.choices, default=spec.default, help=help_text)
        elif spec.kind == "int":
            p.add_argument(flag, type=int, default=spec.default, help=help_text)
        elif spec.kind == "text":
            p.add_argument(flag, default=spec.default, help=help_text)


def _names(paths: list[Path]) -> list[str]:
    names: list[str] = []
    for p in paths:
        name, i = p.stem, 2
        while name in names:
            name, i = f"{p.stem}-{i}", i + 1
        names.append(name)
    return names


def _number(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _probability(v: float | None) -> str:
    """A p- or q-value: three decimals, or its order of magnitude below 0.001 (the analytic
    null reaches far smaller values than a count of permutations can)."""
    if v is None or v >= 1e-3:
        return _number(v, 3)
    return "<1e-300" if v < 1e-300 else f"{v:.0e}"


def _calibration(args: argparse.Namespace) -> Any:
    """The calibration options, validated by the same model as a REST request."""
    from pydantic import ValidationError

    from app.jobs.requests import Calibration

    try:
        return Calibration(
            permutations=args.permutations,
            null=args.null,
            sensitivity=args.sensitivity,
            random_init_draws=args.random_init_draws,
            baselines=args.baselines,
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"][:1])
        raise SystemExit(f"error: --{field}: {first['msg']}") from None


def _baselines(
    calibration: Any,
    atlas: Any,
    loaded: dict[str, Any],
    metas: dict[str, dict[str, Any]],
    keys: dict[str, str],
    dataset: Any,
    args: argparse.Namespace,
    options: dict[str, Any],
) -> dict[str, Any]:
    import models
    from analysis.baselines import random_init_baseline
    from app.jobs.baselines import (
        Identity,
        find_siblings,
        plan_seed_ceiling,
        seed_ceiling_baseline,
    )

    def identity(name: str, meta: dict[str, Any], key: str) -> Identity:
        return Identity.of(key, name, str(meta["arch"]), meta.get("config") or {}, meta)

    out: dict[str, Any] = {}
    layers = {m: list(atlas.layers[m]) for m in atlas.models}
    if "random_init" in calibration.baselines:
        out["random_init"] = random_init_baseline(
            loaded,
            dataset,
            layers=layers,
            model_keys=keys,
            seed=args.seed,
            random_init_draws=calibration.random_init_draws,
            **options,
        )
    if "seed_ceiling" in calibration.baselines:
        idents = {m: identity(m, metas[m], keys[m]) for m in loaded}
        pool = {idents[m].key: loaded[m] for m in loaded}
        candidates = list(idents.values())
        for path in args.sibling:
            net, meta = models.load(path)
            key = str(meta.get("weights_sha256") or models.file_sha256(path))
            candidates.append(identity(path.stem, meta, key))
            pool[key] = net
        chosen = plan_seed_ceiling(idents, layers, find_siblings(idents, candidates))
        out["seed_ceiling"] = seed_ceiling_baseline(
            loaded, layers, chosen, pool, dataset, **options
        )
    return out


def run(args: argparse.Namespace) -> int:
    import analysis
    import models  # heavy imports stay out of `cka-atlas --help`
    from analysis.plot import render_atlas
    from app.store.cells import Cells

    calibration = _calibration(args)
    dataset = analysis.load_dataset(args.dataset, split=args.split)
    paths = [Path(c) for c in args.checkpoints]
    loaded = {}
    keys = {}
    metas = {}
    for name, path in zip(_names(paths), paths, strict=True):
        model, meta = models.load(path)
        loaded[name] = model
        metas[name] = meta
        keys[name] = str(meta.get("weights_sha256") or models.file_sha256(path))
    cache = analysis.DirectoryGramCache(args.gram_cache) if args.gram_cache else None
    options: dict[str, Any] = {
        "kernel": args.kernel,
        "estimator": args.estimator,
        "mode": args.mode,
        "batch_size": args.batch_size,
        "feature": args.feature,
        "device": args.device,
        "dtype": args.dtype,
    }
    extra: dict[str, Any] = {"null": calibration.null}
    if calibration.permutations:
        extra["permutations"] = calibration.permutations
    if calibration.sensitivity:
        extra["sensitivity"] = True
    atlas = analysis.compare(
        loaded,
        dataset,
        layers=args.layers,
        bootstrap=args.bootstrap,
        interval=args.interval,
        seed=args.seed,
        progress=True,
        gram_cache=cache,
        model_keys=keys,
        **options,
        **extra,
    )
    result = atlas.to_dict()
    if calibration.baselines:
        result["baselines"] = _baselines(
            calibration, atlas, loaded, metas, keys, dataset, args, options | {"null": "none"}
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, allow_nan=False) + "\n")
    if args.heatmap:
        fmt = "svg" if args.heatmap.suffix.lower() == ".svg" else "png"
        args.heatmap.parent.mkdir(parents=True, exist_ok=True)
        args.heatmap.write_bytes(render_atlas(atlas, fmt))
    width = max(len(n) for n in atlas.models)
    print(f"n = {atlas.n} samples of {dataset.name}, {atlas.diagnostics['batches']} batches")
    cells = Cells(result)
    print(
        f"{'a':<{width}}  {'b':<{width}}  {'mean diagonal CKA':>17}  {'95 % interval':>16}  "
        f"{'max p':>6}  {'max q':>6}  {'random init ± sd':>20}  {'seed ceiling':>12}  over"
    )
    for a, b in atlas.pairs():
        sm = cells.summary(a, b)
        ci = "-" if sm.ci_low is None else f"[{_number(sm.ci_low)}, {_number(sm.ci_high)}]"
        init = _number(sm.random_init)
        if sm.random_init_sd is not None:
            init += f" ± {_number(sm.random_init_sd)}"
        print(
            f"{a:<{width}}  {b:<{width}}  {_number(sm.cka):>17}  {ci:>16}  "
            f"{_probability(sm.max_p_value):>6}  {_probability(sm.max_q_value):>6}  {init:>20}  "
            f"{_number(sm.seed_ceiling):>12}  {sm.kind}"
        )
    for warning in atlas.diagnostics.get("warnings", []):
        print(f"warning: {warning}")
    for name, stored in result.get("baselines", {}).items():
        for item in stored["blocks"]:
            if "reason" in item:
                pair = item["a"] if item["a"] == item["b"] else f"{item['a']} × {item['b']}"
                print(f"note: {name.replace('_', ' ')} of {pair} undefined: {item['reason']}")
    for item in atlas.diagnostics["undefined_layers"]:
        print(f"note: {item['model']} {item['layer']}: {item['reason']}")
    return 0
