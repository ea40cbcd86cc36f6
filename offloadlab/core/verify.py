"""The MemGraph verifier: rules 1-4 of docs/design.md ("Correctness of a MemGraph"), and that the
planner's ``order`` is a topological order.

Rule 5 (any edge-respecting order computes the TaskGraph's outputs) follows from rules 1-3;
the executor's tests check it numerically.
"""

from __future__ import annotations

from .devices import CPU, HOST
from .errors import VerificationError
from .intervals import LastWriter
from .machine import Machine
from .memgraph import MOVE_KINDS, TASK_KINDS, MemGraph, MemVertex
from .ops import UPDATE_OPS
from .taskgraph import TaskGraph
from .util import no_gc


def verify(mg: MemGraph, graph: TaskGraph | None = None, machine: Machine | None = None) -> None:
    """Raise :class:`VerificationError` naming the first broken rule and vertex.

    ``graph`` enables rule 2 (every TaskGraph data edge is present), ``machine`` rule 4
    (locations within capacity; without it the capacity stored in ``mg.graph["machine"]``
    is used when present).
    """
    with no_gc():                       # sets, lists and dicts by the vertex; none cyclic
        _verify(mg, graph, machine)


def _verify(mg: MemGraph, graph: TaskGraph | None, machine: Machine | None) -> None:
    order = {v.id: v.order for v in mg.vertices.values()}
    backwards = _backward_edge(mg, order)
    if backwards is not None:
        _rule1_acyclic(mg)
    _check_fields(mg)
    if backwards is not None:
        u, v, kind = backwards
        raise VerificationError(f"order: {kind} edge {u!r} -> {v!r} goes from order "
                                f"{order[u]} to {order[v]}; 'order' must increase "
                                f"along every edge")
    if graph is not None:
        _rule2_data_edges(mg, graph)
    _rule3_no_races(mg, order)
    capacity = machine.gpu_memory if machine else (mg.graph.get("machine") or {}).get("gpu_memory")
    if capacity is not None:
        _rule4_capacity(mg, capacity)


def _backward_edge(mg: MemGraph, order: dict[str, int]) -> tuple[str, str, str] | None:
    """The first edge along which the planner's ``order`` does not increase, or None.  None
    proves rule 1 too: ``order`` is then a topological order, and there is no cycle."""
    for u, targets in mg.succ.items():
        before = order[u]
        for v, kind in targets.items():
            if order[v] <= before:
                return u, v, kind
    return None


def _rule1_acyclic(mg: MemGraph) -> None:
    """Kahn's algorithm, for a MemGraph whose ``order`` goes backwards along some edge: raise
    if that is because it has a cycle."""
    indeg = {v: len(p) for v, p in mg.pred.items()}
    ready = [v for v, d in indeg.items() if d == 0]
    done = 0
    while ready:
        u = ready.pop()
        done += 1
        for w in mg.succ[u]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    if done != len(mg.vertices):
        stuck = [v for v, d in indeg.items() if d > 0][:5]
        raise VerificationError("rule 1: MemGraph has a cycle through "
                                + ", ".join(map(repr, stuck)))


def _check_fields(mg: MemGraph) -> None:
    for v in mg.vertices.values():
        writes_gpu = v.out_device != HOST and v.kind != "offload"
        if writes_gpu and v.loc is None:
            raise VerificationError(f"vertex {v.id!r} writes {v.out_device} but has no location")
        if v.loc is not None:
            if not writes_gpu or v.loc.device != v.out_device:
                raise VerificationError(f"vertex {v.id!r}: location on {v.loc.device} but its "
                                        f"output lives on {v.out_device}")
            if v.loc.size < v.bytes:
                raise VerificationError(f"vertex {v.id!r}: location of {v.loc.size} B holds "
                                        f"{v.bytes} B")
        for u in v.inputs:
            if mg.pred[v.id].get(u) != "data":
                raise VerificationError(f"vertex {v.id!r} reads {u!r} without a data edge")


def _provides(mg: MemGraph, m: MemVertex, task: str) -> bool:
    """Whether ``m``'s output is ``task``'s tensor: ``task`` itself or a chain of
    offload/reload/load vertices moving it (docs/design.md rule 2)."""
    while True:
        if m.kind in TASK_KINDS:
            return m.task == task
        if m.of != task:
            return False
        sources = [u for u, kind in mg.pred[m.id].items() if kind == "data"]
        if len(sources) != 1:
            return False
        m = mg.vertices[sources[0]]


