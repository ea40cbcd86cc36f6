"""The executor's goals on the numpy backend: dispatch overhead and copy rates.

    python bench/bench_executor.py              # N up to 100k, copies up to 256 MiB (~10 min)
    python bench/bench_executor.py --quick      # N up to 10k, copies up to 16 MiB (~30 s)
    python bench/bench_executor.py --only dispatch --profile
    python bench/bench_executor.py --only dispatch --one-core   # loop and lanes on one core

Dispatch: graphs of N ``add`` kernels on 1-element float32 tensors, a ``chain`` (each reads the
one before) or ``wide`` (all read one input), on 1 GPU, or on 2 GPUs with GPU->GPU transfers
(the chain alternates kernel and transfer, crossing over at each transfer; wide is a quarter
kernels on each GPU and a quarter transfers each way), under every dispatch policy with 1 and 5
streams, copies unpaced.  Memory is ample, so the plan is what ``buildmemgraph`` gives (every
tensor at a fresh offset, no memory edges); the MemGraphs are built directly because the
planner's allocator scans grow with the number of freed segments (a 20k chain takes 9 s to
plan), and are checked against ``buildmemgraph`` at N = 1000.  Reports the measured makespan
per vertex (goal: 20 µs at 100k), the wall time of ``execute`` per vertex, which adds set-up
(views, scratch sizing) and building the trace, and the share of the machine's CPU time that
was idle during the run; best of ``--repeat``.

Where the time goes (``chain`` and ``wide``, 1 GPU, ``dynamic``, 1 stream, largest N), on all
cores and with the process held to one core: set-up, run, and the CPU time of the loop thread
and of the lanes, per vertex; the run with every job run inline on the loop thread (no thread
hand-offs: the Python work alone); and the round trip of an item between two threads through
two ``queue.SimpleQueue`` (the hand-off floor).  ``--profile`` adds the loop thread's cProfile.

Copies: graphs of 3 equal copies on one engine (``load``: host input -> GPU; ``offload``:
GPU input -> host), rate = bytes / (end - start) of each trace row, median of the 3 (in (b),
the best such median of ``--repeat`` runs, against the best of as many ``np.copyto`` runs).
(a) paced to 1, 4 and 12 GB/s each way, as a share of the limit (goal: 90%); (b) unpaced, as a
share of ``np.copyto`` of the same bytes (goal: 80%): between the very buffers the run copies,
right after the executor's set-up made and wrote them (the goal's measure: the same bytes in
the same state); and for context between a fresh pair of buffers of the same size written
just before, each copied once as the executor's are, and one pair over and over (cache-hot).
(c) loads and offloads at once on a100x8 (duplex 0.48): each direction's share of its limit
(expected: the duplex factor).

The machine is shared: its load average is printed first; other processes change every number.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import queue
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar
from unittest import mock

import numpy as np
import pandas as pd
from tqdm import tqdm

from offloadlab.core.machine import Machine, machine_from_spec
from offloadlab.core.memgraph import Loc, MemGraph, MemVertex
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.executor import execute, make_backend, taskgraph_of
from offloadlab.executor import loop as loop_module
from offloadlab.executor.device import Lane
from offloadlab.planner import plan

T = TypeVar("T")
MiB = 2**20
POLICIES = ("dynamic", "fixed", "random")
STREAMS = (1, 5)
SHAPES = ("chain", "wide")
COPIES = 3
DISPATCH_GOAL_US, PACED_GOAL, UNPACED_GOAL = 20.0, 0.90, 0.80


# -- graphs ---------------------------------------------------------------------------------
def noop_graph(n: int, shape: str, gpus: int) -> TaskGraph:
    """N executed vertices on 1-element float32 tensors (see the module docstring)."""
    g = TaskGraph(name=f"{shape}-{n}-{gpus}gpu")
    one = {"bytes": 4, "shape": (1,)}
    for k in range(gpus):
        g.add_input(f"x{k}", home=f"gpu{k}", **one)
    prev, gpu = "x0", 0
    for i in range(n):
        if gpus == 1:
            g.add_compute(f"v{i}", "add", [prev if shape == "chain" else "x0"], "gpu0",
                          flops=1, **one)
        elif shape == "chain" and i % 2:
            gpu = 1 - gpu
            g.add_transfer(f"v{i}", prev, f"gpu{gpu}")
        elif shape == "chain":
            g.add_compute(f"v{i}", "add", [prev], f"gpu{gpu}", flops=1, **one)
        elif i % 4 < 2:
            g.add_compute(f"v{i}", "add", [f"x{i % 4}"], f"gpu{i % 4}", flops=1, **one)
        else:
            g.add_transfer(f"v{i}", f"x{i % 2}", f"gpu{1 - i % 2}")
        prev = f"v{i}"
    return g


def ample_memgraph(graph: TaskGraph) -> MemGraph:
    """The plan ``buildmemgraph`` makes with ample memory for a graph with no host tensors:
    every tensor at the next fresh offset of its GPU, data edges only."""
    mg = MemGraph({"planner": "ample"})
    offset: dict[str, int] = defaultdict(int)
    for order, t in enumerate(graph):
        gpu = t.out_device
        mg.add_vertex(MemVertex(t.id, t.kind, t.device, t.bytes, loc=Loc(gpu, offset[gpu], t.bytes),
                                task=t.id, op=t.op, flops=t.flops, inputs=t.inputs, order=order,
                                shape=t.shape, dtype=t.dtype))
        mg.add_edges(t.inputs, t.id)
        offset[gpu] += t.bytes
    return mg


def check_against_planner(n: int = 1000) -> None:
    """Assert that :func:`ample_memgraph` is what ``buildmemgraph`` plans, for every graph."""
    def key(mg: MemGraph):
        return ([(v.id, v.kind, v.device, v.loc, v.inputs, v.order, v.shape) for v in mg],
                sorted(mg.edges()))
    for gpus in (1, 2):
        for shape in SHAPES:
            graph = noop_graph(n, shape, gpus)
            planned = plan(graph, machine_from_spec(f"p100x4:gpus={gpus}"), "buildmemgraph")
            assert key(planned) == key(ample_memgraph(graph)), (shape, gpus)


def copy_memgraph(nbytes: int, loads: int, offloads: int) -> MemGraph:
    """``loads`` host inputs each loaded into gpu0 and ``offloads`` gpu0 inputs each
    offloaded, every tensor at its own offset; nothing else."""
    mg = MemGraph({"planner": "by hand"})
    shape, offset = (nbytes // 4,), 0

    def add(id: str, kind: str, device: str, gpu: bool, **kw) -> None:
        nonlocal offset
        loc = Loc("gpu0", offset, nbytes) if gpu else None
        offset += nbytes if gpu else 0
        v = mg.add_vertex(MemVertex(id, kind, device, nbytes, loc=loc, order=len(mg),
                                    shape=shape, **kw))
        mg.add_edges(v.inputs, id)
    for j in range(loads):
        add(f"x{j}", "input", "host", False, task=f"x{j}")
        add(f"load:x{j}", "load", "gpu0", True, of=f"x{j}", inputs=(f"x{j}",))
    for j in range(offloads):
        add(f"y{j}", "input", "gpu0", True, task=f"y{j}")
        add(f"offload:y{j}", "offload", "gpu0", False, of=f"y{j}", inputs=(f"y{j}",))
    return mg


# -- dispatch -------------------------------------------------------------------------------
def cpu_jiffies() -> list[int]:
    """The machine's CPU time by state (user, nice, system, idle, ...), in jiffies."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def clocked(fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of one call."""
    begin = time.perf_counter()
    result = fn()
    return time.perf_counter() - begin, result


