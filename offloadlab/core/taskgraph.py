"""TaskGraph: the dataflow DAG a user hands to a planner (DESIGN.md, Vocabulary).

Each vertex produces one tensor.  ``input`` vertices exist before the run (``device`` is their
home, ``"host"`` or a GPU); ``compute`` vertices run an op on one GPU or on the CPU;
``transfer`` vertices copy a tensor from one GPU to another (``device="gpu0->gpu1"``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from .devices import CPU, HOST, is_gpu, split_transfer
from .errors import GraphError
from .ops import OPS

KINDS = ("input", "compute", "transfer")


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
        if task.id in self.tasks:
            raise GraphError(f"duplicate vertex id {task.id!r}")
        self.tasks[task.id] = task
        self.__dict__.pop("_succ", None)
        return task

    def add_input(self, id: str, bytes: int, home: str = HOST, **kw) -> Task:
        return self.add(Task(id, "input", home, bytes, **kw))

    def add_compute(self, id: str, op: str, inputs: Iterable[str], device: str, bytes: int,
                    flops: float = 0.0, **kw) -> Task:
        return self.add(Task(id, "compute", device, bytes, tuple(inputs), op, flops, **kw))

    def add_transfer(self, id: str, source: str, dst: str) -> Task:
        src = self.tasks[source]
        return self.add(Task(id, "transfer", f"{src.out_device}->{dst}", src.bytes, (source,),
                             shape=src.shape, dtype=src.dtype))

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
            succ: dict[str, list[str]] = {t: [] for t in self.tasks}
            for t in self.tasks.values():
                for u in dict.fromkeys(t.inputs):
                    succ[u].append(t.id)
            self.__dict__["_succ"] = succ
        return self.__dict__["_succ"]

    def outputs(self) -> list[str]:
        """Vertices nobody reads: the graph's results."""
        return [t for t, readers in self.succ.items() if not readers]

    def gpus(self) -> list[str]:
        """The GPUs the graph uses, sorted by index."""
        found: set[str] = set()
        for device in {t.device for t in self.tasks.values()}:
            found.update(d for d in split_transfer(device) if is_gpu(d))
        return sorted(found, key=lambda d: int(d[3:]))

    def topological_order(self) -> list[str]:
        """Insertion order if it is topological, else a topological order (Kahn, stable)."""
        self.validate()
        if self.out_of_order() is None:
            return list(self.tasks)
        import networkx as nx
        return list(nx.lexicographical_topological_sort(
            self.to_networkx(), key=list(self.tasks).index))

    def out_of_order(self) -> tuple[str, str] | None:
        """The first ``(vertex, input)`` that insertion order lists the wrong way round, or
        None if insertion order is topological."""
        seen: set[str] = set()
        for t in self.tasks.values():
            if not seen.issuperset(t.inputs):
                return t.id, next(u for u in t.inputs if u not in seen)
            seen.add(t.id)
        return None

    # -- checking ---------------------------------------------------------------------
    def validate(self) -> None:
        """Raise :class:`GraphError` naming the first bad vertex: unknown kind, op, input or
        device, a non-positive size, or a cycle."""
        for t in self.tasks.values():
            where = f"vertex {t.id!r}"
            if t.kind not in KINDS:
                raise GraphError(f"{where}: unknown kind {t.kind!r} (expected one of {KINDS})")
            if not isinstance(t.bytes, int) or isinstance(t.bytes, bool) or t.bytes <= 0:
                raise GraphError(f"{where}: bytes must be a positive integer, got {t.bytes!r}")
            if t.flops < 0:
                raise GraphError(f"{where}: flops must be >= 0, got {t.flops!r}")
            if t.time is not None and not t.time >= 0:
                raise GraphError(f"{where}: time must be >= 0 seconds, got {t.time!r}")
            for u in t.inputs:
                if u not in self.tasks:
                    raise GraphError(f"{where}: input {u!r} is not a vertex of the graph")
            if t.kind == "input":
                if t.inputs:
                    raise GraphError(f"{where}: an input vertex reads nothing")
                if t.device != HOST and not is_gpu(t.device):
                    raise GraphError(f"{where}: input home must be 'host' or a GPU, got {t.device!r}")
            elif t.kind == "compute":
                if t.op not in OPS:
                    raise GraphError(f"{where}: unknown op {t.op!r}; known ops: {', '.join(OPS)}")
                if t.device != CPU and not is_gpu(t.device):
                    raise GraphError(f"{where}: compute device must be 'cpu' or a GPU, got {t.device!r}")
            else:
                src, dst = split_transfer(t.device)
                if not (is_gpu(src) and is_gpu(dst)) or src == dst:
                    raise GraphError(f"{where}: transfer device must be 'gpuI->gpuJ', got {t.device!r}")
                if len(t.inputs) != 1 or self.tasks[t.inputs[0]].out_device != src:
                    raise GraphError(f"{where}: a transfer reads exactly one tensor living on {src}")
        self._check_acyclic()

    def _check_acyclic(self) -> None:
        if self.out_of_order() is None:
            return                              # insertion order is topological
        indeg = {t.id: len(set(t.inputs)) for t in self.tasks.values()}
        ready = [t for t, d in indeg.items() if d == 0]
        done = 0
        while ready:
            u = ready.pop()
            done += 1
            for w in self.succ[u]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
        if done != len(self.tasks):
            import networkx as nx
            cycle = nx.find_cycle(self.to_networkx())
            raise GraphError("TaskGraph has a cycle: " + " -> ".join(str(e[0]) for e in cycle)
                             + f" -> {cycle[0][0]}")

    # -- interchange ------------------------------------------------------------------
    def to_networkx(self):
        """A networkx DiGraph with the vertex fields as node attributes."""
        import networkx as nx
        g = nx.DiGraph(name=self.name, **self.meta)
        for t in self.tasks.values():
            g.add_node(t.id, **{k: v for k, v in asdict(t).items() if k != "id"})
        for t in self.tasks.values():
            for i, u in enumerate(t.inputs):
                g.add_edge(u, t.id, kind="data", arg=i)
        return g

    def to_dict(self) -> dict:
        nodes = []
        for t in self.tasks.values():
            node = {"id": t.id, "kind": t.kind, "device": t.device, "op": t.op,
                    "bytes": t.bytes, "flops": t.flops, "inputs": list(t.inputs),
                    "shape": list(t.shape) if t.shape is not None else None, "dtype": t.dtype,
                    "time": t.time}
            nodes.append(node)
        edges = [{"source": u, "target": t.id, "kind": "data"}
                 for t in self.tasks.values() for u in dict.fromkeys(t.inputs)]
        return {"directed": True, "multigraph": False,
                "graph": {"type": "TaskGraph", "name": self.name, **self.meta},
                "nodes": nodes, "edges": edges}

    def to_json(self, path: str | Path | None = None) -> str:
        """Node-link JSON text, also written to ``path`` if given."""
        return _write(self.to_dict(), path)

    @classmethod
    def from_dict(cls, data: dict, where: str = "TaskGraph JSON") -> "TaskGraph":
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise GraphError(f"{where}: expected node-link JSON with a 'nodes' list")
        meta = dict(data.get("graph") or {})
        meta.pop("type", None)
        g = cls(name=meta.pop("name", ""), meta=meta)
        edge_inputs: dict[str, list[str]] = {}
        for e in data.get("edges", []):
            try:
                edge_inputs.setdefault(e["target"], []).append(e["source"])
            except (KeyError, TypeError):
                raise GraphError(f"{where}: edge {e!r} lacks 'source' or 'target'") from None
        for n in data["nodes"]:
            try:
                nid = str(n["id"])
                inputs = n.get("inputs")
                if inputs is None:
                    inputs = edge_inputs.get(n["id"], [])
                shape = n.get("shape")
                g.add(Task(nid, n["kind"], n["device"], n["bytes"], tuple(map(str, inputs)),
                           n.get("op"), float(n.get("flops") or 0.0),
                           tuple(shape) if shape is not None else None, n.get("dtype", "float32"),
                           n.get("time")))
            except (KeyError, TypeError) as exc:
                raise GraphError(f"{where}: node {n!r} lacks or mistypes field {exc}") from None
        g.validate()
        return g

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "TaskGraph":
        """Read node-link JSON from a string or a file path."""
        data, where = _read(text_or_path, "TaskGraph JSON")
        return cls.from_dict(data, where)


def _write(data: dict, path: str | Path | None) -> str:
    text = json.dumps(data)
    if path is not None:
        Path(path).write_text(text)
    return text


def _read(text_or_path: str | Path, what: str) -> tuple[dict, str]:
    """Parse JSON from a string or a path, raising GraphError that names the file."""
    where = what
    text = str(text_or_path)
    if isinstance(text_or_path, Path) or not text.lstrip().startswith("{"):
        path = Path(text_or_path)
        where = f"{what} file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise GraphError(f"cannot read {where}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise GraphError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text), where
    except json.JSONDecodeError as exc:
        raise GraphError(f"{where}: malformed JSON ({exc})") from None
