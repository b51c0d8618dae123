"""``cka-atlas export``: a stored comparison's cells as one long table (CSV or Parquet)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from app.cli.commands import command

__all__ = ["register", "run"]

FORMATS = ("csv", "parquet")


def register(subparsers: Any) -> None:
    p = command(
        subparsers,
        "export",
        run,
        "Write a finished comparison's cells as a CSV or Parquet table",
        "One row per cell of every model pair and measure: model_a, layer_a, model_b, layer_b, "
        "measure, value, cca_degenerate, cka, ci_low, ci_high, p_value, q_value, null_mean, "
        "null_q95, p_method (what p rests on), random_init, random_init_sd, seed_ceiling, "
        "sensitivity, flags (the measure's flags raised at the cell), then the verdicts learned, "
        "learned_low, learned_high, learned_verdict, seed_gap, seed_gap_low, seed_gap_high, "
        "seed_verdict (empty where not computed or undefined). Reads the database of "
        "CKA_DATABASE_URL / CKA_DATA_DIR.",
    )
    p.add_argument("comparison_id", type=int, metavar="COMPARISON_ID")
    p.add_argument(
        "--format",
        choices=FORMATS,
        help="csv or parquet (default: from --out's suffix, else csv)",
    )
    p.add_argument(
        "--out",
        help="file to write (default comparison-ID-cells.FORMAT; '-' for standard output)",
    )


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return str(args.format)
    suffix = Path(args.out).suffix.lower().lstrip(".") if args.out and args.out != "-" else ""
    return suffix if suffix in FORMATS else "csv"


def _rows(cells: Any) -> str:
    """What the table holds, as the file counts it: one row per cell and measure."""
    count = sum(len(cells.layers[a]) * len(cells.layers[b]) for a, b in cells.pairs())
    measures = len(cells.measure_names)
    if measures == 1:
        return f"{count} rows (one per cell)"
    return f"{count * measures} rows ({count} cells × {measures} measures)"


def run(args: argparse.Namespace) -> int:
    from app.cli.store import open_store
    from app.store.cells import Cells
    from app.store.orm import Comparison
    from app.store.settings import Settings

    fmt = _format(args)
    db = open_store(Settings())
    try:
        with db.session(readonly=True) as s:
            cmp = s.get(Comparison, args.comparison_id)
            if cmp is None:
                print(f"error: comparison {args.comparison_id} does not exist", file=sys.stderr)
                return 2
            if cmp.result is None:
                print(
                    f"error: comparison {args.comparison_id} is {cmp.job.status}; it has no "
                    "result yet",
                    file=sys.stderr,
                )
                return 2
            result = cmp.result
    finally:
        db.dispose()
    cells = Cells(result)
    data = cells.to_csv() if fmt == "csv" else cells.to_parquet()
    if args.out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    out = Path(args.out or f"comparison-{args.comparison_id}-cells.{fmt}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    print(f"wrote {_rows(cells)} of comparison {args.comparison_id} to {out}", file=sys.stderr)
    return 0
