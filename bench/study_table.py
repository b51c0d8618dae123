"""Print a study's summary.json as the Markdown table of the README.

python bench/study_table.py studies/sparsity/summary.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _num(value: Any, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _interval(stat: dict[str, Any] | None, scale: float = 1.0, digits: int = 3) -> str:
    if not stat or stat.get("mean") is None:
        return "—"
    mean = stat["mean"] * scale
    low, high = stat.get("ci") or [None, None]
    if low is None or high is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"


def table(summary: dict[str, Any]) -> str:
    ref = summary["reference"]
    lines = [
        f"| arm | family | density p | Ω | width m | S × C | test accuracy % (95 % CI) | "
        f"diagonal CKA vs {ref['name']} (95 % CI) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in [ref, *summary["arms"]]:
        shape = f"{arm['S']} × {arm['C']}" if arm.get("S") else "—"
        lines.append(
            f"| {arm['name']}{' (reference)' if arm is ref else ''} | {arm['family']} | "
            f"{_num(arm.get('density'), 4)} | {arm['omega']:,} | {arm['effective_width']:,} | "
            f"{shape} | {_interval(arm['accuracy'], 100, 1)} | "
            f"{_interval(arm.get('cka_diagonal'))} |"
        )
    base = summary["baselines"]["seed_to_seed"]
    lines.append("")
    lines.append(
        f"Seed-to-seed baseline ({ref['name']} against itself at another seed): "
        f"{_interval(base)} over {base.get('n_pairs', 0)} pairs."
    )
    if summary.get("differences"):
        lines += ["", differences_table(summary)]
    return "\n".join(lines)


def differences_table(summary: dict[str, Any]) -> str:
    """Each arm minus the matched arm and minus the seed-to-seed baseline, with the decision."""
    ref = summary["reference"]["name"]
    lines = [
        f"| arm | minus | difference in diagonal CKA vs {ref} | 95 % interval | p | "
        f"closer to {ref}? | image se |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    words = {"closer": "yes", "farther": "no, farther", "undecided": "undecided", None: "—"}
    for d in summary["differences"]:
        versus = "seed to seed" if d["versus"] == "seed_to_seed" else d["versus"]
        interval = "—" if d["low"] is None else f"[{d['low']:+.3f}, {d['high']:+.3f}]"
        estimate = "—" if d["estimate"] is None else f"{d['estimate']:+.3f}"
        p = "—" if d["p_value"] is None else f"{d['p_value']:.3f}"
        # the images' share of the interval: paired over the same images, or summed (older runs)
        images = "—" if d.get("input_se") is None else f"{d['input_se']:.4f}"
        if d.get("images") == "summed":
            images += " (summed)"
        lines.append(
            f"| {d['arm']} | {versus} | {estimate} | {interval} | {p} | {words[d['decision']]} "
            f"| {images} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))))
