"""``offloadlab reproduce``: its parser and its handler."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...core.errors import SpecError
from ...core.util import fmt_bytes

if TYPE_CHECKING:
    import pandas as pd


from .common import FIXED_SHOWN, AddCommand, json_text, progress_shown
from .options import noise_levels, nonnegative_float, positive_int
from .outputs import check_out_dir


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Recreate a figure or table of a paper from our cost model: a CSV table and a plot.

    Parameters
    ----------
    args : argparse.Namespace
        The ``reproduce`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the table and plot are written.
    """
    from ..reproduce import COLUMNS, REPRODUCTIONS, parse_setting, shape_checks

    if args.what != "turnip-determinism":
        for flag, given in (("--noise", args.noise), ("--seeds", args.seeds),
                            ("--quick", args.quick), ("--fixed", args.fixed)):
            if given is not None:
                raise SpecError(f"{flag} applies to reproduce turnip-determinism only")
    if args.what == "turnip-determinism":
        return _reproduce_determinism(args)
    if args.what.startswith("turnip-"):
        return _reproduce_grid(args)
    run, plot, default = REPRODUCTIONS[args.what]
    settings = [parse_setting(s) for s in args.only.split(",")] if args.only else list(default)
    if not args.json:
        check_out_dir(args.out)
    table = run(settings, solver=args.solver, time_limit=args.time_limit, weights=args.weights,
                progress=not args.json and progress_shown(args))
    if args.json:
        print(json_text(table[COLUMNS + (["bandwidth"] if args.what == "beaumont-bandwidth"
                                          else [])].to_dict(orient="records")))
        return 0
    out = args.outputs.directory(args.out)
    with args.outputs.file(out / f"{args.what}.csv") as tmp:
        table.to_csv(tmp, index=False)
    with args.outputs.file(out / f"{args.what}.png") as tmp:
        plot(table, tmp)
    args.outputs.commit()
    shown = table.drop(columns=["workload", "machine", "planners", "version"])
    for column in ("sum_u", "ilp", "greedy", "l2l", "greedy_nodiscount", "first_last"):
        shown[column] = (1000 * shown[column]).round(1)
    shown["bandwidth"] = shown["bandwidth"] / 1e9
    shown["memory"] = shown["memory"].map(fmt_bytes)
    shown["weight_bytes"] = shown["weight_bytes"].map(fmt_bytes)
    print("iteration times in ms; bandwidth in GB/s each way")
    print(shown.to_string(index=False))
    if args.what == "beaumont-table1":
        failures = shape_checks(table)
        print()
        print("shape of Sec. 7.1 (bound = Σu, Greedy within 5%, L2L 10-50% above, "
              "Greedy* never better):", "holds" if not failures else "")
        for failure in failures:
            print(f"  does not hold: {failure}")
    print()
    print(f"wrote {out / (args.what + '.csv')} and {out / (args.what + '.png')}")
    return 0


def _reproduce_grid(args: argparse.Namespace) -> int:
    """One of TURNIP's LLaMA grids in simulation (prefill, Figs. 10-12; LoRA training, Fig.
    13): a CSV table and a plot."""
    from .. import turnip_grid, turnip_lora, turnip_prefill

    experiment, note = {"turnip-prefill": (turnip_prefill.PREFILL, turnip_prefill.NOTE),
                        "turnip-lora": (turnip_lora.LORA, turnip_lora.NOTE)}[args.what]
    points = turnip_grid.parse_points(experiment, args.only) if args.only else None
    if not args.json:
        check_out_dir(args.out)
    table = turnip_grid.run(experiment, points, progress=not args.json and progress_shown(args))
    out = _reproduction_written(args, table, lambda path: turnip_grid.plot(experiment, table,
                                                                           path))
    if out is None:
        return 0
    shown = table.drop(columns=["workload", "policy", "version"])
    for column in (experiment.time, "paper", "ratio"):
        shown[column] = shown[column].map(lambda t: "" if t != t else f"{t:.3g}")
    shown.loc[table[experiment.time].isna(), experiment.time] = "OOM"
    shown["host_peak"] = [fmt_bytes(int(b)) if notna else ""
                          for b, notna in zip(table["host_peak"], table["host_peak"].notna())]
    shown["paper_outcome"] = shown["paper_outcome"].fillna("")
    for column in turnip_grid.STAGES:
        shown[column] = shown[column].round(2)
    shown["status"] = shown["status"].str.slice(0, 60)
    if table["paper_outcome"].isna().all():
        shown = shown.drop(columns=["paper", "paper_outcome", "ratio"])
    print(f"{experiment.time}: {experiment.label}, simulated; build/plan/verify/simulate in "
          f"seconds of this machine")
    print(shown.to_string(index=False))
    print()
    print(note)
    print(f"wrote {out / (args.what + '.csv')} and {out / (args.what + '.png')}")
    return 0


