"""``cka-atlas compare``: CKA between every layer pair of checkpoints, from the command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli import help_data
from app.cli.commands import command, no_progress_flag
from app.cli.models import MODEL_HELP, checkpoint_path

if TYPE_CHECKING:
    from analysis import Atlas

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
    p.add_argument("checkpoints", nargs="+", metavar="MODEL", help=f"{MODEL_HELP}; repeatable")
    p.add_argument("--dataset", required=True, help="'digits' or a .npz / ImageFolder / .zip")
    p.add_argument("--split", default="test", help="split of the built-in digits (default test)")
    p.add_argument(
        "--layers",
        nargs="+",
        help="layer names, globs (blocks.*) or indices into the default list (default: all)",
    )
    _add_option_flags(p)
    p.add_argument(
        "--sibling",
        action="append",
        default=[],
        metavar="MODEL",
        help="a model that is only a candidate seed sibling (repeatable)",
    )
    p.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    no_progress_flag(p, "bar")
    p.add_argument("--gram-cache", type=Path, metavar="DIR", help="keep per-batch Grams here")
    p.add_argument("--out", type=Path, help="write the atlas as JSON here")
    p.add_argument("--heatmap", type=Path, help="write the heatmap grid here (.png or .svg)")
    p.add_argument(
        "--heatmap-measure",
        default="cka",
        metavar="MEASURE",
        help="the measure the heatmap draws: cka (default) or one given with --measure",
    )


def _add_option_flags(p: argparse.ArgumentParser) -> None:
    """One flag per :class:`analysis.CompareOptions` field, typed, bounded and described by it
    (``--layers`` is taken above, with ``nargs``); a deprecated one is hidden from the help
    but still read. Left out, an option keeps its default (None here: the options' own). The
    specs come from :mod:`app.cli.help_data` (:func:`analysis.option_specs`, kept as data), so
    that the parser loads no torch."""
    for spec in help_data.load()["options"]:
        name, kind, choices = spec["name"], spec["kind"], spec["choices"]
        flag = "--" + name.replace("_", "-")
        described = spec["description"].replace("%", "%%")  # argparse formats help with %
        shown = (
            argparse.SUPPRESS if spec["deprecated"] else f"{described} (default {spec['default']})"
        )
        if name == "measures":  # one name per flag, repeatable (comma lists read too)
            p.add_argument(
                "--measure",
                dest="measures",
                action="append",
                choices=choices,
                help=f"{shown}; repeat for several",
            )
        elif kind == "flag":
            p.add_argument(flag, action="store_true", default=None, help=described)
        elif kind == "choice":
            p.add_argument(flag, choices=choices, help=shown)
        elif kind == "choices":
            listed = ",".join(choices)
            p.add_argument(flag, metavar="LIST", help=f"{shown}; comma-separated: {listed}")
        elif kind == "int":
            p.add_argument(flag, type=int, help=shown)
        elif kind == "text":
            p.add_argument(flag, help=shown)


def _names(wanted: list[str], taken: list[str] | None = None) -> list[str]:
    """``wanted`` made unique (``name-2``, ``name-3``, …), also against ``taken``."""
    names: list[str] = list(taken or [])
    for stem in wanted:
        name, i = stem, 2
        while name in names:
            name, i = f"{stem}-{i}", i + 1
        names.append(name)
    return names[len(taken or []) :]


def _load(refs: list[str], keys: dict[str, str], taken: list[str]) -> dict[str, tuple[str, Any]]:
    """The models ``refs`` name (:func:`app.cli.models.checkpoint_path`), by unique name: the
    argument that named it and the network; their sha256 goes into ``keys``."""
    import models

    found = [checkpoint_path(ref) for ref in refs]
    out = {}
    for name, ref, (_, path) in zip(_names([n for n, _ in found], taken), refs, found, strict=True):
        net, meta = models.load(path)
        out[name] = (ref, net)
        keys[name] = str(meta.get("weights_sha256") or models.file_sha256(path))
    return out


def _check_layers(loaded: dict[str, tuple[str, Any]], layers: Any) -> None:
    """Each model's layer selection, checked before any forward pass; a bad one points to the
    command that lists that model's layers."""
    from analysis.layers import resolve_layers

    if layers is None or isinstance(layers, dict):
        return
    for ref, net in loaded.values():
        resolve_layers(
            net, layers, model_name=ref, listing=f"`cka-atlas layers {ref}` lists them all"
        )


def _number(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _options(args: argparse.Namespace) -> Any:
    """The :class:`analysis.CompareOptions` the flags ask for, validated once (by the same type
    as a REST request); a bad value exits with one sentence naming its flag."""
    from analysis import CompareOptions, OptionsError, option_specs

    given = {name: getattr(args, name, None) for name in option_specs() if name != "layers"}
    try:
        return CompareOptions.build(
            layers=args.layers, **{k: v for k, v in given.items() if v is not None}
        )
    except OptionsError as exc:
        flag = "--" + exc.field.split(".")[0].replace("_", "-")
        raise SystemExit(f"error: {flag}: {exc}") from None


def _diagonal_mean(block: Any) -> float | None:
    """The mean of a block's diagonal (the same depth on both sides), None if undefined."""
    import numpy as np

    diagonal = np.diagonal(block)
    finite = diagonal[np.isfinite(diagonal)]
    return float(finite.mean()) if finite.size else None


def _flag_lines(atlas: Atlas, measure: str) -> list[str]:
    """One warning per flag of ``measure`` raised somewhere in ``atlas``: what it means and in
    how many of the cells of the pairs printed (docs/measures.md, "Flags")."""
    from analysis.measures import flags_of

    lines = []
    for flag in flags_of(measure):
        blocks = [atlas.flagged(measure, a, b).get(flag.name) for a, b in atlas.pairs()]
        found = [block for block in blocks if block is not None]
        count = sum(int(block.sum()) for block in found)
        if count:
            total = sum(block.size for block in found)
            lines.append(f"warning: {measure}: {flag.label}, in {count} of {total} cells")
    return lines


def run(args: argparse.Namespace) -> int:
    import analysis  # heavy imports stay out of `cka-atlas --help`
    from analysis.plot import render_atlas
    from app.store.cells import VERDICT_LEGEND, Cells, probability_text, verdict_marks

    options = _options(args)
    if args.heatmap_measure not in options.measures:
        raise SystemExit(
            f"error: --heatmap-measure: {args.heatmap_measure!r} is not among the measures "
            f"computed ({', '.join(options.measures)}); add --measure {args.heatmap_measure}"
        )
    dataset = analysis.load_dataset(args.dataset, split=args.split)
    keys: dict[str, str] = {}
    loaded = _load(args.checkpoints, keys, [])
    _check_layers(loaded, options.layers)
    siblings = _load(args.sibling, keys, list(loaded))
    cache = analysis.DirectoryGramCache(args.gram_cache) if args.gram_cache else None
    atlas = analysis.compare(
        {name: net for name, (_, net) in loaded.items()},
        dataset,
        options,
        siblings={name: net for name, (_, net) in siblings.items()},
        progress=not args.no_progress,
        gram_cache=cache,
        model_keys=keys,
        device=args.device,
    )
    result = atlas.to_dict()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, allow_nan=False) + "\n")
    if args.heatmap:
        fmt = "svg" if args.heatmap.suffix.lower() == ".svg" else "png"
        args.heatmap.parent.mkdir(parents=True, exist_ok=True)
        args.heatmap.write_bytes(render_atlas(atlas, fmt, measure=args.heatmap_measure))
    width = max(len(n) for n in atlas.models)
    print(f"n = {atlas.n} samples of {dataset.name}, {atlas.diagnostics['batches']} batches")
    cells = Cells(result)
    judged = cells.has("learned_verdict") or cells.has("seed_verdict")
    print(
        f"{'a':<{width}}  {'b':<{width}}  {'mean diagonal CKA':>17}  {'95 % interval':>16}  "
        f"{'max p':>6}  {'max q':>6}  {'random init ± sd':>20}  {'seed ceiling':>12}  "
        + (f"{'learned':>8}  {'seed':>8}  " if judged else "")
        + "over"
    )
    for a, b in atlas.pairs():
        sm = cells.summary(a, b)
        ci = "-" if sm.ci_low is None else f"[{_number(sm.ci_low)}, {_number(sm.ci_high)}]"
        init = _number(sm.random_init)
        if sm.random_init_sd is not None:
            init += f" ± {_number(sm.random_init_sd)}"
        marks = ""
        if judged:
            learned = verdict_marks(sm.learned_verdicts or {}, "learned") or "-"
            seed = verdict_marks(sm.seed_verdicts or {}, "seed") or "-"
            marks = f"{learned:>8}  {seed:>8}  "
        print(
            f"{a:<{width}}  {b:<{width}}  {_number(sm.cka):>17}  {ci:>16}  "
            f"{probability_text(sm.max_p_value):>6}  {probability_text(sm.max_q_value):>6}  "
            f"{init:>20}  "
            f"{_number(sm.seed_ceiling):>12}  {marks}{sm.kind}"
        )
    if judged:
        print(f"verdicts: {VERDICT_LEGEND}")
    for measure in atlas.measure_names[1:]:
        means = "  ".join(
            f"{a}×{b} {_number(_diagonal_mean(atlas.matrix(a, b, measure)))}"
            for a, b in atlas.pairs()
        )
        print(f"{measure}: mean diagonal {means}")
        for line in _flag_lines(atlas, measure):
            print(line)
    for warning in atlas.diagnostics.get("warnings", []):
        print(f"warning: {warning}")
    for item in atlas.diagnostics["undefined_layers"]:
        print(f"note: {item['model']} {item['layer']}: {item['reason']}")
    return 0