def measured(repeat: int, run: Callable[[], T], key: Callable[[T], float]) -> tuple[T, float]:
    """The run with the least ``key`` of ``repeat`` runs, and the share of the machine's CPU
    time that was idle while it ran (high: the threads waited on wake-ups, not on work)."""
    best = None
    for _ in range(repeat):
        before = cpu_jiffies()
        result = run()
        spent = [b - a for a, b in zip(before, cpu_jiffies())]
        idle = spent[3] / max(sum(spent), 1)
        if best is None or key(result) < key(best[0]):
            best = (result, idle)
    assert best is not None
    return best


def dispatch_table(sizes: list[int], repeat: int) -> pd.DataFrame:
    configs = [(n, gpus, shape, policy, streams) for n in sizes for gpus in (1, 2)
               for shape in SHAPES for policy in POLICIES for streams in STREAMS]
    rows, graphs = [], {}
    for n, gpus, shape, policy, streams in tqdm(configs, desc="dispatch", unit="run"):
        if (n, gpus, shape) not in graphs:
            graphs.clear()
            graphs[n, gpus, shape] = ample_memgraph(noop_graph(n, shape, gpus))
        mg, machine = graphs[n, gpus, shape], machine_from_spec(f"p100x4:gpus={gpus}")
        (wall, result), idle = measured(repeat, lambda: clocked(lambda: execute(
            mg, machine, policy=policy, streams=streams, rate_limit=False)),
            key=lambda r: r[1].makespan)
        rows.append({"N": n, "gpus": gpus, "graph": shape, "policy": policy,
                     "streams": streams, "makespan µs/vertex": result.makespan / n * 1e6,
                     "execute µs/vertex": wall / n * 1e6, "idle %": 100 * idle})
    return pd.DataFrame(rows)