def _reproduction_written(args: argparse.Namespace, table: pd.DataFrame,
                          plot: Callable[[Path], None]) -> Path | None:
    """``--json``: print the table's rows, and None; else write ``WHAT.csv`` and ``WHAT.png``
    (``plot(path)``) into ``--out``, and return that directory."""
    if args.json:
        print(json_text(table.astype(object).where(table.notna(), None).to_dict("records")))
        return None
    out = args.outputs.directory(args.out)
    with args.outputs.file(out / f"{args.what}.csv") as tmp:
        table.to_csv(tmp, index=False)
    with args.outputs.file(out / f"{args.what}.png") as tmp:
        plot(tmp)
    args.outputs.commit()
    return out


def _reproduce_determinism(args: argparse.Namespace) -> int:
    """TURNIP's determinism ablation, Figure 14, in simulation: the paper's four cells
    beside ours, a CSV table and a plot."""
    from .. import turnip_determinism as fig14
    from ..turnip_grid import parse_points

    if args.only and args.quick:
        raise SpecError("--only and --quick pick the points both: give one of them")
    points = {e: parse_points(x, args.only) for e, x in fig14.EXPERIMENTS.items()} \
        if args.only else fig14.QUICK if args.quick else None
    if not args.json:
        check_out_dir(args.out)
    table = fig14.run(points, args.noise or fig14.NOISES, args.seeds or fig14.SEEDS,
                      args.fixed or "planned", progress=not args.json and progress_shown(args))
    out = _reproduction_written(args, table, lambda path: fig14.plot(table, path))
    if out is None:
        return 0

    def percent(x: float) -> str:
        return "" if x != x else f"{100 * x:+.2f}%"

    shown = table.copy()
    shown["speedup (95% CI)"] = [
        "" if m != m else f"{percent(m)} ({100 * lo:+.2f} to {100 * hi:+.2f})"
        for m, lo, hi in zip(table["mean_speedup"], table["ci_low"], table["ci_high"])]
    shown["paper"] = table["paper"].map(lambda x: f"{100 * x:.2f}%")
    shown["difference"] = table["difference"].map(
        lambda x: "" if x != x else f"{100 * x:+.2f} pp")
    cells = shown["scope"] == "cell"
    print(f"Figure 14: dynamic over {FIXED_SHOWN[args.fixed or 'planned']}, buildmemgraph, "
          f"simulated; mean of {args.seeds or fig14.SEEDS} seeds, 95% bootstrap interval")
    print(shown.loc[cells, ["experiment", "machine", "noise", "points", "paper",
                            "speedup (95% CI)", "difference", "status"]].to_string(index=False))
    print()
    print("points:")
    print(shown.loc[~cells, ["experiment", "machine", "model", "seq", "batch", "noise",
                             "speedup (95% CI)", "status"]].to_string(index=False))
    print()
    print(fig14.NOTE)
    print(f"wrote {out / (args.what + '.csv')} and {out / (args.what + '.png')}")
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``reproduce`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``reproduce`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("reproduce", cmd_reproduce, "recreate a paper's table or figure from our cost model "
            "(beaumont-table1: Table 1; beaumont-bandwidth: Figure 4; turnip-prefill: "
            "TURNIP's LLaMA prefill grid, Figs. 10-12; turnip-lora: its LoRA training grid, "
            "Fig. 13; turnip-determinism: its determinism ablation, Fig. 14)")
    p.add_argument("what", choices=("beaumont-table1", "beaumont-bandwidth", "turnip-prefill",
                                    "turnip-lora", "turnip-determinism"))
    p.add_argument("--only", metavar="SETTINGS",
                   help="comma-separated settings NETWORK-DEPTHxBATCH, e.g. gpt2-38x16,bert-96x16 "
                        "(turnip-*: MODEL-SEQ[xBATCH][@MACHINE], e.g. 7b-1024,65b-1024x8@a100x8; "
                        "turnip-determinism runs each as inference and as training)")
    p.add_argument("--quick", action="store_true", default=None,
                   help="turnip-determinism: one point per cell (7b, 1K tokens, batch 1)")
    p.add_argument("--noise", type=noise_levels, metavar="X,Y,...",
                   help="turnip-determinism: noise levels (0,0.1)")
    p.add_argument("--seeds", type=positive_int,
                   help="turnip-determinism: noisy runs per point, order and noise level (10)")
    p.add_argument("--fixed", choices=tuple(FIXED_SHOWN),
                   help="turnip-determinism: the fixed order (planned, TURNIP's; or replay, "
                        "as for ablate determinism)")
    p.add_argument("--solver", choices=("auto", "cbc", "highs"), default="auto",
                   help="MILP solver (auto: HiGHS if installed, else CBC)")
    p.add_argument("--time-limit", type=nonnegative_float, default=60.0, metavar="S",
                   help="MILP time limit per setting in seconds (60); the best proven bound "
                        "is reported")
    p.add_argument("--weights", choices=("paper", "hyperparameters"), default="paper",
                   help="layer weight sizes: calibrated to the paper's transfer times (paper: "
                        "GPT-2 432 MB, BERT 160 MB) or from hidden 3072 in fp16 (226 MB)")
    p.add_argument("--json", action="store_true",
                   help="print the table as one JSON list of rows (times in seconds)")
    p.add_argument("--out", default="offloadlab-out", metavar="DIR",
                   help="output directory (./offloadlab-out)")
