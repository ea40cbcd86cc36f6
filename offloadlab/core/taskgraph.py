"""TaskGraph: the dataflow DAG a user hands to a planner (docs/design.md, Vocabulary).

Each vertex produces one tensor.  ``input`` vertices exist before the run (``device`` is their
home, ``"host"`` or a GPU); ``compute`` vertices run an op on one GPU or on the CPU;
``transfer`` vertices copy a tensor from one GPU to another (``device="gpu0->gpu1"``).
Its files are :mod:`offloadlab.core.formats`'s.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from .checks import (
    INF,
    MAX_COUNT,
    builtin_number,
    number,
    short,
)
from .devices import CPU, HOST, is_gpu_name, split_transfer
from .errors import GraphError
from .ops import DTYPES, OPS, op_problem
from .util import no_gc

KINDS = ("input", "compute", "transfer")
CATEGORIES = ("weights", "activations", "gradients", "optimizer_state", "workspace")
"""What a vertex's tensor is in a training step or an inference (issue 45; the split of GPU
memory the ZeRO and Gemini papers draw): a model's parameters and buffers (and their updated
versions), the forward pass's tensors, the backward pass's (gradients of weights and of
activations alike), an optimizer's moments, and scratch a step rebuilds and drops (a layer's
forward recomputed under checkpointing).  A batch (the model's inputs and labels) counts as
activations: it is the first activation a^0 of the chain (Beaumont et al., Sec. 3), saved for
the backward like any other, and the deployed activation-offloading schemes treat a saved
input as they treat every saved tensor."""
UNKNOWN = UNSET
"""A vertex's category when its builder does not know it (msgspec's ``UNSET``: a file and
:meth:`TaskGraph.content_hash` leave the field out, so a graph's files and hash are those of a
graph without categories)."""
HASH_BLOCK = 10_000      # vertices encoded at a time by TaskGraph.content_hash


@dataclass(slots=True)
class Task:
    """One TaskGraph vertex; ``inputs`` lists the vertices it reads, in argument order."""

    id: str
    kind: str
    device: str
    bytes: int
    inputs: tuple[str, ...] = ()
    op: str | None = None
    flops: float = 0.0
    shape: tuple[int, ...] | None = None
    dtype: str = "float32"
    time: float | None = None   # profiled seconds; overrides the cost model when set
    category: str | UnsetType = UNKNOWN     # one of CATEGORIES; an annotation, not hashed

    @property
    def out_device(self) -> str:
        """Where the output lives: a GPU, or ``"host"`` for host inputs and CPU ops."""
        if self.kind == "transfer":
            return split_transfer(self.device)[1]
        return HOST if self.device == CPU else self.device

    @property
    def read_device(self) -> str:
        """Where the vertex reads its inputs from."""
        if self.kind == "transfer":
            return split_transfer(self.device)[0]
        return HOST if self.device == CPU else self.device


@dataclass
class TaskGraph:
    """A dataflow DAG of :class:`Task` vertices, kept in insertion order.

    Insertion order is the default serial order planners use, so builders add vertices
    in the order they would naturally run.
    """

    name: str = ""
    meta: dict = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)

    # -- construction -----------------------------------------------------------------
    def add(self, task: Task) -> Task:
        """Add ``task`` as a vertex.

        Parameters
        ----------
        task : Task
            The vertex; its inputs need not exist yet (:meth:`validate` checks them).

        Returns
        -------
        Task
            ``task``.

        Raises
        ------
        GraphError
            The graph has a vertex of that id already.
        """
        if task.id in self.tasks:
            raise GraphError(f"duplicate vertex id {task.id!r}")
        self.tasks[task.id] = task
        self.__dict__.pop("_succ", None)
        return task

    def add_input(self, id: str, bytes: int, home: str = HOST, *,
                  shape: tuple[int, ...] | None = None, dtype: str = "float32",
                  time: float | None = None, category: str | UnsetType = UNKNOWN) -> Task:
        """An input vertex ``id`` of ``bytes`` bytes living on ``home`` before the run.

        Parameters
        ----------
        id : str
            The vertex's name.
        bytes : int
            The tensor's size.
        home : str
            Where it lives before the run: ``host`` or a GPU.
        shape : tuple of int, optional
            The tensor's shape (its elements times the dtype's size fit in ``bytes``).
        dtype : str
            The tensor's element type.
        time : float, optional
            Seconds the vertex takes, overriding the machine's cost model.
        category : str, optional
            ``weights``, ``activations``, ``gradients`` or ``optimizer_state`` (an annotation).

        Returns
        -------
        Task
            The new vertex.

        Raises
        ------
        GraphError
            The graph has a vertex ``id`` already.
        """
        return self.add(Task(id, "input", home, bytes, shape=shape, dtype=dtype, time=time,
                             category=category))

    def add_compute(self, id: str, op: str, inputs: Iterable[str], device: str, bytes: int,
                    flops: float = 0.0, *, shape: tuple[int, ...] | None = None,
                    dtype: str = "float32", time: float | None = None,
                    category: str | UnsetType = UNKNOWN) -> Task:
        """A compute vertex ``id`` running ``op`` on ``device`` over ``inputs``.

        Parameters
        ----------
        id : str
            The vertex's name.
        op : str
            The op it runs (``offloadlab list ops``).
        inputs : iterable of str
            The vertices it reads, in argument order.
        device : str
            The GPU it runs on (``gpuN``).
        bytes : int
            The size of the tensor it writes.
        flops : float
            Its floating-point operations, for the cost model.
        shape : tuple of int, optional
            The tensor's shape (its elements times the dtype's size fit in ``bytes``).
        dtype : str
            The tensor's element type.
        time : float, optional
            Seconds the vertex takes, overriding the machine's cost model.
        category : str, optional
            ``weights``, ``activations``, ``gradients`` or ``optimizer_state`` (an annotation).

        Returns
        -------
        Task
            The new vertex.

        Raises
        ------
        GraphError
            The graph has a vertex ``id`` already.
        """
        return self.add(Task(id, "compute", device, bytes, tuple(inputs), op, flops, shape,
                             dtype, time, category))

    def add_transfer(self, id: str, source: str, dst: str) -> Task:
        """A transfer vertex ``id`` copying ``source``'s tensor and category to the GPU ``dst``.

        Parameters
        ----------
        id : str
            The vertex's name.
        source : str
            The vertex whose tensor it copies.
        dst : str
            The GPU it copies to.

        Returns
        -------
        Task
            The new vertex.

        Raises
        ------
        GraphError
            ``source`` is not a vertex of the graph, or ``id`` is one already.
        """
        src = self.tasks.get(source)
        if src is None:
            raise GraphError(f"transfer {id!r}: source {source!r} is not a vertex of the graph")
        return self.add(Task(id, "transfer", f"{src.out_device}->{dst}", src.bytes, (source,),
                             shape=src.shape, dtype=src.dtype, category=src.category))

    # -- queries ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks.values())

    def __getitem__(self, id: str) -> Task:
        return self.tasks[id]

    @property
    def succ(self) -> dict[str, list[str]]:
        """Readers of each vertex (one entry per reading vertex, in insertion order)."""
        if "_succ" not in self.__dict__:
            with no_gc():                   # a list per vertex, none cyclic
                succ: dict[str, list[str]] = {t: [] for t in self.tasks}
                for t in self.tasks.values():
                    for u in dict.fromkeys(t.inputs):
                        succ[u].append(t.id)
            self.__dict__["_succ"] = succ
        return self.__dict__["_succ"]

    def outputs(self) -> list[str]:
        """Vertices nobody reads: the graph's results.

        Returns
        -------
        list of str
            In insertion order.
        """
        return [t for t, readers in self.succ.items() if not readers]

    def gpus(self) -> list[str]:
        """The GPUs the graph uses, sorted by index.

        Returns
        -------
        list of str
            ``gpu0``, ``gpu1``, ...
        """
        found: set[str] = set()
        for device in {t.device for t in self.tasks.values()}:
            found.update(d for d in split_transfer(device) if is_gpu_name(d))
        return sorted(found, key=lambda d: int(d[3:]))

    def topological_order(self) -> list[str]:
        """Insertion order if it is topological, else a topological order (Kahn, stable).

        Returns
        -------
        list of str
            Every vertex once.
        """
        self.validate()
        if self.out_of_order() is None:
            return list(self.tasks)
        import networkx as nx
        position = {t: i for i, t in enumerate(self.tasks)}
        return list(nx.lexicographical_topological_sort(self._digraph(),
                                                        key=position.__getitem__))

    def out_of_order(self) -> tuple[str, str] | None:
        """The first ``(vertex, input)`` that insertion order lists the wrong way round.

        Returns
        -------
        (str, str) or None
            None if insertion order is topological.
        """
        seen: set[str] = set()
        for t in self.tasks.values():
            if not seen.issuperset(t.inputs):
                return t.id, next(u for u in t.inputs if u not in seen)
            seen.add(t.id)
        return None

    # -- checking ---------------------------------------------------------------------
    def validate(self) -> None:
        """Check every vertex and the graph's acyclicity.

        Raises
        ------
        GraphError
            Naming the first bad vertex: unknown kind, op, dtype, input or device (name format
            included), a size that is not a positive integer, flops or a time that is not a
            finite number >= 0 (NaN and infinities included), a shape larger than the vertex's
            bytes, a GPU vertex reading another GPU's tensor without a transfer vertex, or a
            cycle.
        """
        self.checked_order()

    def checked_order(self) -> tuple[str, str] | None:
        """:meth:`validate`, then :meth:`out_of_order`'s answer (one pass finds both).

        Returns
        -------
        (str, str) or None
            None if insertion order is topological.

        Raises
        ------
        GraphError
            As :meth:`validate`.
        """
        self._check_vertices()
        bad = self.out_of_order()
        self._check_acyclic(bad)
        return bad

    def _check_vertices(self) -> None:
        """:meth:`validate`'s checks of each vertex, in insertion order."""
        tasks = self.tasks
        devices: dict[tuple[str, str], str | None] = {}   # (kind, device) -> problem or None
        for t in tasks.values():
            kind, device = t.kind, t.device
            if type(kind) is not str or type(device) is not str:
                raise GraphError(f"vertex {t.id!r}: kind and device must be strings, got "
                                 f"{short(kind)} and {short(device)}")
            problem = devices.get((kind, device), "")
            if problem == "":
                problem = devices[kind, device] = device_problem(kind, device)
            if problem is not None:
                raise GraphError(f"vertex {t.id!r}: {problem}")
            nbytes, flops = t.bytes, t.flops
            if not (type(nbytes) is int and 0 < nbytes <= MAX_COUNT and type(flops) is float
                    and 0.0 <= flops < INF and t.time is None):
                _check_numbers(t)
            if type(t.dtype) is not str or t.dtype not in DTYPES:
                raise GraphError(f"vertex {t.id!r}: unknown dtype {short(t.dtype)}; known: "
                                 f"{', '.join(DTYPES)}")
            if t.shape is not None:
                _check_shape(t)
            if t.category is not UNKNOWN and t.category not in CATEGORIES:
                raise GraphError(f"vertex {t.id!r}: unknown category {short(t.category)}; "
                                 f"known: {', '.join(CATEGORIES)} (or leave it out: unknown)")
            if kind != "compute" and t.op is not None:
                raise GraphError(f"vertex {t.id!r}: only compute vertices have an op; this "
                                 f"{kind} vertex has op {short(t.op)} (use null)")
            if kind == "input":
                if t.inputs:
                    raise GraphError(f"vertex {t.id!r}: an input vertex reads nothing")
                continue
            if kind == "compute":
                if type(t.op) is not str or t.op not in OPS:
                    problem = op_problem(t.op)
                    if problem is not None:
                        raise GraphError(f"vertex {t.id!r}: {problem}")
                gpu = None if device == CPU else device
            else:
                gpu = device.partition("->")[0]
                if len(t.inputs) != 1:
                    raise GraphError(f"vertex {t.id!r}: a transfer reads exactly one tensor "
                                     f"living on {gpu}, got {len(t.inputs)}")
            for u in t.inputs:
                src = tasks.get(u)
                if src is None:
                    raise GraphError(f"vertex {t.id!r}: input {u!r} is not a vertex of the graph")
                lives = src.device      # a host input is readable on any GPU but by a transfer
                if gpu is not None and lives != gpu and (lives != HOST or kind == "transfer"):
                    _check_readable(t, gpu, src)

    def _check_acyclic(self, bad: tuple[str, str] | None) -> None:
        """Refuse a cycle; ``bad`` is :meth:`out_of_order`'s answer (None: acyclic)."""
        if bad is None:
            return                              # insertion order is topological
        import networkx as nx
        g = self._digraph()
        if not nx.is_directed_acyclic_graph(g):
            cycle = nx.find_cycle(g)
            raise GraphError("TaskGraph has a cycle: " + " -> ".join(str(e[0]) for e in cycle)
                             + f" -> {cycle[0][0]}")

    def content_hash(self) -> str:
        """The content hash a planner records in the MemGraph (``graph.taskgraph_hash``).

        The digest covers the TaskGraph's attributes (less its name) and its vertices in order,
        each with all its fields (its inputs: the edges) but its category (an annotation), as
        MessagePack, ``flops`` and ``time`` as floats as a file gives them back; the same
        TaskGraph read back from its file hashes the same.  Encoded a block of vertices at a
        time, so it holds no copy of the graph.

        Returns
        -------
        str
            ``"sha256:"`` and the hex digest.
        """
        tasks = list(self.tasks.values())
        encode = msgspec.msgpack.Encoder(enc_hook=builtin_number).encode
        digest = hashlib.sha256(encode(self.meta))
        for at in range(0, len(tasks), HASH_BLOCK):
            digest.update(encode(_hashed(tasks[at:at + HASH_BLOCK])))
        return "sha256:" + digest.hexdigest()

    def _digraph(self):
        """A networkx DiGraph of the vertex ids and the edges (input -> reader)."""
        import networkx as nx
        g = nx.DiGraph()
        g.add_nodes_from(self.tasks)
        g.add_edges_from((u, t.id) for t in self.tasks.values() for u in dict.fromkeys(t.inputs))
        return g


