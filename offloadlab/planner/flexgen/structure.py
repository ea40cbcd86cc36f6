"""A LLaMA prefill or generation TaskGraph read as FlexGen reads a model (``flexgen/flex_opt.py``,
``OptLM``): its layers and GPU batches, and what each tensor is to FlexGen's policy.

FlexGen's layers are the input embedding (layer 0), the decoder layers (1..L) and the output
embedding (L + 1); a GPU batch is a row block, and a *step* one layer on one GPU batch.  A
generation's tokens are unrolled into layers, so that steps run in FlexGen's order
``(i, j, k)``.  Each computed tensor is KV cache, a hidden state, an output or workspace.  How
vertices map to layers, batches and roles: docs/deployed.md ("FlexGen").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...core.devices import HOST
from ...core.errors import PlanError
from ...core.machine import Machine
from ...core.ops import UPDATE_OPS, touched_bytes
from ...core.taskgraph import Task, TaskGraph

_DECODER = re.compile(r"L(\d+)\.")
_ROW = re.compile(r"\.b(\d+)(?:\.[kt]\d+)?$")
_CACHE = re.compile(r"(?:d\d+\.)?L\d+\.(?:kr|v)\.h\d+\.b\d+$")
_TOKEN = re.compile(r"d(\d+)\.")
WORKLOADS = ("llama-prefill", "llama-generate")
TOKENS = "tokens."

Step = tuple[int, int]      # (FlexGen layer, GPU batch)


@dataclass
class Structure:
    """The TaskGraph by FlexGen's layers and GPU batches."""

    layers: int                                  # FlexGen's L + 2, times the tokens
    batches: int                                 # GPU batches: the row blocks
    steps: list[Step] = field(default_factory=list)            # in run order
    computes: list[list[str]] = field(default_factory=list)    # per step, in TaskGraph order
    step_of: dict[str, int] = field(default_factory=dict)      # compute vertex -> step
    weights: list[list[str]] = field(default_factory=list)     # per layer, in first-use order
    tokens: list[str] = field(default_factory=list)            # host inputs besides weights
    role: dict[str, str] = field(default_factory=dict)  # compute -> cache/hidden/output/work
    readers: dict[str, list[int]] = field(default_factory=dict)  # tensor -> reader steps
    last_reader: dict[str, str] = field(default_factory=dict)   # tensor -> in TaskGraph order
    width: int = 0                               # FlexGen's layers, L + 2

    def layer_steps(self, layer: int) -> list[int]:
        """The steps of a layer, in order.

        Parameters
        ----------
        layer : int
            The layer, unrolled over the tokens.

        Returns
        -------
        list of int
        """
        return [s for s, (j, _) in enumerate(self.steps) if j == layer]

    @property
    def gen_len(self) -> int:
        """FlexGen's ``gen_len``: the tokens generated, the prefill's first among them."""
        return self.layers // self.width

    def token(self, step: int) -> int:
        """The token (0: the prefill) step ``step`` computes.

        Parameters
        ----------
        step : int
            The step.

        Returns
        -------
        int
        """
        return self.steps[step][0] // self.width

    def where(self, step: int) -> str:
        """Step ``step`` in FlexGen's terms, for messages.

        Parameters
        ----------
        step : int
            The step.

        Returns
        -------
        str
            Its layer and GPU batch (and token, on a generation).
        """
        j, k = self.steps[step]
        if self.gen_len == 1:
            return f"at layer {j}, GPU batch {k}"
        return f"at token {j // self.width}, layer {j % self.width}, GPU batch {k}"


def applies(graph: TaskGraph) -> None:
    """Raise PlanError unless ``graph`` is a one-GPU LLaMA prefill or generation.

    Parameters
    ----------
    graph : TaskGraph
        The computation: ``llama-prefill`` or ``llama-generate``, one GPU, no update.

    Raises
    ------
    PlanError
        Saying why.
    """
    if not graph.name.startswith(WORKLOADS) or not {"layers", "heads"} <= set(graph.meta):
        raise PlanError(f"flexgen plans LLaMA inference (llama-prefill, llama-generate): "
                        f"TaskGraph {graph.name!r} is not one")
    gpus = graph.gpus()
    if len(gpus) != 1:
        raise PlanError(f"flexgen offloads one GPU's model (its multi-GPU mode is pipeline "
                        f"parallel): TaskGraph {graph.name!r} runs on {len(gpus)} GPUs")
    update = next((t.id for t in graph if t.op in UPDATE_OPS), None)
    if update is not None:
        raise PlanError(f"flexgen plans inference: TaskGraph {graph.name!r} updates weights "
                        f"({update!r})")


