"""The ``offloadlab`` command line: demo, plan, simulate, run, calibrate, validate, reproduce,
list.

Every user error (an :class:`~offloadlab.core.errors.OffloadlabError`, an unwritable output,
a bad argument) ends with ``offloadlab: error: ...`` on stderr and exit status 2.  Outputs are
written to a temporary file beside their destination and renamed into place, so a failed
command leaves nothing half-written.  Heavy modules (pandas, matplotlib, simpy) are imported
only by the commands that need them, so ``offloadlab --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Mapping

from ..core.dispatch import POLICIES
from ..core.errors import OffloadlabError, SpecError
from .plots import lane_key

if TYPE_CHECKING:
    import pandas as pd

DEMO_PLANNERS = ("levelwise", "buildmemgraph")

SPECS = """\
specifications:
  workloads, machines and planners are named as NAME or NAME:key=value,...  e.g.
  matmul-chain:layers=4   disco-example:gpu_memory=64MiB   buildmemgraph
  'offloadlab list' shows the names and their options."""


# -- helpers ------------------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    """``67108864`` -> ``"64 MiB"``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{int(n)} B"


@contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (same suffix); on success rename it to ``path``,
    on any error remove it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = _nonnegative_float(text)
    if value == 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def _check_writable(*paths: str | Path | None) -> None:
    """Fail before any work if an output's directory does not exist."""
    for path in paths:
        if path is not None and not Path(path).parent.is_dir():
            raise SpecError(f"cannot write {path}: directory {str(Path(path).parent)!r} "
                            f"does not exist")


def _write_plots_and_traces(runs: Mapping[str, "pd.DataFrame"], gantt_path: Path | None,
                            chrome_paths: dict[str, Path], title: str) -> list[Path]:
    """Write a Gantt chart of all ``runs`` (label -> Trace) and one Chrome trace per label."""
    written: list[Path] = []
    if gantt_path is not None:
        from .plots import gantt
        with atomic_output(gantt_path) as tmp:
            gantt(runs, tmp, title=title)
        written.append(gantt_path)
    if chrome_paths:
        from ..core.trace import write_chrome_trace
        for label, path in chrome_paths.items():
            with atomic_output(path) as tmp:
                write_chrome_trace(runs[label], tmp)
            written.append(path)
    return written


# -- commands -----------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    """The DISCO example: level-wise vs. buildMemGraph planning, simulated side by side."""
    from ..core.machine import machine_from_spec
    from ..core.workloads import build_workload
    from .compare import run_all, table

    graph = build_workload(f"matmul-chain:layers={args.layers}")
    machine = machine_from_spec("disco-example")
    print(f"DISCO example: matmul-chain, {args.layers} layers, {len(graph)} vertices, on "
          f"{machine.name} ({machine.gpus} GPUs x {fmt_bytes(machine.gpu_memory)}; "
          f"1 time unit = 1 s)")
    runs = run_all(graph, machine, [(p, "dynamic") for p in DEMO_PLANNERS], progress=print)
    shown = table(runs)
    for column in ("bytes_moved", "peak_gpu_memory"):
        shown[column] = shown[column].map(fmt_bytes)
    shown["makespan"] = shown["makespan"].map(lambda s: f"{s:.6g} s")
    print()
    print(shown.to_string(index=False))
    n = args.layers
    print(f"(DISCO Sec. 2 expects level-wise offloading to take 3n = {3 * n} time units and "
          f"overlapped offloading 2n + 1 = {2 * n + 1}, for n = {n} layers)")
    print()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"writing plots and traces to {out}/ ...")
    written = _write_plots_and_traces(
        {r.planner: r.result.trace for r in runs}, out / "gantt.png",
        {r.planner: out / f"{r.planner}.trace.json" for r in runs},
        title=f"DISCO example, {args.layers} layers on {machine.name} (dynamic dispatch)")
    for path in written:
        print(f"  wrote {path}")
    print("open the .trace.json files in https://ui.perfetto.dev or chrome://tracing")
    return 0


def _taskgraph(args: argparse.Namespace):
    """The TaskGraph of ``--workload`` or ``--taskgraph``."""
    from ..core.taskgraph import TaskGraph
    from ..core.workloads import build_workload
    return build_workload(args.workload) if args.workload else TaskGraph.from_json(args.taskgraph)