class _Hashed(msgspec.Struct, gc=False):
    """A vertex as :meth:`TaskGraph.content_hash` encodes it: :class:`Task`'s fields in its
    order but the category (MessagePack encodes both as the same map).  Not tracked by the
    garbage collector: hashing a large graph makes one per vertex, none cyclic."""

    id: Any
    kind: Any
    device: Any
    bytes: Any
    inputs: Any
    op: Any
    flops: Any
    shape: Any
    dtype: Any
    time: Any


def _hashed(tasks: list[Task]) -> list[Task] | list[_Hashed]:
    """``tasks`` as :meth:`TaskGraph.content_hash` encodes them: ``flops`` and ``time`` as
    floats, and no category (copies only where one differs)."""
    if {*map(type, map(attrgetter("flops"), tasks))} <= {float} and \
            {*map(type, map(attrgetter("time"), tasks))} <= {float, type(None)} and \
            {*map(attrgetter("category"), tasks)} <= {UNKNOWN}:
        return tasks
    return [_Hashed(t.id, t.kind, t.device, t.bytes, t.inputs, t.op, float(t.flops), t.shape,
                    t.dtype, None if t.time is None else float(t.time)) for t in tasks]


def device_problem(kind: str, device: str) -> str | None:
    """What is wrong with a vertex of ``kind`` on ``device``.

    Parameters
    ----------
    kind : str
        ``input``, ``compute`` or ``transfer``.
    device : str
        Where the vertex lives or runs.

    Returns
    -------
    str or None
        One line saying what is wrong, or None.
    """
    if kind not in KINDS:
        return f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})"
    if kind == "input":
        if device == HOST or is_gpu_name(device):
            return None
        return f"input home must be 'host' or a GPU ('gpu0', 'gpu1', ...), got {device!r}"
    if kind == "compute":
        if device == CPU or is_gpu_name(device):
            return None
        return f"compute device must be 'cpu' or a GPU ('gpu0', 'gpu1', ...), got {device!r}"
    src, arrow, dst = device.partition("->")
    if arrow and is_gpu_name(src) and is_gpu_name(dst) and src != dst:
        return None
    return f"transfer device must be 'gpuI->gpuJ' with I != J, got {device!r}"


