"""Which layers of a model to read, and reading them: one forward pass per batch.

Layer names are module names from ``model.named_modules()`` plus ``pre_logits``: the pooled
features that enter ``head`` (read with a forward pre-hook on ``head``). The default list of a
timm-style model (``stem``, ``blocks``, ``norm``, ``head``) is the stem output, every block
output, the final norm and the pooled pre-logits; other models fall back to timm's
``feature_info`` modules, or to their top-level children.

A selection is a name, a glob, an index into the default list, or a sequence of them. In a
glob ``*`` and ``?`` stay within one dotted component and ``**`` crosses dots, so
``blocks.*`` means the block outputs and ``blocks.**.fc1`` every ``fc1`` inside a block.
Integer-looking strings (``"-1"``) are indices, so command-line values work unchanged.

Reading uses ``forward_intermediates`` when the model has it and every selected layer is one
of the standard ones; otherwise forward hooks, which are removed again whatever happens.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import torch
from torch import nn

from analysis.errors import LayerError, closest

__all__ = [
    "FEATURE_POLICIES",
    "FeaturePolicy",
    "LayerReader",
    "LayerSelection",
    "available_layers",
    "check_feature",
    "default_layers",
    "fold_names",
    "resolve_layers",
    "to_features",
]

LayerSelection = str | int | Sequence[str | int]
FeaturePolicy = Literal["flatten", "mean_tokens", "cls"]
FEATURE_POLICIES: tuple[FeaturePolicy, ...] = get_args(FeaturePolicy)
PRE_LOGITS = "pre_logits"
_STANDARD = re.compile(r"stem|blocks\.\d+|norm|pre_logits")
_INT = re.compile(r"[+-]?\d+")


def _has_blocks(model: nn.Module) -> bool:
    return isinstance(getattr(model, "blocks", None), nn.Sequential | nn.ModuleList)


def _modules(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if name}


def _is_timm(model: nn.Module) -> bool:
    """A timm architecture (built by timm or imported), not one of the project's presets."""
    atlas = getattr(model, "atlas_config", None)
    family = atlas.get("family") if isinstance(atlas, dict) else None
    return family == "timm" and hasattr(model, "forward_intermediates")


def prefix_tokens(model: nn.Module) -> int:
    """How many class/register tokens precede the patch tokens in the model's blocks."""
    n = getattr(model, "num_prefix_tokens", 0)
    return n if isinstance(n, int) and n > 0 else 0


def available_layers(model: nn.Module) -> list[str]:
    """Every name a selection can match, in forward order as far as module order tells."""
    names = list(_modules(model))
    if PRE_LOGITS not in names and isinstance(getattr(model, "head", None), nn.Module):
        names.insert(names.index("head"), PRE_LOGITS)
    return names


def default_layers(model: nn.Module) -> list[str]:
    """Stem output, every block output, final norm and pooled pre-logits, where they exist."""
    mods = _modules(model)
    has_head = isinstance(getattr(model, "head", None), nn.Module)
    if _has_blocks(model) and _is_timm(model):
        # timm's own architectures: the blocks forward_intermediates returns, nothing else
        return [f"blocks.{i}" for i in range(len(model.blocks))]  # type: ignore[arg-type]
    if _has_blocks(model):
        names = ["stem"] if "stem" in mods else []
        names += [f"blocks.{i}" for i in range(len(model.blocks))]  # type: ignore[arg-type]
        names += ["norm"] if "norm" in mods else []
    elif hasattr(model, "feature_info"):
        info: Any = model.feature_info
        names = [str(i["module"]) for i in info if i["module"] in mods]
    else:
        names = [name for name, _ in model.named_children() if name != "head"]
    return names + ([PRE_LOGITS] if has_head and PRE_LOGITS not in names else [])


def _glob(pattern: str) -> Callable[[str], bool]:
    """A matcher for a layer glob: ``*`` spans no dot, ``**`` spans anything, ``?`` one non-dot.

    The glob runs as an NFA over bit sets, so matching is linear in the name's length for any
    pattern; a backtracking regex takes exponential time on globs such as ``*******…x``, and
    the pattern comes from a request.
    """
    tokens: list[str] = []  # "*", "**", "?" or one literal character
    i = 0
    while i < len(pattern):
        token = "**" if pattern.startswith("**", i) else pattern[i]
        i += len(token)
        if token in ("*", "**") and tokens and tokens[-1] in ("*", "**"):
            tokens[-1] = "**"  # a run of stars that holds "**" is one "**"
            continue
        tokens.append(token)
    eps = stay_any = stay_word = any_word = 0
    literal: dict[str, int] = {}
    for k, token in enumerate(tokens):
        bit = 1 << k
        if token == "**":
            eps, stay_any = eps | bit, stay_any | bit
        elif token == "*":
            eps, stay_word = eps | bit, stay_word | bit
        elif token == "?":
            any_word |= bit
        else:
            literal[token] = literal.get(token, 0) | bit
    accept = 1 << len(tokens)
    # Star tokens are never adjacent, so one epsilon step closes a state set.
    start = 1 | ((1 & eps) << 1)

    def match(name: str) -> bool:
        state = start
        for c in name:
            word = c != "."
            advance = literal.get(c, 0) | (any_word if word else 0)
            stay = stay_any | (stay_word if word else 0)
            state = ((state & advance) << 1) | (state & stay)
            state |= (state & eps) << 1
            if not state:
                return False
        return bool(state & accept)

    return match