def _rule2_data_edges(mg: MemGraph, graph: TaskGraph) -> None:
    by_task: dict[str | None, MemVertex] = {}
    for m in mg.vertices.values():
        if m.kind in TASK_KINDS:
            if m.task in by_task:
                raise VerificationError(f"rule 2: TaskGraph vertex {m.task!r} appears twice")
            by_task[m.task] = m
        elif m.kind not in MOVE_KINDS:
            raise VerificationError(f"vertex {m.id!r} has unknown kind {m.kind!r}")
    for t in graph:
        v = by_task.get(t.id)
        if v is None:
            raise VerificationError(f"rule 2: TaskGraph vertex {t.id!r} is missing")
        on_cpu = v.device == CPU and t.op in UPDATE_OPS   # an update may run there instead
        if v.kind != t.kind or (v.device != t.device and not on_cpu):
            raise VerificationError(f"rule 2: vertex {t.id!r} is {v.kind} on {v.device}, "
                                    f"the TaskGraph says {t.kind} on {t.device}")
        read_device = HOST if on_cpu else t.read_device
        if len(v.inputs) != len(t.inputs):
            raise VerificationError(f"rule 2: vertex {t.id!r} reads {len(v.inputs)} tensors, "
                                    f"the TaskGraph says {len(t.inputs)}")
        for m_id, u in zip(v.inputs, t.inputs):
            m = mg.vertices[m_id]
            if not _provides(mg, m, u):
                raise VerificationError(f"rule 2: data edge {u!r} -> {t.id!r} is missing "
                                        f"({t.id!r} reads {m_id!r} instead)")
            if m.out_device != read_device:
                raise VerificationError(f"rule 2: {t.id!r} reads {u!r} from {m.out_device}, "
                                        f"but runs on {read_device}")


def _rule3_no_races(mg: MemGraph, order: dict[str, int]) -> None:
    """Whenever x and y write overlapping bytes, x is an ancestor of y and so is every reader
    of x (or it is y).  Checking each byte's consecutive writers in topological order
    suffices: the relation is transitive.

    One pass over the writers in planner order with an interval map per GPU.  Planners
    order an overwrite with a memory edge from each reader (or from the writer), so almost
    every ancestor is a predecessor of y (x itself then through any of its readers that is) or
    of one of y's predecessors; only the rest are searched for, backwards from y and no
    further back than the oldest of them."""
    maps: dict[str, LastWriter] = {}
    writers = sorted((v.order, i, v.id, v.loc) for i, v in enumerate(mg.vertices.values())
                     if v.loc is not None)
    pred, succ = mg.pred, mg.succ
    for _, _, y_id, loc in writers:
        near: set[str] | None = None             # y's predecessors and theirs
        direct = pred[y_id]
        bytes_of = maps.get(loc.device)
        if bytes_of is None:
            bytes_of = maps[loc.device] = LastWriter()
        for x in bytes_of.overwrite(loc.offset, loc.end, y_id):
            readers = [r for r, kind in succ[x].items() if kind == "data" and r != y_id]
            far = [r for r in readers if r not in direct]
            if x not in direct and len(far) == len(readers):
                far.insert(0, x)                 # else x -> a reader of it -> y
            if far and near is None:
                near = set(direct)
                for p in direct:
                    near.update(pred[p])
            far = [t for t in far if t not in near] if far and near is not None else far
            missing = _not_ancestors(mg, order, far, y_id) if far else []
            if missing:
                raise VerificationError(
                    f"rule 3: race on {loc.device}: {y_id!r} overwrites {x!r}'s "
                    f"bytes but {', '.join(map(repr, missing))} may still run after it")


def _not_ancestors(mg: MemGraph, order: dict[str, int], targets: list[str], y: str) -> list[str]:
    """Those of ``targets`` that are not ancestors of ``y``: a backward search from ``y``
    pruned by the planner's order, which increases along every edge (checked before)."""
    lo = min(order[t] for t in targets)
    left = {t for t in targets if order[t] < order[y]}
    missing = [t for t in targets if t not in left]
    stack, seen = [y], {y}
    while stack and left:
        for p in mg.pred[stack.pop()]:
            if p not in seen and order[p] >= lo:
                seen.add(p)
                left.discard(p)
                stack.append(p)
    return missing + sorted(left)


def _rule4_capacity(mg: MemGraph, capacity: int) -> None:
    for v in mg.vertices.values():
        if v.loc is not None and (v.loc.offset < 0 or v.loc.end > capacity):
            raise VerificationError(f"rule 4: vertex {v.id!r} at [{v.loc.offset}, {v.loc.end}) "
                                    f"lies outside {v.loc.device}'s {capacity} bytes")
