"""FlexGen's offloading policy for inference, registered as ``flexgen`` (Sheng et al.,
"FlexGen: High-Throughput Generative Inference of Large Language Models with a Single GPU",
ICML 2023; FMInference/FlexGen@19753bc: ``flexgen/flex_opt.py`` for the policy and
the block schedule, ``experimental/cost_model.py`` for the cost model and the LP).

The policy, the zig-zag block schedule (:mod:`.schedule`), the policy search by the LP
(:mod:`offloadlab.ilp.flexgen`) and what the MemGraph records: docs/deployed.md, FlexGen.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import PlanError
from ...core.machine import Machine
from ...core.memgraph import MemGraph
from ...core.taskgraph import TaskGraph
from ...ilp.flexgen import CostModel, best
from ..registry import Hooks, Options, option, register
from .schedule import Plan, Policy, lay_out, schedule
from .structure import Structure, applies, seconds, structure

SEARCH = -1.0
ATTEMPTS = 16       # LPs within less memory before giving up
RELAYOUTS = 8       # layouts within less memory where fragmentation defeats the allocator


@dataclass(frozen=True)
class FlexGenOptions(Options):
    w_gpu_percent: float = option(SEARCH, "percent of each layer's weights held on the GPU, "
                                          "the rest in host RAM (-1: FlexGen's LP chooses)")
    cache_gpu_percent: float = option(SEARCH, "percent of the KV cache held on the GPU (-1: "
                                              "the LP chooses; a GPU batch is one sequence, "
                                              "so below 100 it is all in host RAM)")
    act_gpu_percent: float = option(SEARCH, "percent of the hidden states held on the GPU: "
                                            "0 or 100, as FlexGen's runtime (-1: the LP "
                                            "chooses)")
    overlap: bool = option(True, "overlap I/O and compute (the zig-zag block schedule); "
                                 "false: FlexGen's generation_loop_normal")

    def __post_init__(self) -> None:
        for name in ("w_gpu_percent", "cache_gpu_percent", "act_gpu_percent"):
            value = getattr(self, name)
            if type(value) not in (int, float) or not (value == SEARCH or 0 <= value <= 100):
                raise PlanError(f"flexgen: {name} must be a percent from 0 to 100 (or -1: "
                                f"the LP chooses), got {value!r}")
        if self.act_gpu_percent not in (SEARCH, 0, 100):
            raise PlanError(f"flexgen: act_gpu_percent must be 0 or 100 (FlexGen keeps all "
                            f"hidden states in one place), got {self.act_gpu_percent!r}")

    def fixed(self) -> dict[str, float]:
        """The fractions given, by the LP's names.

        Returns
        -------
        dict of str to float
            ``wg``, ``cg``, ``hg`` for the percents given (not -1), as fractions.
        """
        given = {"wg": self.w_gpu_percent, "cg": self.cache_gpu_percent,
                 "hg": self.act_gpu_percent}
        return {k: v / 100 for k, v in given.items() if v != SEARCH}


def cost_model(graph: TaskGraph, machine: Machine, st: Structure) -> CostModel:
    """FlexGen's cost model with its constants measured on ``graph`` and ``machine``.

    Parameters
    ----------
    graph : TaskGraph
        A ``llama-prefill`` or ``llama-generate`` TaskGraph.
    machine : Machine
        The machine whose kernels' times and host link rates are measured.
    st : Structure
        The graph's FlexGen layers, steps and roles.

    Returns
    -------
    CostModel
    """
    n = st.layers
    weights, cache, reads, hidden, hidden_in = ([0] * n for _ in range(5))
    compute = [0.0] * n
    per_step = [0] * len(st.steps)
    work = [0] * len(st.steps)
    for j in range(n):
        weights[j] = sum(graph[w].bytes for w in st.weights[j % st.width])
    for s, ids in enumerate(st.computes):
        j, live = st.steps[s][0], 0
        for t in ids:
            task = graph[t]
            compute[j] += seconds(graph, machine, task)
            role, size = st.role[t], task.bytes
            if role == "cache":
                cache[j] += size
                per_step[s] += size
                own = [m for m in st.readers[t] if st.token(m) == st.token(s)]
                if own and own[-1] > s + 1:
                    reads[j] += size      # read back by its token's later GPU batches
                for layer in sorted({st.steps[m][0] for m in st.readers[t]
                                     if st.token(m) > st.token(s)}):
                    reads[layer] += size  # read back by each later token's step
            elif role == "hidden":
                hidden[j] += size
                hidden_in[st.steps[st.readers[t][0]][0]] += size
            elif role == "work":
                live += size
                work[s] = max(work[s], live)
            for u in set(task.inputs):
                if st.role.get(u) == "work" and st.last_reader[u] == t:
                    live -= graph[u].bytes
    batch = max((sum(graph[t].bytes for t in ids if st.role[t] == "hidden")
                 for ids in st.computes), default=0)
    workspace = max(work[s] + per_step[s] + (per_step[s - 1] if s else 0)
                    for s in range(len(st.steps)))
    return CostModel(tuple(weights), tuple(cache), tuple(reads), tuple(hidden),
                     tuple(hidden_in), tuple(compute), sum(graph[u].bytes for u in st.tokens),
                     batch, workspace, machine.host_rate("h2d"), machine.host_rate("d2h"),
                     st.gen_len)


def corners(options: FlexGenOptions) -> list[dict[str, float]]:
    """The LP's choices: the given fractions, and each placement the runtime realises.

    Each placement of the cache and the hidden states (all on the GPU or none) where not
    given.

    Parameters
    ----------
    options : FlexGenOptions
        The percents given.

    Returns
    -------
    list of dict of str to float
        The fixed fractions of each LP to solve.
    """
    fixed = options.fixed()
    choices = [fixed]
    for name in ("cg", "hg"):
        if name not in fixed:
            choices = [{**c, name: v} for c in choices for v in (0.0, 1.0)]
    return choices


def _policy(fractions: dict[str, float], overlap: bool) -> Policy:
    return Policy(round(fractions["wg"] * 100, 2), round(fractions["cg"] * 100, 2),
                  round(fractions["hg"] * 100, 2), overlap)


def _plan(graph: TaskGraph, machine: Machine, st: Structure, policy: Policy) -> Plan:
    """The policy's schedule laid out on the GPU.  Where the peak fits but the allocator's
    free memory is too fragmented, the layout is tried again within less memory (down to
    the peak, :data:`RELAYOUTS` times): the allocator's choices depend on the room it has,
    and a layout within less fits the GPU as well."""
    gpu, cap = graph.gpus()[0], machine.gpu_memory
    ops = schedule(graph, st, policy, gpu)
    plan = lay_out(graph, ops, gpu, cap)
    for k in range(RELAYOUTS, 0, -1):
        if plan.mg is not None or plan.peak > cap:
            break
        plan = lay_out(graph, ops, gpu, plan.peak + (cap - plan.peak) * (k - 1) // RELAYOUTS)
    return plan


def _refuse(graph: TaskGraph, machine: Machine, st: Structure, policy: Policy, plan: Plan,
            what: str) -> PlanError:
    gpu, cap = graph.gpus()[0], machine.gpu_memory
    where = "at start-up" if plan.peak_step < 0 else st.where(plan.peak_step)
    settings = (f"w_gpu_percent={policy.w_gpu_percent:g}, cache_gpu_percent="
                f"{policy.cache_gpu_percent:g}, act_gpu_percent={policy.act_gpu_percent:g}")
    if plan.peak > cap:
        return PlanError(f"flexgen: {what} ({settings}) needs {plan.peak} bytes on {gpu} "
                         f"{where}, {plan.peak - cap} more than its capacity of {cap}")
    return PlanError(f"flexgen: {what} ({settings}) needs {plan.peak} bytes on {gpu} {where}, "
                     f"but its free memory is too fragmented to lay them out in {cap}")


@register("flexgen", FlexGenOptions, applies=applies)
def flexgen(graph: TaskGraph, machine: Machine, options: FlexGenOptions,
            hooks: Hooks) -> MemGraph:
    """FlexGen (Sheng et al. 2023): the policy's shares of weights, KV cache and hidden states
    on the GPU, the rest in host RAM, run in the zig-zag block schedule that loads the next
    layer's weights while the current one computes; shares not given are chosen by FlexGen's
    LP over its cost model (PuLP).

    Parameters
    ----------
    graph : TaskGraph
        A one-GPU ``llama-prefill`` or ``llama-generate`` TaskGraph.
    machine : Machine
        The machine it runs on.
    options : FlexGenOptions
        The policy's percents given (-1: the LP chooses), and ``overlap``.
    hooks : Hooks
        Unused: FlexGen's schedule is fixed by its policy.

    Returns
    -------
    MemGraph
        The plan, its policy in ``graph["options"]`` and ``graph["policy"]``.

    Raises
    ------
    PlanError
        When the policy given, or the one holding least on the GPU, does not fit, naming the
        bytes it needs, where, and the shortfall.
    """
    st = structure(graph)
    fixed = options.fixed()
    if len(fixed) == 3:
        policy = _policy(fixed, options.overlap)
        plan = _plan(graph, machine, st, policy)
        if plan.mg is None:
            raise _refuse(graph, machine, st, policy, plan, "the policy")
        return _record(plan.mg, policy, st, None)
    model = cost_model(graph, machine, st)
    cap = machine.gpu_memory
    budget = float(cap)
    for _ in range(ATTEMPTS):
        found = best(model, budget, corners(options))
        if found is None:
            break
        policy = _policy({"wg": found.wg, "cg": found.cg, "hg": found.hg}, options.overlap)
        plan = _plan(graph, machine, st, policy)
        if plan.mg is not None:
            return _record(plan.mg, policy, st, found.seconds)
        budget -= max(plan.peak - cap, cap // 64)
    # the LP's memory model found nothing: the policy holding least on the GPU, if it fits
    fractions = {"wg": 0.0, "cg": 0.0, "hg": 0.0, **fixed}
    least = _policy(fractions, options.overlap)
    plan = _plan(graph, machine, st, least)
    if plan.mg is not None:
        return _record(plan.mg, least, st, model.seconds(**fractions))
    raise _refuse(graph, machine, st, least, plan,
                  "no policy fits: the one holding least on the GPU")


def _record(mg: MemGraph, policy: Policy, st: Structure, seconds: float | None) -> MemGraph:
    """The policy as the plan's options, and in full (with the cost model's seconds when the
    LP chose it) as ``graph["policy"]``."""
    mg.graph["options"] = policy.options()
    mg.graph["policy"] = policy.flexgen(st.batches)
    if seconds is not None:
        mg.graph["policy"]["cost_model_seconds"] = seconds
    return mg
