"""A ``reproduce turnip-lora`` or ``turnip-prefill`` CSV as the Markdown table of
docs/results/reproductions.md (run by hand, after the command).

    offloadlab reproduce turnip-lora --out runs/
    python bench/grid_table.py runs/turnip-lora.csv --docs docs/results/reproductions.md

One row per point, TURNIP (``buildmemgraph``) beside level-wise: the simulated time, the
paper's where it gives one, the graph's size, the offloads and each stage's seconds of the
machine that ran it.  ``--docs PAGE`` writes it between the page's
``<!-- reproduce: offloadlab reproduce NAME -->`` and ``<!-- reproduce -->`` lines.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pandas as pd
from timing import markdown, replace_docs_block

PLANNERS = ("buildmemgraph", "levelwise")
TIMES = {"turnip-lora": ("step", "step TURNIP / level-wise (s)"),
         "turnip-prefill": ("ttft", "time to first token TURNIP / level-wise (s)")}


def tokens(seq: int) -> str:
    return f"{seq // 1024}K" if seq % 1024 == 0 else str(seq)


def seconds(x: float) -> str:
    """Three significant digits, without an exponent from 1,000 s on (``2,030``)."""
    return format(x, ".3g") if abs(x) < 1000 else format(x, ",.0f")


def table(rows: pd.DataFrame, time: str, label: str) -> pd.DataFrame:
    """One row per point, the two planners' values joined by `` / ``."""
    def pair(point: pd.DataFrame, column: str, show: Callable[[float], str]) -> str:
        by = point.set_index("planner")[column]
        return " / ".join("" if pd.isna(by.get(p)) else show(by[p]) for p in PLANNERS)

    count, two = "{:,.0f}".format, "{:.2f}".format

    out = []
    for (model, seq, batch, machine), point in rows.groupby(
            ["model", "seq", "batch", "machine"], sort=False):
        ok = point["status"] == "ok"
        first = point.iloc[0]
        out.append({
            "model": model, "tokens": tokens(seq), "batch": batch, "machine": machine,
            label: pair(point.assign(**{time: point[time].where(ok)}), time, seconds)
            + ("" if ok.all() else " (" + ", ".join(
                f"{p}: {s}" for p, s in zip(point["planner"], point["status"]) if s != "ok")
               + ")"),
            "paper": "" if pd.isna(first["paper"]) else format(first["paper"], "g"),
            "TaskGraph": f"{int(first['taskgraph']):,}",
            "offloads TURNIP / level-wise": pair(point, "offloads", count),
            "build s": f"{first['build_s']:.2f}",
            "plan s": pair(point, "plan_s", two), "verify s": pair(point, "verify_s", two),
            "simulate s": pair(point, "simulate_s", two)})
    return pd.DataFrame(out)


def fail(message: str) -> NoReturn:
    """One line on stderr, exit status 2 (a bad input)."""
    print(f"grid_table: {message}", file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", type=Path, help="turnip-lora.csv or turnip-prefill.csv")
    parser.add_argument("--docs", type=Path, help="write the table into this page")
    args = parser.parse_args()
    name = args.csv.stem
    if name not in TIMES:
        fail(f"{args.csv}: expected turnip-lora.csv or turnip-prefill.csv")
    if args.docs and not args.docs.is_file():
        fail(f"--docs {args.docs}: no such page")
    try:
        rows = pd.read_csv(args.csv)
    except (OSError, ValueError) as exc:
        fail(f"{args.csv}: cannot read it as CSV ({exc})")
    missing = [c for c in ("model", "seq", "batch", "machine", "planner", "status",
                           TIMES[name][0], "paper", "taskgraph", "offloads", "build_s",
                           "plan_s", "verify_s", "simulate_s") if c not in rows.columns]
    if missing:
        fail(f"{args.csv}: not a reproduce {name} CSV: no column {', '.join(missing)}")
    shown = table(rows, *TIMES[name])
    lines = markdown(shown)         # numbers right-aligned: all but model and machine
    lines[1] = "|" + "".join(" --- |" if c in ("model", "machine") else " ---: |"
                             for c in shown.columns)
    text = "\n".join(lines)
    print(text)
    if args.docs and not replace_docs_block(
            args.docs, f"<!-- reproduce: offloadlab reproduce {name} -->", "<!-- reproduce -->",
            text):
        raise SystemExit(2)


if __name__ == "__main__":
    main()