def _planned(args: argparse.Namespace):
    """The TaskGraph of ``--workload``/``--taskgraph``, planned with ``--planner`` on
    ``--machine`` and verified: (MemGraph, TaskGraph, Machine)."""
    from ..core.machine import machine_from_spec
    from ..core.verify import verify
    from ..planner import plan

    graph = _taskgraph(args)
    machine = machine_from_spec(args.machine)
    mg = plan(graph, machine, args.planner)
    verify(mg, graph, machine)
    return mg, graph, machine


def _memgraph_file(path: str, machine_spec: str | None):
    """A MemGraph file and the machine it runs on (``machine_spec``, else the one stored in
    the file), verified against it."""
    from ..core.machine import machine_from_spec
    from ..core.memgraph import MemGraph
    from ..core.verify import verify

    mg = MemGraph.from_json(path)
    machine = machine_from_spec(machine_spec) if machine_spec else _stored_machine(mg, path)
    verify(mg, machine=machine)
    return mg, machine


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan a workload or TaskGraph file on a machine, verify the MemGraph, write it as JSON."""
    mg, _, machine = _planned(args)
    with atomic_output(args.out) as tmp:
        mg.to_json(tmp)
    moved = mg.moved_bytes()
    print(f"wrote {args.out}: {len(mg)} vertices, {mg.count('offload')} offloads, "
          f"{mg.count('reload')} reloads, {mg.count('load')} loads, "
          f"{fmt_bytes(moved['offload'] + moved['reload'] + moved['load'])} moved to/from host "
          f"(planner {args.planner}, machine {machine.name})")
    return 0


def _stored_machine(mg, path: str):
    from ..core.machine import Machine
    data = mg.graph.get("machine")
    if not isinstance(data, dict):
        raise SpecError(f"{path} stores no machine; pass --machine")
    return Machine.from_dict(data)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Verify and simulate a MemGraph file; print a summary (or one JSON object), write plots
    and traces."""
    from ..simulator import simulate

    mg, machine = _memgraph_file(args.memgraph, args.machine)
    result = simulate(mg, machine, policy=args.policy, noise=args.noise, seed=args.seed,
                      streams=args.streams)
    label = f"{args.memgraph} ({args.policy})"
    written = _write_plots_and_traces(
        {label: result.trace}, Path(args.gantt) if args.gantt else None,
        {label: Path(args.chrome)} if args.chrome else {}, title=label)
    if args.memory:
        from .plots import memory_plot
        with atomic_output(args.memory) as tmp:
            memory_plot(result.memory, tmp, capacity=machine.gpu_memory, title=label)
        written.append(Path(args.memory))
    summary = {
        "memgraph": args.memgraph, "planner": mg.graph.get("planner"), "machine": machine.name,
        "policy": args.policy, "noise": args.noise, "seed": args.seed,
        "streams": args.streams or machine.streams, "vertices": len(mg),
        "makespan": float(result.makespan),
        "busy": {k: float(v) for k, v in result.busy.items()},
        "peak_memory": {k: int(v) for k, v in result.peak_memory.items()},
    }
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary, machine.gpu_memory)
        for path in written:
            print(f"wrote {path}")
    return 0


def _source(args: argparse.Namespace):
    """The MemGraph, TaskGraph (None for a MemGraph file) and Machine ``run`` executes."""
    if args.memgraph:
        mg, machine = _memgraph_file(args.memgraph, args.machine)
        return mg, None, machine
    if not args.machine:
        raise SpecError("--machine is required with --workload or --taskgraph")
    return _planned(args)