def _layer(t: Task, decoders: int) -> int:
    """``t``'s layer, unrolled over the tokens (see the module's docstring)."""
    token = _TOKEN.match(t.id)
    id = t.id[token.end():] if token else t.id
    first = int(token.group(1)) * (decoders + 2) if token else 0
    m = _DECODER.match(id)
    if m:
        return first + int(m.group(1)) + 1
    if id.startswith("embed."):
        return first
    if id.startswith(("final_norm.", "logits.", "token.")):
        return first + decoders + 1
    raise PlanError(f"flexgen: vertex {t.id!r} belongs to none of the LLaMA model's layers")


def structure(graph: TaskGraph) -> Structure:
    """FlexGen's view of ``graph``.

    Parameters
    ----------
    graph : TaskGraph
        A LLaMA prefill or generation (:func:`applies`).

    Returns
    -------
    Structure

    Raises
    ------
    PlanError
        Naming a vertex in none of the model's layers or in no GPU batch.
    """
    decoders = int(graph.meta["layers"])
    step: dict[str, Step] = {}
    for t in graph:
        if t.kind != "compute":
            continue
        m = _ROW.search(t.id)
        if m:
            row = int(m.group(1))
        elif t.inputs and t.inputs[0] in step:
            row = step[t.inputs[0]][1]
        else:
            raise PlanError(f"flexgen: vertex {t.id!r} belongs to no GPU batch (row block)")
        step[t.id] = (_layer(t, decoders), row)
    steps = sorted(set(step.values()))
    width = decoders + 2
    st = Structure(width * (1 + int(graph.meta.get("gen", 0))), 1 + max(k for _, k in steps),
                   steps, width=width)
    number = {s: i for i, s in enumerate(steps)}
    st.computes = [[] for _ in steps]
    st.weights = [[] for _ in range(width)]
    seen: set[str] = set()
    for t in graph:
        if t.kind != "compute":
            continue
        s = st.step_of[t.id] = number[step[t.id]]
        st.computes[s].append(t.id)
        for u in t.inputs:
            st.readers.setdefault(u, []).append(s)
            st.last_reader[u] = t.id
            task = graph[u]
            if task.kind == "compute":
                if st.step_of[u] > s:
                    raise PlanError(f"flexgen: {t.id!r} runs before its input {u!r} in "
                                    f"FlexGen's layer order")
            elif u not in seen:
                seen.add(u)
                if task.device != HOST:
                    raise PlanError(f"flexgen: input {u!r} lives on {task.device}, not in "
                                    f"host RAM")
                if u.startswith(TOKENS):
                    st.tokens.append(u)
                else:
                    st.weights[steps[s][0] % width].append(u)
    for u, at in st.readers.items():
        st.readers[u] = sorted(set(at))
    for v, s in st.step_of.items():
        readers = st.readers.get(v, [])
        if _CACHE.match(v):
            st.role[v] = "cache"
        elif not readers:
            st.role[v] = "output"
        elif readers[-1] != s:
            st.role[v] = "hidden"
        else:
            st.role[v] = "work"
    return st


def seconds(graph: TaskGraph, machine: Machine, t: Task) -> float:
    """A kernel's seconds alone on the GPU, by the machine's cost model.

    Parameters
    ----------
    graph : TaskGraph
        The graph holding its inputs.
    machine : Machine
        The machine.
    t : Task
        The kernel.

    Returns
    -------
    float
    """
    touched = touched_bytes(t.op, t.bytes, [graph[u].bytes for u in t.inputs])
    return machine.duration(t.kind, t.device, t.bytes, t.flops, touched, t.time, t.op, t.dtype)