def fold_names(names: Sequence[str], limit: int = 24) -> str:
    """Layer names in one line, in module order: numbered runs folded into ranges
    (``blocks.0–blocks.11``), the modules inside numbered ones as globs (``blocks.*.norm1``),
    and the modules two levels down (a number does not count as a level) summed up by the first
    of them; past ``limit`` items, ``…``."""
    runs: dict[str, list[int]] = {}  # "blocks.*" -> the numbers, for a name with one number
    shown: list[str] = []
    deeper: list[str] = []
    for name in names:
        parts = name.split(".")
        numbered = [part.isdigit() for part in parts]
        glob = ".".join(
            "*" if number else part for part, number in zip(parts, numbered, strict=True)
        )
        if len(parts) - sum(numbered) > 2:
            deeper.append(glob)
        elif numbered[-1] and sum(numbered) == 1:  # blocks.3: one of a run
            if glob not in runs:
                runs[glob] = []
                shown.append(glob)
            runs[glob].append(int(parts[-1]))
        elif glob not in shown:
            shown.append(glob)  # inside numbered modules: one glob for all of them
    items: list[str] = []
    for item in shown:
        items += _ranges(item[:-1], runs[item]) if item in runs else [item]
    folded = ", ".join(items[:limit]) + (", …" if len(items) > limit else "")
    return folded + (f" and the modules inside them ({deeper[0]}, …)" if deeper else "")


def _ranges(prefix: str, numbers: list[int]) -> list[str]:
    """``prefix`` + each run of consecutive ``numbers``: ``blocks.0–blocks.11``, ``blocks.14``."""
    out, ordered = [], sorted(set(numbers))
    start = previous = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == previous + 1:
            previous = n
            continue
        out.append(f"{prefix}{start}" + (f"–{prefix}{previous}" if previous > start else ""))
        if n is not None:
            start = previous = n
    return out


def resolve_layers(
    model: nn.Module,
    selection: LayerSelection | None = None,
    *,
    model_name: str = "model",
    listing: str = "analysis.available_layers(model) lists them all",
) -> list[str]:
    """The layer names ``selection`` picks from ``model``, without running it.

    Each item must match at least one layer, else a :class:`LayerError` of one line names the
    closest names, the model's layers folded (:func:`fold_names`) and ``listing``: what lists
    them all for the caller's user (a URL, a command). Names keep the order of the selection;
    a glob expands in module order; duplicates go.
    """
    defaults = default_layers(model)
    if selection is None:
        if not defaults:
            raise LayerError(f"{model_name} has no layers to compare")
        return defaults
    items = [selection] if isinstance(selection, str | int) else list(selection)
    if not items:
        raise LayerError(f"the layer selection for {model_name} is empty")
    available = available_layers(model)
    picked: list[str] = []
    for item in items:
        if isinstance(item, str) and _INT.fullmatch(item.strip()):
            item = int(item)
        if isinstance(item, int):
            if not -len(defaults) <= item < len(defaults):
                raise LayerError(
                    f"layer index {item} is out of range for {model_name}, whose "
                    f"{len(defaults)} default layers are {fold_names(defaults)}; {listing}"
                )
            found = [defaults[item]]
        elif item in available:
            found = [item]
        else:
            matches = _glob(item)
            found = [name for name in available if matches(name)]
        if not found:
            near = closest(str(item), available)
            raise LayerError(
                f"layer selection {item!r} matches no layer of {model_name}"
                + (f"; closest: {', '.join(near)}" if near else "")
                + f"; its {len(available)} layers: {fold_names(available)}; {listing}"
            )
        picked += [name for name in found if name not in picked]
    return picked


def to_features(t: torch.Tensor, policy: str, prefix: int = 0) -> torch.Tensor:
    """(b, ...) activations to a (b, d) feature matrix.

    ``flatten`` is vec(X) per sample, prefix tokens included; ``mean_tokens`` averages the
    patch tokens (B, S, C) → (B, C), leaving out the ``prefix`` class/register tokens, and
    spatial positions (B, C, H, W) → (B, C); ``cls`` keeps the first prefix token (B, C).
    2-D activations pass through whatever the policy.
    """
    if t.dim() == 2:
        return t
    if policy == "flatten":
        return t.reshape(t.shape[0], -1)
    if policy == "cls":
        if t.dim() != 3 or not prefix:
            raise LayerError("the cls feature policy needs a model with a class token")
        return t[:, 0]
    if t.dim() == 3:
        return t[:, prefix:].mean(1)
    return t.mean(dim=tuple(range(2, t.dim())))


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, list | tuple):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