class InlineLane(Lane):
    """A lane that runs each job at once on the thread that submits it (the one taking the
    loop's turn), so that no job changes threads: the Python work alone."""

    def start(self) -> None:
        pass

    def is_alive(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def submit(self, job) -> None:
        vertex, stream, work, after = job
        start, end = self.backend.timed(stream, work)
        if after is not None:
            after()
        self.report((vertex, start, end, None))


@contextmanager
def on_cores(cores: set[int] | None):
    """Run this thread, and the threads it starts, on ``cores`` only (None: on all)."""
    before = os.sched_getaffinity(0)
    if cores:
        os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def timed_run(mg: MemGraph, machine: Machine, profile: cProfile.Profile | None = None) -> dict:
    """Set-up and run of the event loop (dynamic, 1 stream, unpaced), timed apart, with the
    CPU time of the loop thread and of all the others during the run."""
    outputs = set(taskgraph_of(mg).outputs())
    begin = time.perf_counter()
    loop = loop_module.EventLoop(mg, machine, make_backend("numpy", machine, False), "dynamic",
                                 0, 1, False, outputs, None, 60.0)
    setup = time.perf_counter() - begin
    wall0, thread0, process0 = time.perf_counter(), time.thread_time(), time.process_time()
    if profile is not None:
        profile.enable()
    loop.run()
    if profile is not None:
        profile.disable()
    run = time.perf_counter() - wall0
    loop_cpu = time.thread_time() - thread0
    return {"setup": setup, "run": run, "loop CPU": loop_cpu,
            "lanes CPU": time.process_time() - process0 - loop_cpu}


def ping_pong(rounds: int = 20_000) -> float:
    """Seconds per round trip of an item between two threads through two SimpleQueues."""
    there: queue.SimpleQueue = queue.SimpleQueue()
    back: queue.SimpleQueue = queue.SimpleQueue()

    def echo() -> None:
        while (item := there.get()) is not None:
            back.put(item)
    thread = threading.Thread(target=echo)
    thread.start()
    begin = time.perf_counter()
    for i in range(rounds):
        there.put(i)
        back.get(timeout=0.1)
    seconds = (time.perf_counter() - begin) / rounds
    there.put(None)
    thread.join()
    return seconds


def breakdown(n: int, repeat: int, profile: bool) -> pd.DataFrame:
    machine = machine_from_spec("p100x4:gpus=1")
    one = {min(os.sched_getaffinity(0))}
    rows = []
    for shape in tqdm(SHAPES, desc="breakdown", unit="graph"):
        mg = ample_memgraph(noop_graph(n, shape, 1))
        with mock.patch.object(loop_module, "Lane", InlineLane):
            inline = min(timed_run(mg, machine)["run"] for _ in range(repeat))
        for cores in (None, one):
            with on_cores(cores):
                run, idle = measured(repeat, lambda: timed_run(mg, machine),
                                     key=lambda r: r["run"])
                floor = min(ping_pong() for _ in range(repeat))
                held = len(os.sched_getaffinity(0))
            rows.append({"graph": shape, "cores": held,
                         **{k: v / n * 1e6 for k, v in run.items()}, "idle %": 100 * idle,
                         "inline run": inline / n * 1e6, "hand-off floor": floor * 1e6})
        if profile:
            prof = cProfile.Profile()
            timed_run(mg, machine, prof)
            print(f"\ncProfile of the loop thread, {shape}, N = {n}, on "
                  f"{len(os.sched_getaffinity(0))} core(s) (tottime; the lanes are not profiled):")
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return pd.DataFrame(rows)


# -- copies ---------------------------------------------------------------------------------
def copy_rates(mg: MemGraph, machine: Machine, rate_limit: bool) -> dict[str, list[float]]:
    """Bytes/s of each copy of one run, by kind (``load``, ``offload``)."""
    trace = execute(mg, machine, rate_limit=rate_limit).trace
    rates: dict[str, list[float]] = defaultdict(list)
    for row in trace.itertuples():
        rates[row.kind].append(row.bytes / (row.end - row.start))
    return rates


def setup_rates(mg: MemGraph, machine: Machine) -> dict[str, list[float]]:
    """Bytes/s of ``np.copyto`` between the very buffers a run of ``mg`` copies, right after
    the executor's set-up has made and written them (no run): the same bytes, in the same
    state (in or out of the caches) as the executor's copy engine finds them."""
    outputs = set(taskgraph_of(mg).outputs())
    backend = make_backend("numpy", machine, False)
    loop = loop_module.EventLoop(mg, machine, backend, "dynamic", 0, 1, False, outputs, None,
                                 60.0)
    rates: dict[str, list[float]] = defaultdict(list)
    try:
        for i, v in enumerate(loop.vertices):
            if v.kind in ("load", "offload"):
                src = loop.tensor[loop.inputs[i][0]].reshape(-1).view(np.uint8)
                dst = loop.tensor[i] if v.kind == "load" else loop._host_tensor(i)
                dst = dst.reshape(-1).view(np.uint8)
                begin = time.perf_counter()
                np.copyto(dst, src)
                rates[v.kind].append(v.bytes / (time.perf_counter() - begin))
    finally:
        backend.close()
    return rates


def copyto_rates(nbytes: int) -> tuple[float, float]:
    """Median bytes/s of ``np.copyto`` between preallocated buffers: (each of ``COPIES``
    pairs copied once, as the executor's copies are; one pair copied again and again, so that
    small buffers stay in the cache)."""
    src, dst = np.empty(COPIES * nbytes, np.uint8), np.empty(COPIES * nbytes, np.uint8)
    src.fill(1)
    dst.fill(0)                             # every page mapped, as the executor's buffers are
    once, again = [], []
    for j in range(COPIES):
        begin = time.perf_counter()
        np.copyto(dst[j * nbytes:(j + 1) * nbytes], src[j * nbytes:(j + 1) * nbytes])
        once.append(time.perf_counter() - begin)
    for _ in range(COPIES):
        begin = time.perf_counter()
        np.copyto(dst[:nbytes], src[:nbytes])
        again.append(time.perf_counter() - begin)
    return nbytes / statistics.median(once), nbytes / statistics.median(again)


def paced_table(sizes: list[int], limits: list[float]) -> pd.DataFrame:
    rows = []
    for limit in tqdm(limits, desc="paced copies", unit="limit"):
        machine = machine_from_spec(f"p100x4:gpus=1,h2d_bandwidth={limit},d2h_bandwidth={limit}")
        for mib in sizes:
            for kind in ("load", "offload"):
                mg = copy_memgraph(mib * MiB, COPIES * (kind == "load"),
                                   COPIES * (kind == "offload"))
                rates = copy_rates(mg, machine, True)[kind]
                rows.append({"copy": kind, "limit GB/s": limit / 1e9, "MiB": mib,
                             "GB/s": statistics.median(rates) / 1e9,
                             "share": statistics.median(rates) / limit,
                             "worst share": min(rates) / limit})
    return pd.DataFrame(rows)


def unpaced_table(sizes: list[int], repeat: int) -> pd.DataFrame:
    machine = machine_from_spec("p100x4:gpus=1")
    rows = []
    for mib in tqdm(sizes, desc="unpaced copies", unit="size"):
        baselines = [copyto_rates(mib * MiB) for _ in range(repeat)]
        once, again = max(b[0] for b in baselines), max(b[1] for b in baselines)
        for kind in ("load", "offload"):
            mg = copy_memgraph(mib * MiB, COPIES * (kind == "load"), COPIES * (kind == "offload"))
            rate = max(statistics.median(copy_rates(mg, machine, False)[kind])
                       for _ in range(repeat))
            same = max(statistics.median(setup_rates(mg, machine)[kind]) for _ in range(repeat))
            rows.append({"copy": kind, "MiB": mib, "GB/s": rate / 1e9,
                         "np.copyto, same buffers GB/s": same / 1e9, "share": rate / same,
                         "np.copyto, fresh pair GB/s": once / 1e9, "share of fresh": rate / once,
                         "np.copyto, cached GB/s": again / 1e9, "share of cached": rate / again})
    return pd.DataFrame(rows)


def duplex_table(sizes: list[int], limits: list[float]) -> pd.DataFrame:
    rows = []
    for limit in tqdm(limits, desc="duplex copies", unit="limit"):
        machine = machine_from_spec(f"a100x8:gpus=1,h2d_bandwidth={limit},d2h_bandwidth={limit}")
        for mib in sizes:
            rates = copy_rates(copy_memgraph(mib * MiB, COPIES, COPIES), machine, True)
            for kind in ("load", "offload"):
                rows.append({"copy": kind, "limit GB/s": limit / 1e9, "MiB": mib,
                             "duplex": machine.duplex,
                             "GB/s": statistics.median(rates[kind]) / 1e9,
                             "share": statistics.median(rates[kind]) / limit})
    return pd.DataFrame(rows)


# -- report ---------------------------------------------------------------------------------
def show(title: str, table: pd.DataFrame, verdict: str = "") -> None:
    print(f"\n{title}")
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}" if abs(x) < 1
                          else f"{x:.1f}"))
    if verdict:
        print(verdict)


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def meets_from(rows: pd.DataFrame) -> str:
    """The sizes from which on both directions meet the paced goal."""
    failing = rows[rows["share"] < PACED_GOAL]["MiB"]
    if failing.empty:
        return "every size"
    larger = rows[rows["MiB"] > failing.max()]["MiB"]
    return f"from {larger.min()} MiB" if len(larger) else "no size"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N up to 10k, copies up to 16 MiB")
    p.add_argument("--only", choices=("dispatch", "copies"), help="run one half")
    p.add_argument("--repeat", type=int, default=None, help="runs per measurement, best kept "
                   "(default 2, --quick 1)")
    p.add_argument("--profile", action="store_true", help="print the loop thread's cProfile")
    p.add_argument("--one-core", action="store_true",
                   help="hold the process (the loop and every lane) to one core")
    args = p.parse_args()
    with on_cores({min(os.sched_getaffinity(0))} if args.one_core else None):
        report(args)