def _check_numbers(t: Task) -> None:
    """``bytes`` a positive integer, ``flops`` and ``time`` (when set) finite and >= 0 (the
    inline tests pass valid vertices without a call)."""
    nbytes, flops, time = t.bytes, t.flops, t.time
    if type(nbytes) is not int or not 0 < nbytes <= MAX_COUNT:
        number(nbytes, f"vertex {t.id!r}", "bytes", count=True, positive=True)
    if type(flops) is not float or not 0.0 <= flops < INF:
        number(flops, f"vertex {t.id!r}", "flops")
    if time is not None and (type(time) is not float or not 0.0 <= time < INF):
        number(time, f"vertex {t.id!r}", "time")


def _check_shape(t: Task) -> None:
    """A shape is a sequence of integers >= 0 whose elements fit in the vertex's bytes."""
    shape: Any = t.shape
    if type(shape) not in (tuple, list) or not {*map(type, shape)} <= {int} or \
            min(shape, default=0) < 0:
        raise GraphError(f"vertex {t.id!r}: shape must be a list of integers >= 0, got "
                         f"{short(list(shape) if type(shape) is tuple else shape)}")
    need = math.prod(shape) * DTYPES[t.dtype]
    if need > t.bytes:
        raise GraphError(f"vertex {t.id!r}: shape {list(shape)} of {t.dtype} needs {need} bytes, "
                         f"more than its {t.bytes} bytes")


def _check_readable(t: Task, gpu: str, src: Task) -> None:
    """A vertex reading on ``gpu`` may read a tensor living there or, unless it is a transfer,
    in host RAM (the planner loads it); a tensor on another GPU needs a transfer vertex."""
    lives = src.out_device
    if lives == gpu:
        return
    if t.kind == "transfer":
        raise GraphError(f"vertex {t.id!r}: a transfer reads exactly one tensor living on {gpu}; "
                         f"{src.id!r} lives on {lives}")
    if lives != HOST:
        raise GraphError(f"vertex {t.id!r} on {gpu} reads {src.id!r}, which lives on {lives}: "
                         f"add a transfer vertex that copies it from {lives} to {gpu} "
                         f"(TaskGraph.add_transfer) and read that instead")
