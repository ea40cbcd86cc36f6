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
from .memgraph import MOVE_KINDS, TASK_KINDS, Loc, MemGraph, MemVertex
from .ops import UPDATE_OPS
from .taskgraph import TaskGraph
from .util import let_signals_in, no_gc

Writer = tuple[int, str, Loc, dict[str, str], dict[str, str]]
"""A vertex that writes GPU memory: its order, id, location, predecessors and successors."""


def verify(mg: MemGraph, graph: TaskGraph | None = None, machine: Machine | None = None) -> None:
    """Check a MemGraph against the correctness rules (docs/design.md).

    First the rules of the MemGraph alone (1, 3 and 4, each vertex's location and inputs,
    and that ``order`` increases along every edge), then, given ``graph``, rule 2
    (:func:`verify_against`).

    Parameters
    ----------
    mg : MemGraph
        The plan.
    graph : TaskGraph, optional
        The graph it plans; enables rule 2.
    machine : Machine, optional
        Enables rule 4 (locations within capacity); without it the capacity stored in
        ``mg.graph["machine"]`` is used when present.

    Raises
    ------
    VerificationError
        Naming the first broken rule and vertex.
    """
    with no_gc():                       # sets, lists and dicts by the vertex; none cyclic
        _verify(mg, machine)
        if graph is not None:
            _rule2_data_edges(mg, graph)


def verify_against(mg: MemGraph, graph: TaskGraph) -> None:
    """Rule 2 alone: every vertex of ``graph`` is in ``mg`` once and reads its inputs' tensors.

    Each vertex of ``graph`` is in ``mg`` once, of its kind on its device, and reads each of
    its inputs' tensors (through any offloads, reloads and loads of it).  It holds up on a
    MemGraph that breaks the other rules (an input naming no vertex, a cycle), so that it can
    run beside them (:mod:`offloadlab.lab.beside`); :func:`verify` reports those first.

    Parameters
    ----------
    mg : MemGraph
        The plan.
    graph : TaskGraph
        The graph it plans.

    Raises
    ------
    VerificationError
        Naming the first vertex that breaks it.
    """
    with no_gc():
        _rule2_data_edges(mg, graph)


def _verify(mg: MemGraph, machine: Machine | None) -> None:
    capacity = machine.gpu_memory if machine else (mg.graph.get("machine") or {}).get("gpu_memory")
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int)):
        raise VerificationError(f"rule 4: the machine's gpu_memory is {capacity!r}, not a "
                                f"whole number of bytes")
    scan = _Scan(mg, capacity)
    if scan.backward is not None:
        _rule1_acyclic(mg)
    if scan.field is not None:
        raise VerificationError(scan.field)
    if scan.backward is not None:
        u, v, kind = scan.backward
        raise VerificationError(f"order: {kind} edge {u!r} -> {v!r} goes from order "
                                f"{mg[u].order} to {mg[v].order}; 'order' must increase "
                                f"along every edge")
    _rule3_no_races(mg, scan.writers)
    if scan.outside is not None:
        out = scan.outside
        assert out.loc is not None
        raise VerificationError(f"rule 4: vertex {out.id!r} at [{out.loc.offset}, "
                                f"{out.loc.end}) lies outside {out.loc.device}'s {capacity} "
                                f"bytes")


class _Scan:
    """One pass over the vertices, in the MemGraph's order, for what the rules check of each
    vertex and its edges: the first problem of each kind (raised in the rules' order by
    :func:`_verify`) and the writers of GPU memory, for rule 3.  One pass, not one per rule:
    at a million vertices each pass over the vertices and their edge dicts misses the caches
    anew."""

    def __init__(self, mg: MemGraph, capacity: int | None):
        self.field: str | None = None                   # the first vertex's broken field
        self.backward: tuple[str, str, str] | None = None   # the first edge against order
        self.outside: MemVertex | None = None           # rule 4: the first outside capacity
        self.writers: list[Writer] = []
        writers = self.writers
        vertices, succs, preds = mg.vertices, mg.succ, mg.pred
        if not len(succs) == len(preds) == len(vertices):
            raise VerificationError(f"the MemGraph lists {len(vertices)} vertices but the "
                                    f"edges of {len(succs)} and {len(preds)} (succ, pred)")
        # the three dicts list the vertices in the same order (MemGraph.add_vertex), so they
        # are walked side by side, each vertex's edges found by id only where they are not
        for k, (v, (s, succ), (p, pred)) in enumerate(zip(vertices.values(), succs.items(),
                                                          preds.items())):
            if not k & 4095:
                let_signals_in()        # compiled: where a Ctrl-C or SIGTERM can stop it
            if s != v.id or p != v.id:
                succ, pred = succs[v.id], preds[v.id]
            if self.backward is None:
                before = v.order
                for w, kind in succ.items():
                    if vertices[w].order <= before:    # each order read where it is
                        self.backward = v.id, w, kind
                        break
            if self.field is None:
                self.field = _field_problem(v, pred)
            loc = v.loc
            if loc is not None:
                writers.append((v.order, v.id, loc, pred, succ))
                if (capacity is not None and self.outside is None
                        and (loc.offset < 0 or loc.end > capacity)):
                    self.outside = v