def report(args: argparse.Namespace) -> None:
    repeat = args.repeat or (1 if args.quick else 2)
    sizes = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    copy_sizes = [1, 4, 16] if args.quick else [1, 4, 16, 64, 256]
    limits = [1e9, 4e9, 12e9]

    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} cores "
          f"(running on {len(os.sched_getaffinity(0))}), load average "
          f"{os.getloadavg()[0]:.2f} (1 min), switch interval "
          f"{sys.getswitchinterval() * 1e3:g} ms, best of {repeat}")
    if args.only != "copies":
        check_against_planner()
        table = dispatch_table(sizes, repeat)
        largest = table[table["N"] == sizes[-1]]["makespan µs/vertex"]
        show("Dispatch overhead (numpy backend, unpaced; per executed vertex)", table,
             f"goal <= {DISPATCH_GOAL_US:g} µs/vertex at N = {sizes[-1]}: median "
             f"{largest.median():.1f} µs, worst {largest.max():.1f} µs; met in "
             f"{(largest <= DISPATCH_GOAL_US).sum()} of {len(largest)} configurations")
        show(f"Where the time goes, N = {sizes[-1]}, 1 GPU, dynamic, 1 stream (µs per vertex; "
             f"hand-off floor: µs per round trip)", breakdown(sizes[-1], repeat, args.profile))
    if args.only != "dispatch":
        table = paced_table(copy_sizes, limits)
        show("(a) Paced copies: achieved rate as a share of the limit", table,
             f"goal >= {PACED_GOAL:.0%}: worst median share {table['share'].min():.1%}, "
             f"{met(table['share'].min() >= PACED_GOAL)}; " + "; ".join(
                 f"{limit / 1e9:g} GB/s: {meets_from(table[table['limit GB/s'] == limit / 1e9])}"
                 for limit in limits))
        table = unpaced_table(copy_sizes, repeat)
        show("(b) Unpaced copies: achieved rate as a share of np.copyto", table,
             f"goal >= {UNPACED_GOAL:.0%} of np.copyto of the same buffers: worst "
             f"{table['share'].min():.1%}, {met(table['share'].min() >= UNPACED_GOAL)}; of a "
             f"fresh pair: worst {table['share of fresh'].min():.1%}, "
             f"{met(table['share of fresh'].min() >= UNPACED_GOAL)}; of cache-hot np.copyto: worst "
             f"{table['share of cached'].min():.1%}, "
             f"{met(table['share of cached'].min() >= UNPACED_GOAL)}")
        table = duplex_table([16] if args.quick else [16, 64], [1e9, 4e9])
        show("(c) Loads and offloads at once (a100x8, duplex 0.48)", table,
             f"expected share 0.48: measured {table['share'].min():.3f} .. "
             f"{table['share'].max():.3f}")


if __name__ == "__main__":
    main()
