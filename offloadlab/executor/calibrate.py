"""Calibration: measure a backend's rates through the executor itself and write them as a
Machine, so that the simulator predicts what the executor measures (docs/design.md, Executor;
TURNIP Sec. 5).

Kernels by op and size, float16 and CPU matmuls, kernel latency, and loads, offloads and
GPU->GPU copies (bandwidth, latency, duplex), each from a small MemGraph built here:
docs/commands/calibrate.md says what it measures and how.
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
from ..core.ops import DTYPES, OPS, op_name
from ..core.taskgraph import TaskGraph
from ..core.workloads import build_workload
from ..core.workloads.models import MODELS
from . import execute

OP_SOURCES: tuple[str, ...] = (
    "matmul-chain:layers=2,gpus=1,batch=64,hidden=64",
    "tp-matmul:n=64",
    "random:vertices=40,gpus=1",
    "training-chain:w=64KB;64KB,a=16KB;16KB,uF=0.1;0.1,uB=0.2;0.2,iterations=1",
    "gpt2-train:depth=1,batch=1,seq=8,iterations=1",
    "bert-train:depth=1,batch=1,seq=8,iterations=1",
    *(f"model:name={name},mode={mode}" for name in MODELS for mode in ("infer", "train")),
    *(f"llama-prefill:model=tiny,seq={seq},block={seq // 2}" for seq in (128, 512)),
    "llama-generate:model=tiny,seq=128,block=64,gen=2",
    *(f"llama-lora-train:model=tiny,seq={seq},block={seq // 2},optimizer={optimizer}"
      for seq in (128, 512) for optimizer in ("adam", "sgd")),
)
"""Small instances of every built-in workload (and of the options that change which ops it
emits), the llama ones at two sizes: :func:`workload_ops` reads the ops calibrate measures
off them, so that an op a workload starts to emit is measured without being named here."""

DUPLEX_REPEATS = 4
MATMUL_INTENSITY = 4.0
"""Flops per byte touched from which an op measured at its workloads' shapes is taken for a
matmul (an elementwise op does a few flops per 4-byte element; a matmul's intensity grows
with its inner dimension)."""
MATMUL_FLOOR = 0.1
"""The least share of the measured matmul rate at which such an op's measured time is taken
for its work (a CPU's BLAS runs small matmuls near its peak; a GPU's are launch-bound)."""
HALF_PROBE_SECONDS = 2e-3


@dataclass
class Calibration:
    """The calibrated machine and the table of what was measured (one row per measurement:
    ``what, op, size, bytes, flops, seconds``)."""

    machine: Machine
    table: pd.DataFrame


class KernelGraph:
    """A MemGraph of independent (or chained) vertices, each tensor at its own location."""

    def __init__(self) -> None:
        self.mg = MemGraph({"planner": "calibrate"})
        self.top: dict[str, int] = {}

    def add(self, id: str, kind: str, device: str, shape: tuple[int, ...], inputs=(),
            op: str | None = None, flops: float = 0.0, at: str | None = None,
            dtype: str = "float32") -> str:
        """Add a vertex whose output has its own location on ``at``.

        Parameters
        ----------
        id : str
            The vertex's id.
        kind : str
            Its kind (``input``, ``compute``, ``load``, ...).
        device : str
            Where it runs.
        shape : tuple of int
            Its output's shape.
        inputs : sequence of str, default ()
            Its inputs' ids, in argument order; each is also an edge.
        op : str, optional
            A compute vertex's op.
        flops : float, default 0.0
            Its flops.
        at : str, optional
            The device whose memory holds its output (none if not given).
        dtype : str, default "float32"
            Its output's dtype.

        Returns
        -------
        str
            ``id``.
        """
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
        """The bytes the most used device's locations take.

        Returns
        -------
        int
        """
        return max(self.top.values(), default=0)


@dataclass(frozen=True)
class Template:
    """A compute vertex of a workload, as calibrate measures it: its op (with parameters),
    output shape and dtype, inputs' shapes and dtypes, and flops."""

    op: str
    shape: tuple[int, ...]
    dtype: str
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    flops: float

    @property
    def touched(self) -> int:
        return sum(DTYPES[d] * math.prod(s) for s, d in ((self.shape, self.dtype), *self.inputs))