def cmd_run(args: argparse.Namespace) -> int:
    """Execute a MemGraph for real (planning a workload first), print a summary or one JSON
    object, optionally check the outputs against a NumPy reference and write plots/traces."""
    from ..executor import check_outputs, execute, reference_outputs, taskgraph_of

    if args.memgraph and args.planner:
        raise SpecError("--planner applies to --workload or --taskgraph, not to a MemGraph file")
    args.planner = args.planner or "buildmemgraph"
    _check_writable(args.gantt, args.chrome)
    mg, graph, machine = _source(args)
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=len(mg), unit="vertex", desc="running", leave=False)
    try:
        result = execute(mg, machine, backend=args.backend, policy=args.policy, seed=args.seed,
                         streams=args.streams, poison=args.poison,
                         rate_limit=not args.no_rate_limit, watchdog=args.watchdog,
                         progress=None if bar is None else
                         (lambda done: bar.update(done - bar.n)))
    finally:
        if bar is not None:
            bar.close()
    wrong = None
    if args.check:
        wrong = check_outputs(result.outputs, reference_outputs(graph or taskgraph_of(mg)),
                              args.backend)
    label = f"{mg.graph.get('planner')} ({args.backend}, {args.policy})"
    written = _write_plots_and_traces(
        {label: result.trace}, Path(args.gantt) if args.gantt else None,
        {label: Path(args.chrome)} if args.chrome else {}, title=label)
    summary = {
        "source": args.memgraph or args.workload or args.taskgraph,
        "planner": mg.graph.get("planner"), "machine": machine.name, "backend": args.backend,
        "policy": args.policy, "seed": args.seed, "streams": args.streams or machine.streams,
        "vertices": len(mg), "makespan": float(result.makespan),
        "correct": None if not args.check else wrong is None,
        "busy": {k: float(v) for k, v in result.busy.items()},
        "peak_memory": {k: int(v) for k, v in result.peak_memory.items()},
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['source']}: {len(mg)} vertices (planner {summary['planner']}) on "
              f"{machine.name}, {args.backend} backend, {args.policy} dispatch, seed {args.seed}")
        print(f"measured makespan: {result.makespan:.6g} s")
        busy = sorted(summary["busy"].items(), key=lambda kv: lane_key(kv[0]))
        span = result.makespan
        print("busy:", ", ".join(f"{r} {t:.4g} s" + (f" ({100 * t / span:.0f}%)" if span else "")
                                 for r, t in busy))
        if args.check:
            print("outputs:", "equal to the reference" if wrong is None else f"WRONG: {wrong}")
        for path in written:
            print(f"wrote {path}")
    if wrong is not None:
        print(f"offloadlab: check failed: {wrong}", file=sys.stderr)
        return 1
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure a backend's kernel rates, copy bandwidths, duplex factor and dispatch overhead
    through the executor and write them as a Machine JSON file."""
    from ..core.machine import machine_from_spec
    from ..executor.calibrate import calibrate

    base = machine_from_spec(args.machine)
    out = Path(args.out)
    table_path = Path(args.table) if args.table else out.with_suffix(".csv")
    _check_writable(out, table_path)
    say = (lambda what: print(f"measuring {what} ...", file=sys.stderr)) \
        if sys.stderr.isatty() else None
    result = calibrate(base, args.backend, quick=args.quick, progress=say)
    m = result.machine
    with atomic_output(out) as tmp:
        tmp.write_text(m.to_json())
    with atomic_output(table_path) as tmp:
        result.table.to_csv(tmp, index=False)
    print(f"{m.name}: {m.source}")
    print(f"  matmul {m.gpu_flops / 1e9:.4g} GFLOP/s, add {m.gpu_mem_bandwidth / 1e9:.4g} GB/s "
          f"touched, kernel latency + dispatch {m.kernel_latency * 1e6:.3g} us")
    print("  other ops (GB/s written/read): " + ", ".join(
        f"{op} {written / 1e9:.3g}/{read / 1e9:.3g}" for op, written, read in m.op_rates))
    print(f"  host->GPU {m.h2d_bandwidth / 1e9:.4g} GB/s, GPU->host {m.d2h_bandwidth / 1e9:.4g} "
          f"GB/s, latency {m.link_latency * 1e6:.3g} us, duplex factor {m.duplex:.3g}")
    if m.gpus > 1:
        print(f"  GPU->GPU {m.gpu_gpu_bandwidth / 1e9:.4g} GB/s")
    print(f"  CPU matmul {m.cpu_flops / 1e9:.4g} GFLOP/s")
    print(f"wrote {out} (use it as --machine {out}) and {table_path}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Simulate and execute the same MemGraphs; report the makespan's error and each
    component's, and draw both timelines."""
    from ..core.machine import machine_from_spec
    from .validate import validate

    _check_writable(args.plot, args.table)
    graph = _taskgraph(args)
    machine = machine_from_spec(args.machine)
    planners = args.planner or list(DEMO_PLANNERS)
    say = (lambda spec: print(f"{spec}: simulating and running {args.runs} time(s) ...",
                              file=sys.stderr)) if sys.stderr.isatty() and not args.json else None
    results = validate(graph, machine, planners, runs=args.runs, backend=args.backend,
                       policy=args.policy, rate_limit=not args.no_rate_limit, progress=say)
    written = []
    if args.plot:
        from .plots import gantt
        traces = {}
        for r in results:
            traces[f"{r.planner}: simulated, makespan {r.table['simulated'].iloc[0]:.4g} s"] = \
                r.simulated
            traces[f"{r.planner}: measured ({args.backend}), makespan "
                   f"{r.table['measured'].iloc[0]:.4g} s; simulated error {100 * r.error:+.1f}%"] = \
                r.measured
        with atomic_output(args.plot) as tmp:
            gantt(traces, tmp, title=f"{graph.name} on {machine.name}: simulated vs measured "
                                      f"({args.policy} dispatch)")
        written.append(args.plot)
    if args.table:
        import pandas as pd
        with atomic_output(args.table) as tmp:
            pd.concat([r.table for r in results]).to_csv(tmp, index=False)
        written.append(args.table)
    if args.json:
        print(json.dumps([{"workload": args.workload or args.taskgraph, "machine": machine.name,
                           "backend": args.backend, "policy": args.policy, "runs": args.runs,
                           **r.row()} for r in results]))
    else:
        for r in results:
            shown = r.table.drop(columns="planner").copy()
            shown["error"] = shown["error"].map(lambda e: f"{100 * e:+.1f}%")
            print(f"{r.planner}: simulated {r.table['simulated'].iloc[0]:.4g} s, measured "
                  f"{r.table['measured'].iloc[0]:.4g} s (median of "
                  f"{', '.join(f'{s:.4g}' for s in r.makespans)}), error {100 * r.error:+.1f}%; "
                  f"outputs {'correct' if r.correct else 'WRONG'}")
            print(shown.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
            print()
        for path in written:
            print(f"wrote {path}")
    return 0 if all(r.correct for r in results) else 1


def _print_summary(summary: dict, capacity: int) -> None:
    """The human-readable form of ``simulate``'s summary."""
    span = summary["makespan"]
    print(f"{summary['memgraph']}: {summary['vertices']} vertices (planner {summary['planner']}) "
          f"on {summary['machine']}, {summary['policy']} dispatch, noise {summary['noise']}, "
          f"seed {summary['seed']}")
    print(f"makespan: {span:.6g} s")
    busy = sorted(summary["busy"].items(), key=lambda kv: lane_key(kv[0]))
    print("busy:", ", ".join(f"{r} {t:.4g} s" + (f" ({100 * t / span:.0f}%)" if span else "")
                             for r, t in busy))
    peaks = sorted(summary["peak_memory"].items(), key=lambda kv: lane_key(kv[0]))
    print("peak memory:", ", ".join(f"{d} {fmt_bytes(b)}" for d, b in peaks),
          f"(GPU capacity {fmt_bytes(capacity)})")


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Recreate a figure or table of a paper from our cost model: a CSV table and a plot."""
    from .reproduce import COLUMNS, REPRODUCTIONS, parse_setting, shape_checks

    run, plot, default = REPRODUCTIONS[args.what]
    settings = [parse_setting(s) for s in args.only.split(",")] if args.only else list(default)
    table = run(settings, solver=args.solver, time_limit=args.time_limit, weights=args.weights,
                progress=not args.json and sys.stderr.isatty())
    if args.json:
        print(json.dumps(table[COLUMNS + (["bandwidth"] if args.what == "beaumont-bandwidth"
                                          else [])].to_dict(orient="records")))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_output(out / f"{args.what}.csv") as tmp:
        table.to_csv(tmp, index=False)
    with atomic_output(out / f"{args.what}.png") as tmp:
        plot(table, tmp)
    shown = table.copy()
    for column in ("sum_u", "ilp", "greedy", "l2l", "greedy_nodiscount"):
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


def _first_line(fn: Callable) -> str:
    return (fn.__doc__ or "").strip().split("\n", 1)[0].replace("``", "")


def _options(options: dict[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "(no options)"


def cmd_list(args: argparse.Namespace) -> int:
    """List workloads, machine presets and planners with their options."""
    what = args.what
    if what in ("all", "workloads"):
        from ..core.workloads import WORKLOADS, workload_options
        print("workloads (--workload NAME:key=value,...):")
        for name, fn in WORKLOADS.items():
            print(f"  {name:<14} {_first_line(fn)}\n  {'':<14} {_options(workload_options(name))}")
    if what in ("all", "machines"):
        from ..core.machine import PRESETS
        print("machine presets (--machine NAME:field=value,...):")
        for name, m in PRESETS.items():
            print(f"  {name:<14} {m.gpus} GPU(s) x {fmt_bytes(m.gpu_memory)}; {m.source}")
    if what in ("all", "planners"):
        from ..planner import PLANNERS, planner_options
        print("planners (--planner NAME:key=value,...):")
        for name, fn in sorted(PLANNERS.items()):
            print(f"  {name:<14} {_first_line(fn)}\n  {'':<14} {_options(planner_options(name))}")
    return 0


# -- parser -------------------------------------------------------------------------------
def _executor_options(p: argparse.ArgumentParser) -> None:
    """The options of the commands that execute MemGraphs."""
    p.add_argument("--backend", choices=("numpy", "cupy"), default="numpy",
                   help="numpy: threads on the CPU (any machine); cupy: an NVIDIA GPU (numpy)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    p.add_argument("--no-rate-limit", action="store_true",
                   help="numpy backend: copy as fast as memcpy instead of at the machine's "
                        "link bandwidths")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="offloadlab", epilog=SPECS, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Plan and simulate CPU-RAM offload of GPU computations.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, fn: Callable, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, epilog=SPECS,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=fn)
        return p

    p = add("demo", cmd_demo, "the DISCO example: level-wise vs. buildMemGraph planning, "
            "simulated; prints a table, writes a Gantt chart and Chrome traces")
    p.add_argument("--layers", type=_positive_int, default=8, help="matmul-chain layers (8)")
    p.add_argument("--out", default="offloadlab-out", metavar="DIR",
                   help="output directory (./offloadlab-out)")

    p = add("plan", cmd_plan, "plan a workload on a machine, verify the MemGraph, write its JSON")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="SPEC", help="e.g. matmul-chain:layers=4")
    src.add_argument("--taskgraph", metavar="FILE", help="a TaskGraph node-link JSON file")
    p.add_argument("--machine", required=True, metavar="SPEC", help="e.g. disco-example")
    p.add_argument("--planner", default="buildmemgraph", metavar="SPEC",
                   help="planner and its options (buildmemgraph)")
    p.add_argument("--out", required=True, metavar="FILE", help="MemGraph JSON to write")

    p = add("simulate", cmd_simulate, "verify and simulate a MemGraph JSON file")
    p.add_argument("memgraph", metavar="MEMGRAPH", help="MemGraph JSON written by 'plan'")
    p.add_argument("--machine", metavar="SPEC",
                   help="machine to simulate on (default: the one stored in the MemGraph)")
    p.add_argument("--policy", choices=POLICIES, default="dynamic",
                   help="dispatch policy (dynamic)")
    p.add_argument("--noise", type=_nonnegative_float, default=0.0,
                   help="relative duration noise (0)")
    p.add_argument("--seed", type=int, default=0, help="noise seed (0)")
    p.add_argument("--streams", type=_positive_int, metavar="K",
                   help="compute streams per GPU (default: the machine's)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart")
    p.add_argument("--memory", metavar="PNG", help="write a plot of GPU memory in use")
    p.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace")

    p = add("run", cmd_run, "execute a MemGraph for real (planning a workload or TaskGraph "
            "first) on the numpy or cupy backend and measure it")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("memgraph", metavar="MEMGRAPH", nargs="?", help="MemGraph JSON file")
    src.add_argument("--workload", metavar="SPEC", help="e.g. matmul-chain:layers=4")
    src.add_argument("--taskgraph", metavar="FILE", help="a TaskGraph node-link JSON file")
    p.add_argument("--machine", metavar="SPEC",
                   help="preset or Machine JSON file (default for a MEMGRAPH: its stored one)")
    p.add_argument("--planner", metavar="SPEC", help="planner for --workload/--taskgraph "
                   "(buildmemgraph)")
    _executor_options(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the random policy (0)")
    p.add_argument("--streams", type=_positive_int, metavar="K",
                   help="compute streams per GPU (default: the machine's)")
    p.add_argument("--check", action="store_true",
                   help="compare the outputs with a NumPy evaluation of the TaskGraph; exit 1 "
                        "naming the first wrong output")
    p.add_argument("--poison", action="store_true",
                   help="fill each location with NaN bytes before it is written (finds races)")
    p.add_argument("--watchdog", type=_positive_float, default=60.0, metavar="S",
                   help="stop if no vertex completes for S seconds (60)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart")
    p.add_argument("--chrome", metavar="JSON", help="write a Chrome/Perfetto trace")

    p = add("calibrate", cmd_calibrate, "measure a backend's kernel rates, copy bandwidths, "
            "duplex factor and dispatch overhead through the executor; write a Machine JSON")
    p.add_argument("--backend", choices=("numpy", "cupy"), default="numpy",
                   help="backend to measure (numpy)")
    p.add_argument("--machine", default="p100x4", metavar="SPEC",
                   help="the machine to start from: its fields that are not measured are kept, "
                        "and the numpy backend paces copies to its links (p100x4)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    p.add_argument("--out", required=True, metavar="JSON", help="Machine JSON file to write")
    p.add_argument("--table", metavar="CSV",
                   help="every measurement as CSV (default: beside --out, .csv)")

    p = add("validate", cmd_validate, "simulate and execute the same MemGraphs: the makespan's "
            "error and each component's (busy and idle time per resource, mean duration per "
            "vertex kind), and both timelines")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="SPEC", help="e.g. matmul-chain:layers=4")
    src.add_argument("--taskgraph", metavar="FILE", help="a TaskGraph node-link JSON file")
    p.add_argument("--machine", required=True, metavar="SPEC",
                   help="a calibrated Machine JSON file (offloadlab calibrate) or a preset")
    p.add_argument("--planner", action="append", metavar="SPEC",
                   help="planner (repeatable; default: levelwise and buildmemgraph)")
    p.add_argument("--runs", type=_positive_int, default=3,
                   help="executor runs per planner; the median is compared (3)")
    _executor_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON list, a row per planner")
    p.add_argument("--plot", metavar="PNG", help="draw simulated over measured timelines")
    p.add_argument("--table", metavar="CSV", help="write the component table")

    p = add("reproduce", cmd_reproduce, "recreate a paper's table or figure from our cost model "
            "(beaumont-table1: Table 1; beaumont-bandwidth: Figure 4)")
    p.add_argument("what", choices=("beaumont-table1", "beaumont-bandwidth"))
    p.add_argument("--only", metavar="SETTINGS",
                   help="comma-separated settings NETWORK-DEPTHxBATCH, e.g. gpt2-38x16,bert-96x16")
    p.add_argument("--solver", choices=("auto", "cbc", "highs"), default="auto",
                   help="MILP solver (auto: HiGHS if installed, else CBC)")
    p.add_argument("--time-limit", type=_nonnegative_float, default=60.0, metavar="S",
                   help="MILP time limit per setting in seconds (60); the best proven bound "
                        "is reported")
    p.add_argument("--weights", choices=("paper", "hyperparameters"), default="paper",
                   help="layer weight sizes: calibrated to the paper's transfer times (paper: "
                        "GPT-2 432 MB, BERT 160 MB) or from hidden 3072 in fp16 (226 MB)")
    p.add_argument("--json", action="store_true",
                   help="print the table as one JSON list of rows (times in seconds)")
    p.add_argument("--out", default="offloadlab-out", metavar="DIR",
                   help="output directory (./offloadlab-out)")

    p = add("list", cmd_list, "list workloads, machine presets and planners")
    p.add_argument("what", nargs="?", default="all",
                   choices=("all", "workloads", "machines", "planners"))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0, or 2 for any user error)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("offloadlab: interrupted", file=sys.stderr)
        return 130
    except OffloadlabError as exc:
        print(f"offloadlab: error: {exc}", file=sys.stderr)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"offloadlab: error: {where}{exc.strerror or exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
