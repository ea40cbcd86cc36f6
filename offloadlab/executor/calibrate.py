"""Calibration: measure a backend's rates through the executor itself and write them as a
Machine, so that the simulator predicts what the executor measures (docs/design.md, Executor).

Every measurement runs a small MemGraph built here, with one location per tensor (nothing is
overwritten, so there are no memory edges), and reads the durations off the measured trace:

- kernels by op and size on one GPU with one stream: ``matmul`` gives ``gpu_flops``, every other
  op the bytes per second it writes and reads (``op_rates``, from the two largest sizes), a
  one-element ``add`` the kernel time that with the dispatch gap of a chain of them gives
  ``kernel_latency``;
- a float16 ``matmul`` gives ``gpu_half_flops``, at the largest size whose float32 matmul took
  under :data:`HALF_PROBE_SECONDS` (NumPy multiplies float16 without BLAS, some hundred times
  slower than float32; a GPU's tensor cores, many times faster);
- a matmul on the CPU gives ``cpu_flops``;
- loads (host->GPU) and offloads (GPU->host) of several sizes, each direction alone, give the
  bandwidth and latency by a least-squares line through ``seconds = latency + bytes / rate``;
  both directions at once give the ``duplex`` factor; GPU->GPU transfers (two GPUs or more)
  give ``gpu_gpu_bandwidth`` and its latency.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ..core.machine import Machine, MiB
from ..core.memgraph import Loc, MemGraph, MemVertex
from ..core.ops import DTYPES
from . import execute

DUPLEX_REPEATS = 4
HALF_PROBE_SECONDS = 2e-3


@dataclass
class Calibration:
    """The calibrated machine and the table of what was measured (one row per measurement:
    ``what, op, size, bytes, flops, seconds``)."""

    machine: Machine
    table: pd.DataFrame


class _Builder:
    """A MemGraph of independent (or chained) vertices, each tensor at its own location."""

    def __init__(self) -> None:
        self.mg = MemGraph({"planner": "calibrate"})
        self.top: dict[str, int] = {}

    def add(self, id: str, kind: str, device: str, shape: tuple[int, ...], inputs=(),
            op: str | None = None, flops: float = 0.0, at: str | None = None,
            dtype: str = "float32") -> str:
        nbytes = max(DTYPES[dtype] * math.prod(shape), 4)
        loc = None
        if at is not None:
            offset = self.top.get(at, 0)
            self.top[at] = offset + -(-nbytes // 256) * 256
            loc = Loc(at, offset, nbytes)
        self.mg.add_vertex(MemVertex(id, kind, device, nbytes, loc=loc, task=id if kind in (
            "input", "compute", "transfer") else None, of=inputs[0] if kind in (
            "load", "offload") else None, op=op, flops=flops, inputs=tuple(inputs),
            order=len(self.mg), shape=shape, dtype=dtype))
        self.mg.add_edges(inputs, id)
        return id

    def capacity(self) -> int:
        return max(self.top.values(), default=0)


def _kernels(sizes: Iterable[int], reps: int) -> tuple[MemGraph, dict[str, tuple[str, int]]]:
    """``reps`` independent kernels of each op and size on gpu0: n x n tensors, and for the
    ops that take inputs of any length, inputs of other lengths than the output's (one, four
    times as long, three of a quarter), so that the bytes written and read can be told apart.
    A kernel's inputs are distinct tensors (one read twice would come from the cache)."""
    b = _Builder()
    label: dict[str, tuple[str, int]] = {}
    for n in sizes:
        e = n * n
        x, y = (b.add(f"{name}{n}", "input", "gpu0", (n, n), at="gpu0") for name in "xy")

        def flat(k: float, count: int = 1) -> tuple[str, ...]:
            return tuple(b.add(f"f{k}x{n}#{i}", "input", "gpu0", (int(k * e),), at="gpu0")
                         for i in range(count))
        two, four, quarters = flat(1, 2), flat(4), flat(0.25, 3)
        variants: dict[str, list[tuple[str, ...]]] = {
            "matmul": [(x, y)], "adam_update": [(x, y)],
            **{op: [(x,)] for op in ("softmax", "relu", "layernorm")},
            **{op: [two, two[:1], four, quarters] for op in ("add", "mix")}}
        for op, inputs in variants.items():
            shape = (n, n) if op not in ("add", "mix") else (e,)
            flops = 2.0 * n ** 3 if op == "matmul" else float(e)
            for j, args in enumerate(inputs):
                for r in range(reps):
                    label[b.add(f"{op}{n}.{j}#{r}", "compute", "gpu0", shape, args, op, flops,
                                at="gpu0")] = (op, n)
    return b.mg, label


def _chain(length: int) -> MemGraph:
    """A chain of one-element adds: kernel time plus the loop's dispatch gap."""
    b = _Builder()
    prev = b.add("c0", "input", "gpu0", (1,), at="gpu0")
    for k in range(1, length + 1):
        prev = b.add(f"c{k}", "compute", "gpu0", (1,), (prev,), "add", 1.0, at="gpu0")
    return b.mg