def _field_problem(v: MemVertex, pred: dict[str, str]) -> str | None:
    """What is wrong with ``v``'s location or its inputs (``pred``: its predecessors), or
    None."""
    writes_gpu = v.out_device != HOST and v.kind != "offload"
    if writes_gpu and v.loc is None:
        return f"vertex {v.id!r} writes {v.out_device} but has no location"
    if v.loc is not None:
        if not writes_gpu or v.loc.device != v.out_device:
            return (f"vertex {v.id!r}: location on {v.loc.device} but its output lives on "
                    f"{v.out_device}")
        if v.loc.size < v.bytes:
            return f"vertex {v.id!r}: location of {v.loc.size} B holds {v.bytes} B"
    for u in v.inputs:
        if pred.get(u) != "data":
            return f"vertex {v.id!r} reads {u!r} without a data edge"
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


def _provides(mg: MemGraph, m: MemVertex, task: str) -> bool:
    """Whether ``m``'s output is ``task``'s tensor: ``task`` itself or a chain of
    offload/reload/load vertices moving it (docs/design.md rule 2), each earlier in the
    planner's order than the next and no longer than the graph (a chain that is not breaks
    rule 1 or the order)."""
    for _ in range(len(mg.vertices)):
        if m.kind in TASK_KINDS:
            return m.task == task
        if m.of != task:
            return False
        sources = [u for u, kind in mg.pred.get(m.id, {}).items() if kind == "data"]
        source = mg.vertices.get(sources[0]) if len(sources) == 1 else None
        if source is None or not source.order < m.order:
            return False
        m = source
    return False


def _rule2_data_edges(mg: MemGraph, graph: TaskGraph) -> None:
    vertices = mg.vertices
    by_task: dict[str | None, MemVertex] = {}
    for w in vertices.values():
        if w.kind in TASK_KINDS:
            if w.task in by_task:
                raise VerificationError(f"rule 2: TaskGraph vertex {w.task!r} appears twice")
            by_task[w.task] = w
        elif w.kind not in MOVE_KINDS:
            raise VerificationError(f"vertex {w.id!r} has unknown kind {w.kind!r}")
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
            m = vertices.get(m_id)
            if m is None or not _provides(mg, m, u):
                raise VerificationError(f"rule 2: data edge {u!r} -> {t.id!r} is missing "
                                        f"({t.id!r} reads {m_id!r} instead)")
            if m.out_device != read_device:
                raise VerificationError(f"rule 2: {t.id!r} reads {u!r} from {m.out_device}, "
                                        f"but runs on {read_device}")


def _rule3_no_races(mg: MemGraph, writers: list[Writer]) -> None:
    """Whenever x and y write overlapping bytes, x is an ancestor of y and so is every reader
    of x (or it is y).  Checking each byte's consecutive writers in topological order
    suffices: the relation is transitive.

    One pass over the writers in planner order with an interval map per GPU, which maps bytes
    to their last writer's place in that order (so each writer's edges are at hand, without
    a lookup by id).  Planners order an overwrite with a memory edge from each reader (or
    from the writer), so almost every ancestor is a predecessor of y (x itself then through
    any of its readers that is) or of one of y's predecessors; only the rest are searched
    for, backwards from y and no further back than the oldest of them."""
    maps: dict[str, LastWriter[int]] = {}
    writers.sort(key=_first)                    # by order; a MemGraph's is mostly sorted
    pred = mg.pred
    for k, (_, y_id, loc, direct, _) in enumerate(writers):
        if not k & 4095:
            let_signals_in()
        near: set[str] | None = None             # y's predecessors and theirs
        bytes_of = maps.get(loc.device)
        if bytes_of is None:
            bytes_of = maps[loc.device] = LastWriter()
        for j in bytes_of.overwrite(loc.offset, loc.end, k):
            _, x, _, _, readers = writers[j]
            far: list[str] = []                  # x's readers that y does not follow directly
            after = x in direct                  # whether y follows x through a predecessor
            for r, kind in readers.items():
                if kind == "data" and r != y_id:
                    if r in direct:
                        after = True
                    else:
                        far.append(r)
            if not after:
                far.insert(0, x)                 # else x -> a reader of it -> y
            if not far:
                continue
            if near is None:
                near = set(direct)
                for p in direct:
                    near.update(pred[p])
            far = [t for t in far if t not in near]
            missing = _not_ancestors(mg, far, y_id) if far else []
            if missing:
                raise VerificationError(
                    f"rule 3: race on {loc.device}: {y_id!r} overwrites {x!r}'s "
                    f"bytes but {', '.join(map(repr, missing))} may still run after it")


def _first(writer: Writer) -> int:
    return writer[0]


def _not_ancestors(mg: MemGraph, targets: list[str], y: str) -> list[str]:
    """Those of ``targets`` that are not ancestors of ``y``: a backward search from ``y``
    pruned by the planner's order, which increases along every edge (checked before)."""
    vertices = mg.vertices
    lo = min(vertices[t].order for t in targets)
    left = {t for t in targets if vertices[t].order < vertices[y].order}
    missing = [t for t in targets if t not in left]
    stack, seen = [y], {y}
    while stack and left:
        for p in mg.pred[stack.pop()]:
            if p not in seen and vertices[p].order >= lo:
                seen.add(p)
                left.discard(p)
                stack.append(p)
    return missing + sorted(left)