def template(graph: TaskGraph, task) -> Template:
    """Compute vertex ``task`` of ``graph`` as a :class:`Template`.

    Parameters
    ----------
    graph : TaskGraph
        The computation.
    task : Task
        One of its compute vertices.

    Returns
    -------
    Template
        With a flat shape for a tensor that records none.
    """
    def shape(t) -> tuple[int, ...]:
        return tuple(t.shape) if t.shape else (max(t.bytes // DTYPES[t.dtype], 1),)
    return Template(task.op, shape(task), task.dtype,
                    tuple((shape(graph[u]), graph[u].dtype) for u in task.inputs), task.flops)


def workload_ops(sources: Iterable[str] = OP_SOURCES) -> dict[str, list[Template]]:
    """Each op's largest vertex (most bytes touched) in each workload that emits it.

    Parameters
    ----------
    sources : iterable of str, default OP_SOURCES
        The workload specs to build.

    Returns
    -------
    dict of str to list of Template
        By op name, largest first.
    """
    found: dict[str, dict[str, Template]] = {}
    for spec in sources:
        graph = build_workload(spec)
        for task in graph:
            if task.kind == "compute" and task.op is not None:
                t = template(graph, task)
                best = found.setdefault(op_name(task.op), {}).get(spec)
                if best is None or t.touched > best.touched:
                    found[op_name(task.op)][spec] = t
    return {op: sorted(by_spec.values(), key=lambda t: -t.touched)
            for op, by_spec in sorted(found.items())}


def _square(t: Template) -> bool:
    """Whether ``t``'s op can run on n x n tensors: every input of the output's shape and
    dtype, or a row of its width (a gain)."""
    return all(d == t.dtype and s in (t.shape, t.shape[-1:]) for s, d in t.inputs)


def _kernels(op: str, templates: list[Template], sizes: Iterable[int],
             reps: int) -> tuple[MemGraph, dict[str, int]]:
    """``reps`` independent kernels of ``op`` on gpu0.  An op whose kernel folds inputs of any
    length writes n*n elements from inputs of other lengths than the output's (two, one, four
    times as long, three of a quarter), so that the bytes written and read can be told apart;
    ``matmul`` and the ops of :func:`_square` take n x n tensors (a gain, n), each size; any
    other op runs at each template's shapes (size 0).  A kernel's inputs are distinct tensors
    (one read twice would come from the cache).  Returns the graph and each kernel's size."""
    b = KernelGraph()
    first = templates[0]
    size: dict[str, int] = {}

    def inputs(shapes: Iterable[tuple[tuple[int, ...], str]], tag: str) -> tuple[str, ...]:
        return tuple(b.add(f"{tag}#{i}", "input", "gpu0", s, at="gpu0", dtype=d)
                     for i, (s, d) in enumerate(shapes))

    def kernels_of(t: Template, shape: tuple[int, ...], flops: float,
                   variants: list[tuple[str, ...]], tag: str, n: int = 0) -> None:
        for j, args in enumerate(variants):
            for r in range(reps):
                size[b.add(f"{op}{tag}.{j}#{r}", "compute", "gpu0", shape, args, t.op, flops,
                           at="gpu0", dtype=t.dtype)] = n

    if OPS[op].folds:
        for n in sizes:
            e = n * n
            variants = [inputs([((k,), "float32") for k in ks], f"f{n}.{j}")
                        for j, ks in enumerate(([e, e], [e], [4 * e], [e // 4] * 3))]
            kernels_of(first, (e,), float(e), variants, str(n), n)
    elif op == "matmul" or _square(first):
        for n in sizes:
            args = inputs([((n, n) if s == first.shape or op == "matmul" else (n,), d)
                           for s, d in first.inputs], f"x{n}")
            kernels_of(first, (n, n), 2.0 * n ** 3 if op == "matmul" else float(n * n),
                       [args], str(n), n)
    else:
        for k, t in enumerate(templates):
            kernels_of(t, t.shape, t.flops, [inputs(t.inputs, f"t{k}")], f"t{k}")
    return b.mg, size


def _chain(length: int) -> MemGraph:
    """A chain of one-element adds: kernel time plus the loop's dispatch gap."""
    b = KernelGraph()
    prev = b.add("c0", "input", "gpu0", (1,), at="gpu0")
    for k in range(1, length + 1):
        prev = b.add(f"c{k}", "compute", "gpu0", (1,), (prev,), "add", 1.0, at="gpu0")
    return b.mg


def matmuls(n: int, reps: int, dtype: str = "float32") -> MemGraph:
    """``reps`` independent matmuls of n x n tensors on gpu0.

    Run with one stream and ``fixed`` dispatch, they run one at a time.

    Parameters
    ----------
    n : int
        The tensors' side.
    reps : int
        How many matmuls.
    dtype : str, default "float32"
        The tensors' dtype.

    Returns
    -------
    MemGraph
    """
    b = KernelGraph()
    x, y = (b.add(name, "input", "gpu0", (n, n), at="gpu0", dtype=dtype) for name in "xy")
    for r in range(reps):
        b.add(f"mm#{r}", "compute", "gpu0", (n, n), (x, y), "matmul", 2.0 * n ** 3, at="gpu0",
              dtype=dtype)
    return b.mg


def _cpu_matmul(n: int, reps: int) -> MemGraph:
    b = KernelGraph()
    x = b.add("x", "input", "host", (n, n))
    for r in range(reps):
        b.add(f"mm#{r}", "compute", "cpu", (n, n), (x, x), "matmul", 2.0 * n ** 3)
    return b.mg


def _copies(sizes: Iterable[int], reps: int, h2d: bool, d2h: bool, gpus: int = 1) -> MemGraph:
    """Loads and/or offloads (and with ``gpus`` > 1, gpu0->gpu1 transfers) of each size."""
    b = KernelGraph()
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
    copies measured run one at a time per direction, each on gpu0's link and bus; a bus
    slower than a link measured through it is raised to that link's rate (on an H100, 55 GB/s
    copies were capped by the 12 GB/s bus of the p100x4 preset they were calibrated from).

    Parameters
    ----------
    base : Machine
        The machine to start from: its unmeasured fields, and on numpy its link bandwidths.
    backend : str, default "numpy"
        The executor backend to measure.
    quick : bool, default False
        Measure fewer sizes and repeats.
    progress : callable, optional
        Called with a line as each measurement starts.

    Returns
    -------
    Calibration
        The calibrated machine and the table of what was measured.

    Raises
    ------
    SpecError
        If ``backend`` is not a backend.
    """
    say = progress or (lambda _: None)
    reps = 3 if quick else 5
    sizes: tuple[int, ...]
    if backend == "numpy":
        sizes = (64, 256, 512) if quick else (128, 512, 1024, 2048)
        copy_sizes = [s * MiB for s in ((1, 4, 16) if quick else (1, 4, 16, 64))]
    else:       # a GPU: kernels past their launch latency, copies past their setup
        sizes = (512, 4096) if quick else (512, 2048, 4096)
        copy_sizes = [s * MiB for s in ((4, 64) if quick else (4, 16, 64, 256))]
    probe = replace(base, gpus=max(base.gpus, 1), gpu_memory=2**62, streams=1)
    rows: list[dict] = []

    def run(mg: MemGraph, what: str, machine: Machine = probe):
        say(what)
        return execute(mg, machine, backend=backend, policy="fixed").trace.set_index("vertex")

    for op, templates in workload_ops().items():
        mg, size = _kernels(op, templates, sizes, reps)
        trace = run(mg, f"{op} kernels")
        for vertex, n in size.items():
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
    n = sizes[-1] if backend != "numpy" else \
        max([r["size"] for r in rows if r["what"] == "kernel" and r["op"] == "matmul"
             and r["seconds"] < HALF_PROBE_SECONDS], default=sizes[0])
    half = run(matmuls(n, reps, "float16"), "float16 matmul")
    for vertex in half.index:
        rows.append(dict(what="half kernel", op="matmul", size=n, bytes=3 * 2 * n * n,
                         flops=2.0 * n ** 3,
                         seconds=half.at[vertex, "end"] - half.at[vertex, "start"]))
    n = min(sizes[-1], 2048)
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
    read_bytes / r`` over the median time of each kernel shape (one kernel held up on a
    loaded machine does not move it); one rate for both where the kernels cannot tell them
    apart (every input the output's size) or the fit is not positive."""
    rows = rows.groupby(["bytes", "read"], as_index=False)["seconds"].median()
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


def _largest(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows at the two largest sizes (all of them if the op ran at its workloads'
    shapes, size 0)."""
    return rows[rows["size"] >= sorted(rows["size"].unique())[-2:][0]]


def compute_bound(rows: pd.DataFrame, tiny: float, gpu_flops: float) -> bool:
    """Whether an op's kernels are compute-bound.

    They are where their flops at ``gpu_flops`` take at least half their time beyond a tiny
    kernel's.

    Parameters
    ----------
    rows : pandas.DataFrame
        The op's measurements at its workloads' shapes (``flops`` and ``seconds`` columns).
    tiny : float
        A tiny kernel's seconds.
    gpu_flops : float
        The measured flop rate.

    Returns
    -------
    bool
    """
    return bool((rows["flops"] / gpu_flops).sum() >= 0.5 * (rows["seconds"] - tiny).sum())


def _op_rates(kernels: pd.DataFrame, tiny: float,
              gpu_flops: float, bandwidth: float) -> tuple[tuple[str, float, float, float], ...]:
    """``(op, written, read, overhead)`` for every op measured but ``matmul`` and the
    compute-bound ones (which the roofline prices at the measured ``gpu_flops``).  An op
    measured at its workloads' shapes gets one rate for the bytes it touches (a few shapes
    fixed by the workloads cannot tell written bytes from read ones apart) and an overhead
    (:func:`_shape_rate`); one that does :data:`MATMUL_INTENSITY` flops per byte or more (a
    matmul in disguise) is fitted a byte rate only where it implies at least
    :data:`MATMUL_FLOOR` of ``gpu_flops``."""
    rates = []
    for op, rows in kernels.groupby("op"):
        if op == "matmul":
            continue
        if rows["size"].any():
            rates.append((str(op), *_rates(_largest(rows), tiny), 0.0))
        elif not compute_bound(rows, tiny, gpu_flops):
            intensity = float((rows["flops"] / rows["bytes"]).min())
            least = MATMUL_FLOOR * gpu_flops / intensity if intensity >= MATMUL_INTENSITY else 0
            rate, overhead = _shape_rate(rows, tiny, bandwidth, least)
            rates.append((str(op), rate, rate, overhead))
    return tuple(sorted(rates))


def _shape_rate(rows: pd.DataFrame, tiny: float, bandwidth: float,
                least: float = 0.0) -> tuple[float, float]:
    """Bytes/s touched and seconds of overhead of an op measured at its workloads' shapes:
    the line ``seconds - tiny = overhead + bytes / rate`` through the median time at each
    size, fitted for relative error.  Where it cannot be told from a flat line (one size, a
    slope <= 0, or a byte term under half the time of the largest kernels: they are
    launch-bound, as workloads' small shapes are on a GPU), or its rate is under ``least``
    (on an H200 ``linear_dw``'s 60-200 KB took 34-88 us, 3 GB/s or 23 GFLOP/s: not its work
    but its launches and its BLAS's choices), the bytes move at ``bandwidth`` (an ``add``'s)
    and the overhead is the median of what is left; where the overhead comes out negative,
    the line goes through the origin and the largest kernels' median."""
    median = (rows["seconds"] - tiny).clip(lower=1e-9).groupby(rows["bytes"]).median()
    touched, seconds = median.index.to_numpy(float), median.to_numpy(float)
    flat = (bandwidth, max(float(np.median(seconds - touched / bandwidth)), 0.0))
    if len(median) < 2:
        return flat
    overhead, slope = np.polynomial.polynomial.polyfit(touched, seconds, 1, w=1 / seconds)
    if slope <= 0 or slope * touched[-1] < 0.5 * seconds[-1]:
        return flat
    rate = float(1 / slope) if overhead >= 0 else float(touched[-1] / seconds[-1])
    return flat if rate < least else (rate, max(float(overhead), 0.0))


def _fit(base: Machine, table: pd.DataFrame, backend: str) -> Machine:
    """The machine the measurements describe."""
    kernels = table[table["what"] == "kernel"]
    matmul = kernels[kernels["op"] == "matmul"]
    matmul = matmul[matmul["size"] == matmul["size"].max()]
    add = _largest(kernels[kernels["op"] == "add"])
    tiny = float(table.loc[table["what"] == "tiny kernel", "seconds"].iloc[0])
    gpu_flops = float(matmul["flops"].sum() / matmul["seconds"].sum())
    bandwidth = float(add["bytes"].sum() / add["seconds"].sum())
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
        gpu_flops=gpu_flops,
        gpu_half_flops=float(half["flops"].sum() / half["seconds"].sum()),
        gpu_mem_bandwidth=bandwidth,
        kernel_latency=max(tiny + gap, 0.0),
        op_rates=_op_rates(kernels, tiny, gpu_flops, bandwidth),
        engine="fifo" if backend == "numpy" else base.engine,
        cost="roofline", kernel_fit=(),     # its measured rates price its kernels
        cpu_flops=float(cpu["flops"].sum() / cpu["seconds"].sum()),
        h2d_bandwidth=h2d, d2h_bandwidth=d2h, link_latency=(h2d_latency + d2h_latency) / 2,
        duplex=float(min(max(min(shares), 0.05), 1.0)))
    if base.host_bus_bandwidth and base.host_bus_bandwidth < max(h2d, d2h):
        # a bus no faster than one link it carries was measured: base's is not this machine's
        fields["host_bus_bandwidth"] = max(h2d, d2h)
    transfers = table[table["what"] == "gpu->gpu"]
    if len(transfers):
        fields["gpu_gpu_bandwidth"], fields["gpu_gpu_latency"] = _line(transfers)
    return replace(base, **fields)