def check_feature(model: nn.Module, feature: str, model_name: str | None = None) -> None:
    """Raise :class:`LayerError` if ``model`` cannot give the ``feature`` policy: ``cls`` needs
    a class token (a weightless skeleton of the architecture answers as well as the model)."""
    if feature == "cls" and not prefix_tokens(model):
        name = model_name or type(model).__name__
        raise LayerError(
            f"the cls feature policy needs a model with a class token; {name} has none "
            "(use flatten or mean_tokens)"
        )


class LayerReader:
    """Runs a model once on a batch and returns the selected layers as (b, d) features."""

    def __init__(self, model: nn.Module, layers: Sequence[str], feature: str = "flatten") -> None:
        if feature not in FEATURE_POLICIES:
            raise LayerError(
                f"unknown feature policy {feature!r}; use 'flatten', 'mean_tokens' or 'cls'"
            )
        self.model, self.layers, self.feature = model, list(layers), feature
        self.prefix = prefix_tokens(model)
        check_feature(model, feature)
        self.use_intermediates = (
            not self.prefix  # forward_intermediates drops prefix tokens; hooks keep them
            and _has_blocks(model)
            and all(_STANDARD.fullmatch(name) for name in self.layers)
            and all(hasattr(model, a) for a in ("forward_intermediates", "forward_head", "stem"))
            and (PRE_LOGITS not in _modules(model))
        )
        # Token layout skips the (B, H, W, C) -> NCHW copy; models that refuse it get the default.
        fi: Any = getattr(model, "forward_intermediates", None)
        self._nlc = self.use_intermediates and "output_fmt" in inspect.signature(fi).parameters

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self._intermediates(x) if self.use_intermediates else self._hooked(x)
        feats = []
        for name in self.layers:
            t = out[name]
            if t.shape[0] != x.shape[0]:
                raise LayerError(f"layer {name!r} does not keep the batch as its first dimension")
            feats.append(to_features(t, self.feature, self.prefix))
        return feats

    def _intermediates(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        model: Any = self.model
        out: dict[str, torch.Tensor] = {}
        idx = sorted({int(n.split(".")[1]) for n in self.layers if n.startswith("blocks.")})
        tail = "norm" in self.layers or PRE_LOGITS in self.layers
        if not idx and not tail:
            out["stem"] = model.stem(x)
            return out
        handle = None
        if "stem" in self.layers:
            handle = model.stem.register_forward_hook(lambda _m, _i, o: out.__setitem__("stem", o))
        try:
            if idx:
                kw: dict[str, Any] = {"indices": idx, "stop_early": not tail}
                kw["intermediates_only"] = not tail
                if self._nlc:
                    try:
                        res = model.forward_intermediates(x, output_fmt="NLC", **kw)
                    except (AssertionError, ValueError, NotImplementedError):
                        self._nlc = False
                        res = model.forward_intermediates(x, **kw)
                else:
                    res = model.forward_intermediates(x, **kw)
                final, inters = (None, res) if not tail else res
                out.update({f"blocks.{i}": t for i, t in zip(idx, inters, strict=True)})
            else:
                final = model.forward_features(x)
        finally:
            if handle is not None:
                handle.remove()
        if final is not None:
            out["norm"] = final
            if PRE_LOGITS in self.layers:
                out[PRE_LOGITS] = model.forward_head(final, pre_logits=True)
        return out

    def _hooked(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        mods = _modules(self.model)
        out: dict[str, torch.Tensor] = {}
        calls: dict[str, int] = dict.fromkeys(self.layers, 0)

        def keep(name: str) -> Callable[[Any], None]:
            def store(value: Any) -> None:
                calls[name] += 1
                t = _first_tensor(value)
                if t is not None:
                    out[name] = t

            return store

        handles = []
        try:
            for name in self.layers:
                if name == PRE_LOGITS and name not in mods:
                    f = keep(name)
                    handles.append(mods["head"].register_forward_pre_hook(lambda _m, a, f=f: f(a)))
                else:
                    f = keep(name)
                    handles.append(mods[name].register_forward_hook(lambda _m, _a, o, f=f: f(o)))
            self.model(x)
        finally:
            for h in handles:
                h.remove()
        for name, count in calls.items():
            if count == 0:
                raise LayerError(f"layer {name!r} did not run in the forward pass")
            if count > 1:
                raise LayerError(f"layer {name!r} ran {count} times in one forward pass")
            if name not in out:
                raise LayerError(f"layer {name!r} gives no tensor to compare")
        return out