def _half_matmul(n: int, reps: int) -> MemGraph:
    """``reps`` independent float16 matmuls of n x n tensors on gpu0."""
    b = _Builder()
    x, y = (b.add(name, "input", "gpu0", (n, n), at="gpu0", dtype="float16") for name in "xy")
    for r in range(reps):
        b.add(f"mm#{r}", "compute", "gpu0", (n, n), (x, y), "matmul", 2.0 * n ** 3, at="gpu0",
              dtype="float16")
    return b.mg


def _cpu_matmul(n: int, reps: int) -> MemGraph:
    b = _Builder()
    x = b.add("x", "input", "host", (n, n))
    for r in range(reps):
        b.add(f"mm#{r}", "compute", "cpu", (n, n), (x, x), "matmul", 2.0 * n ** 3)
    return b.mg


def _copies(sizes: Iterable[int], reps: int, h2d: bool, d2h: bool, gpus: int = 1) -> MemGraph:
    """Loads and/or offloads (and with ``gpus`` > 1, gpu0->gpu1 transfers) of each size."""
    b = _Builder()
    for nbytes in sizes:
        shape = (nbytes // 4,)
        for r in range(reps):
            if h2d:
                w = b.add(f"w{nbytes}#{r}", "input", "host", shape)
                b.add(f"load{nbytes}#{r}", "load", "gpu0", shape, (w,), at="gpu0")
            if d2h or gpus > 1:
                a = b.add(f"a{nbytes}#{r}", "input", "gpu0", shape, at="gpu0")
            if d2h:
                b.add(f"offload{nbytes}#{r}", "offload", "gpu0", shape, (a,))
            if gpus > 1:
                b.add(f"send{nbytes}#{r}", "transfer", "gpu0->gpu1", shape, (a,), at="gpu1")
    return b.mg


def _line(rows: pd.DataFrame) -> tuple[float, float]:
    """Least-squares ``seconds = latency + bytes / rate``: (rate, latency >= 0).  Where the
    line does not rise (copies too fast to time apart from the noise of a loaded machine, as
    unpaced GPU->GPU memcpys can be), the mean rate, with no latency."""
    slope, intercept = np.polyfit(rows["bytes"].astype(float), rows["seconds"], 1)
    if slope > 0:
        return float(1.0 / slope), max(float(intercept), 0.0)
    return float(rows["bytes"].sum() / rows["seconds"].sum()), 0.0


def calibrate(base: Machine, backend: str = "numpy", quick: bool = False,
              progress: Callable[[str], None] | None = None) -> Calibration:
    """Measure ``backend`` and return ``base`` with its measured fields replaced.

    With the numpy backend copies are paced to ``base``'s link bandwidths (the emulated
    PCIe); kernels run at the CPU's speed.  ``quick`` measures fewer sizes and repeats.  The
    host buses (``host_bus_bandwidth``, ``gpus_per_bus``) are ``base``'s, not measured: the
    copies measured run one at a time per direction, each on gpu0's link and bus.
    """
    say = progress or (lambda _: None)
    reps = 3 if quick else 5
    sizes = (64, 256, 512) if quick else (128, 512, 1024, 2048)
    copy_sizes = [s * MiB for s in ((1, 4, 16) if quick else (1, 4, 16, 64))]
    probe = replace(base, gpus=max(base.gpus, 1), gpu_memory=2**62, streams=1)
    rows: list[dict] = []

    def run(mg: MemGraph, what: str, machine: Machine = probe):
        say(what)
        return execute(mg, machine, backend=backend, policy="fixed").trace.set_index("vertex")

    mg, label = _kernels(sizes, reps)
    trace = run(mg, "kernels by op and size")
    for vertex, (op, n) in label.items():
        v = mg[vertex]
        read = sum(mg[u].bytes for u in v.inputs)
        rows.append(dict(what="kernel", op=op, size=n, bytes=v.bytes + read, read=read,
                         flops=v.flops,
                         seconds=trace.at[vertex, "end"] - trace.at[vertex, "start"]))
    chain = run(_chain(200 if quick else 1000), "dispatch gap of a chain of tiny kernels")
    chain = chain.sort_values("start")
    kernel_time = float((chain["end"] - chain["start"]).median())
    gap = float((chain["start"].iloc[1:].to_numpy() - chain["end"].iloc[:-1].to_numpy()).mean())
    rows.append(dict(what="tiny kernel", op="add", size=1, bytes=12, flops=1.0,
                     seconds=kernel_time))
    rows.append(dict(what="dispatch gap", op="add", size=1, bytes=0, flops=0.0, seconds=gap))
    n = max([r["size"] for r in rows if r["what"] == "kernel" and r["op"] == "matmul"
             and r["seconds"] < HALF_PROBE_SECONDS], default=sizes[0])
    half = run(_half_matmul(n, reps), "float16 matmul")
    for vertex in half.index:
        rows.append(dict(what="half kernel", op="matmul", size=n, bytes=3 * 2 * n * n,
                         flops=2.0 * n ** 3,
                         seconds=half.at[vertex, "end"] - half.at[vertex, "start"]))
    n = sizes[-1]
    cpu = run(_cpu_matmul(n, reps), "matmul on the CPU")
    for vertex in cpu.index:
        rows.append(dict(what="cpu kernel", op="matmul", size=n, bytes=3 * 4 * n * n,
                         flops=2.0 * n ** 3,
                         seconds=cpu.at[vertex, "end"] - cpu.at[vertex, "start"]))

    def copies(trace: pd.DataFrame, what: str) -> None:
        for _, row in trace.iterrows():
            rows.append(dict(what=what, op=row["kind"], size=int(row["bytes"]),
                             bytes=int(row["bytes"]), flops=0.0, seconds=row["end"] - row["start"]))

    copies(run(_copies(copy_sizes, reps, True, False), "host->GPU copies"), "h2d alone")
    copies(run(_copies(copy_sizes, reps, False, True), "GPU->host copies"), "d2h alone")
    both = run(_copies([copy_sizes[-1]], DUPLEX_REPEATS, True, True), "both directions at once")
    copies(both, "both at once")
    if base.gpus > 1:
        copies(run(_copies(copy_sizes, reps, False, False, gpus=2), "GPU->GPU copies"), "gpu->gpu")
    table = pd.DataFrame(rows)
    table["read"] = table["read"].fillna(0).astype("int64")   # bytes read: kernels only
    return Calibration(_fit(base, table, backend), table)


def _rates(rows: pd.DataFrame, tiny: float) -> tuple[float, float]:
    """Bytes/s written and read: least squares of ``seconds - tiny = written_bytes / w +
    read_bytes / r``; one rate for both where the kernels cannot tell them apart (every input
    the output's size) or the fit is not positive."""
    written = (rows["bytes"] - rows["read"]).to_numpy(float)
    read = rows["read"].to_numpy(float)
    seconds = np.maximum(rows["seconds"].to_numpy(float) - tiny, 1e-9)
    design = np.column_stack([written, read])
    if np.linalg.matrix_rank(design / design.max()) == 2:
        inverse = np.linalg.lstsq(design, seconds, rcond=None)[0]
        if (inverse > 0).all():
            return float(1 / inverse[0]), float(1 / inverse[1])
    rate = float((written + read).sum() / seconds.sum())
    return rate, rate


def _fit(base: Machine, table: pd.DataFrame, backend: str) -> Machine:
    """The machine the measurements describe."""
    kernels = table[table["what"] == "kernel"]
    large = kernels[kernels["size"] >= sorted(kernels["size"].unique())[-2:][0]]
    matmul = large[large["size"] == large["size"].max()]
    matmul = matmul[matmul["op"] == "matmul"]
    tiny = float(table.loc[table["what"] == "tiny kernel", "seconds"].iloc[0])
    op_rates = tuple(sorted((op, *_rates(rows, tiny)) for op, rows in large.groupby("op")
                            if op != "matmul"))
    gap = float(table.loc[table["what"] == "dispatch gap", "seconds"].iloc[0])
    cpu = table[table["what"] == "cpu kernel"]
    half = table[table["what"] == "half kernel"]
    h2d, h2d_latency = _line(table[table["what"] == "h2d alone"])
    d2h, d2h_latency = _line(table[table["what"] == "d2h alone"])
    both = table[table["what"] == "both at once"]
    alone = {"load": h2d, "offload": d2h}
    shares = [float(rows["bytes"].sum() / rows["seconds"].sum()) / alone[kind]
              for kind, rows in both.groupby("op")]
    fields: dict = dict(
        name=f"{base.name}-calibrated-{backend}",
        source=f"offloadlab calibrate, {backend} backend on {socket.gethostname()}, "
               f"copies paced to {base.name}'s links" if backend == "numpy" else
               f"offloadlab calibrate, {backend} backend on {socket.gethostname()}",
        gpu_flops=float(matmul["flops"].sum() / matmul["seconds"].sum()),
        gpu_half_flops=float(half["flops"].sum() / half["seconds"].sum()),
        gpu_mem_bandwidth=float(large.loc[large["op"] == "add", "bytes"].sum()
                                / large.loc[large["op"] == "add", "seconds"].sum()),
        kernel_latency=max(tiny + gap, 0.0), op_rates=op_rates,
        cpu_flops=float(cpu["flops"].sum() / cpu["seconds"].sum()),
        h2d_bandwidth=h2d, d2h_bandwidth=d2h, link_latency=(h2d_latency + d2h_latency) / 2,
        duplex=float(min(max(min(shares), 0.05), 1.0)))
    transfers = table[table["what"] == "gpu->gpu"]
    if len(transfers):
        fields["gpu_gpu_bandwidth"], fields["gpu_gpu_latency"] = _line(transfers)
    return replace(base, **fields)
