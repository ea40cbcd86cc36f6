"""LLaMA prefill (first-token inference), the workload of TURNIP's experiments (Sec. 8, Figs.
10-12): a LLaMA decoder (Touvron et al. 2023) run over a prompt, tensor-parallel over ``gpus``
as in Megatron-LM (heads and the MLP's hidden dimension split across GPUs), with attention cut
into query/key blocks of ``block`` tokens.

The residual stream is cut into row blocks of ``block`` tokens, row block ``r`` owned by GPU
``r % gpus``; weights live in host RAM.  The ops per layer and row block, the all-reduces and
the outputs: docs/workloads.md ("LLaMA prefill").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..devices import gpu_name
from ..errors import SpecError
from ..ops import DTYPES, op_call, op_flops
from ..taskgraph import TaskGraph
from .registry import workload

Shape = tuple[int, ...]


@dataclass(frozen=True)
class LlamaConfig:
    """A LLaMA architecture (Touvron et al. 2023, Table 2; vocabulary 32000)."""

    layers: int
    dim: int
    heads: int
    ffn: int
    vocab: int = 32000
    dtype: str = "float16"

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


CONFIGS: dict[str, LlamaConfig] = {
    "7b": LlamaConfig(layers=32, dim=4096, heads=32, ffn=11008),
    "13b": LlamaConfig(layers=40, dim=5120, heads=40, ffn=13824),
    "65b": LlamaConfig(layers=80, dim=8192, heads=64, ffn=22016),
    "tiny": LlamaConfig(layers=2, dim=64, heads=4, ffn=172, vocab=128, dtype="float32"),
}
FLOATS = ("float16", "float32", "float64")
DEFAULT_BLOCK = 8192
"""Query/key block in tokens: one head's score block is then at most 128 MiB in float16, and
65B at 32K tokens on 8 GPUs is a graph of about 280k vertices (docs/workloads.md)."""


def llama_vertices(o: dict) -> int:
    """LLaMA's vertices: per layer and row block ``i`` (of ``nb`` per sequence), each head's
    q, k, v, their rotations, ``i + 1`` score and probability blocks, its statistics and
    output, and each GPU's share of the MLP, reductions and gathers.

    Parameters
    ----------
    o : dict
        The workload's options.

    Returns
    -------
    int
        The estimate; 0 for options the builder refuses.
    """
    config = CONFIGS.get(o["model"])
    if config is None or min(o["seq"], o["block"], o["batch"], o["gpus"]) <= 0:
        return 0
    layers, heads, batch, gpus = config.layers, config.heads, o["batch"], o["gpus"]
    nb = -(-o["seq"] // min(o["block"], o["seq"]))
    return (layers * batch * (heads * nb * (nb + 8) + 10 * gpus * nb)
            + layers * (3 * heads + 4 * gpus + 2) + batch * nb * (4 + gpus) + 10)


@workload("llama-prefill", vertices=llama_vertices)
def llama_prefill(model: str = "7b", seq: int = 1024, batch: int = 1, gpus: int = 1,
                  block: int = DEFAULT_BLOCK, dtype: str = "") -> TaskGraph:
    """First-token inference of LLaMA ``model`` (``7b``, ``13b``, ``65b`` or ``tiny``: 2 layers,
    dim 64, 4 heads, ffn 172, vocabulary 128) on ``batch`` prompts of ``seq`` tokens,
    tensor-parallel over ``gpus``, attention in query/key blocks of ``block`` tokens;
    ``dtype`` defaults to float16 (float32 for ``tiny``).

    Parameters
    ----------
    model : str
        ``7b``, ``13b``, ``65b`` or ``tiny``.
    seq : int
        Tokens per prompt.
    batch : int
        Prompts.
    gpus : int
        GPUs it is split over (dividing the heads and the ffn).
    block : int
        Tokens per query/key block of attention.
    dtype : str
        A float dtype; "" for the model's default.

    Returns
    -------
    TaskGraph

    Raises
    ------
    SpecError
        An unknown model or dtype, a count that is not a positive integer, or ``gpus`` that
        does not divide the heads or the ffn.
    """
    config, dtype = check_options("llama-prefill", model, seq, batch, gpus, block, dtype)
    return LlamaBuilder(config, model, seq, batch, gpus, min(block, seq), dtype).build()


def check_options(workload: str, model: str, seq: int, batch: int, gpus: int, block: int,
                  dtype: str) -> tuple[LlamaConfig, str]:
    """The model's configuration and the dtype (its default if "").

    Parameters
    ----------
    workload : str
        The workload's name, which an error names.
    model, seq, batch, gpus, block, dtype
        Its options, as :func:`llama_prefill` takes them.

    Returns
    -------
    tuple of (LlamaConfig, str)
        The configuration and the dtype.

    Raises
    ------
    SpecError
        Naming ``workload`` and the bad option.
    """
    config = CONFIGS.get(model)
    if config is None:
        raise SpecError(f"{workload}: unknown model {model!r}; known: {', '.join(CONFIGS)}")
    for key, value in dict(seq=seq, batch=batch, gpus=gpus, block=block).items():
        if type(value) is not int or value <= 0:
            raise SpecError(f"{workload}: {key} must be a positive integer, got {value!r}")
    for key, size in (("heads", config.heads), ("ffn", config.ffn)):
        if size % gpus:
            raise SpecError(f"{workload}: {model} has {key} {size}, not divisible by gpus "
                            f"({gpus})")
    dtype = dtype or config.dtype
    if dtype not in FLOATS:
        raise SpecError(f"{workload}: dtype must be one of {', '.join(FLOATS)}, got "
                        f"{dtype!r}")
    return config, dtype


class LlamaBuilder:
    """Adds the vertices in the order they would run (the planners' serial order): layer by
    layer, row block by row block."""

    def __init__(self, config: LlamaConfig, model: str, seq: int, batch: int, gpus: int,
                 block: int, dtype: str) -> None:
        self.c, self.gpus, self.dtype = config, gpus, dtype
        self.stats_dtype = "float64" if dtype == "float64" else "float32"
        self.starts = list(range(0, seq, block))
        self.sizes = [min(block, seq - s) for s in self.starts]
        self.batch = batch
        self.g = TaskGraph(name=f"llama-prefill-{model}", meta=dict(
            model=model, seq=seq, batch=batch, gpus=gpus, block=block, dtype=dtype,
            layers=config.layers, dim=config.dim, heads=config.heads, ffn=config.ffn,
            vocab=config.vocab))
        self.shapes: dict[str, Shape] = {}
        self.keys: dict[int, dict[tuple[int, int], tuple[str, str]]] = {}
        """Per layer, each (head, row block)'s rotated keys and values."""

    # -- vertices ---------------------------------------------------------------------
    def weight(self, id: str, shape: Shape, dtype: str | None = None,
               category: str = "weights") -> str:
        """A host-resident input, added on first use: a weight unless ``category`` (a batch's
        tokens and labels are activations).

        Parameters
        ----------
        id, shape
            The vertex and its shape.
        dtype, category
            Its dtype (default the model's) and category.

        Returns
        -------
        str
            ``id``.
        """
        if id not in self.g.tasks:
            dtype = dtype or self.dtype
            self.g.add_input(id, math.prod(shape) * DTYPES[dtype], shape=shape, dtype=dtype,
                             category=category)
            self.shapes[id] = shape
        return id

    def category(self, id: str, op: str) -> str:
        """The category of compute vertex ``id`` running ``op``: here every one is an
        activation (the LoRA builder's backward adds others).

        Parameters
        ----------
        id, op
            The vertex and its op.

        Returns
        -------
        str
            Its category.
        """
        return "activations"

    def compute(self, id: str, op: str, inputs: list[str], gpu: int, shape: Shape,
                dtype: str | None = None) -> str:
        """A compute vertex running ``op`` on ``inputs`` on GPU ``gpu``, its flops from the shapes.

        Parameters
        ----------
        id, op, inputs
            The vertex, its op and its input vertices in argument order.
        gpu, shape, dtype
            Its GPU's index, shape and dtype (default the model's).

        Returns
        -------
        str
            ``id``.
        """
        dtype = dtype or self.dtype
        flops = op_flops(op, shape, [self.shapes[u] for u in inputs])
        self.g.add_compute(id, op, inputs, gpu_name(gpu), math.prod(shape) * DTYPES[dtype],
                           flops=flops, shape=shape, dtype=dtype,
                           category=self.category(id, op))
        self.shapes[id] = shape
        return id

    def gather(self, source: str, owner: int) -> list[str]:
        """``source`` (on ``owner``) on every GPU: itself there, a transfer elsewhere.

        Parameters
        ----------
        source, owner
            The vertex and its GPU.

        Returns
        -------
        list of str
            The vertex holding it on each GPU, by index.
        """
        return [source if g == owner else self.send(source, g) for g in range(self.gpus)]

    def send(self, source: str, gpu: int) -> str:
        """A transfer vertex copying ``source`` to ``gpu``.

        Parameters
        ----------
        source, gpu
            The vertex copied and the GPU it goes to.

        Returns
        -------
        str
            The transfer's id.
        """
        t = self.g.add_transfer(f"{source}>gpu{gpu}", source, gpu_name(gpu))
        self.shapes[t.id] = self.shapes[source]
        return t.id

    def reduce(self, id: str, residual: str, partials: list[str], owner: int) -> str:
        """``residual + sum(partials)`` on ``owner``, the other GPUs' partials sent there.

        Parameters
        ----------
        id, residual
            The sum's vertex and the residual stream.
        partials, owner
            Each GPU's partial sum, by index, and the sum's GPU.

        Returns
        -------
        str
            ``id``.
        """
        inputs = [residual]
        for g, p in enumerate(partials):
            inputs.append(p if g == owner else self.send(p, owner))
        return self.compute(id, "add", inputs, owner, self.shapes[residual])

    # -- the model --------------------------------------------------------------------
    prefix = ""
    """Prepended to the ids of the compute vertices a layer adds (the LoRA builder's
    recomputation under checkpointing adds a layer's forward again, as ``re.L...``)."""

    @property
    def rows(self) -> list[tuple[int, int]]:
        """The row blocks: (sequence, block in the sequence), row block ``r`` at index r."""
        return [(s, i) for s in range(self.batch) for i in range(len(self.starts))]

    def owner(self, r: int) -> int:
        """The GPU that holds row block ``r``'s residual stream.

        Parameters
        ----------
        r : int
            The row block.

        Returns
        -------
        int
            Its GPU's index (``r`` modulo the GPUs).
        """
        return r % self.gpus

    def embed(self) -> tuple[dict[int, str], dict[int, list[str]]]:
        """Each row block's embedding (the residual stream) and its normalised copies.

        Returns
        -------
        tuple of (dict, dict)
            By row block, the embedding's vertex and the normalised input's vertex on each GPU.
        """
        x: dict[int, str] = {}            # row block -> residual stream, on its owner
        xn: dict[int, list[str]] = {}     # row block -> normalised input, per GPU
        for r, (_, i) in enumerate(self.rows):
            ids = self.weight(f"tokens.b{r}", (self.sizes[i],), "int32", "activations")
            x[r] = self.compute(f"embed.b{r}", "embedding",
                                [ids, self.weight("embed", (self.c.vocab, self.c.dim))],
                                self.owner(r), (self.sizes[i], self.c.dim))
            xn[r] = self.norm(f"L0.attn_in.b{r}", x[r], "L0.attn_norm", self.owner(r))
        return x, xn

    def build(self) -> TaskGraph:
        """The whole graph: the embeddings, then :meth:`forward` on every row block.

        Returns
        -------
        TaskGraph
            The graph built.
        """
        x, xn = self.embed()
        self.forward(list(range(len(self.rows))), x, xn)
        return self.g

    def forward(self, rows: list[int], x: dict[int, str], xn: dict[int, list[str]]
                ) -> dict[int, str]:
        """Every layer on row blocks ``rows``, layer by layer, then the final norm and the logits
        of each sequence's last row block.  Each layer's keys and values stay in ``self.keys``.

        Parameters
        ----------
        rows, x, xn
            The row blocks, and by row block its residual stream and its normalised input on each
            GPU (both updated in place).

        Returns
        -------
        dict of int to str
            The logits' vertex by sequence.
        """
        c, nb, P = self.c, len(self.starts), self.prefix
        logits: dict[int, str] = {}
        for layer in range(c.layers):
            keys = self.keys.setdefault(layer, {})
            for r in rows:
                s, i = self.rows[r]
                owner = self.owner(r)
                x[r] = self.block(layer, r, x[r], xn[r], keys)
                if layer + 1 < c.layers:
                    xn[r] = self.norm(f"{P}L{layer + 1}.attn_in.b{r}", x[r],
                                      f"L{layer + 1}.attn_norm", owner)
                elif i == nb - 1:
                    final = self.compute(f"{P}final_norm.b{r}", "rmsnorm",
                                         [x[r], self.weight("norm", (c.dim,))], owner,
                                         self.shapes[x[r]])
                    logits[s] = self.compute(f"{P}logits.s{s}", "linear",
                                             [final, self.weight("lm_head", (c.vocab, c.dim))],
                                             owner, (self.shapes[final][0], c.vocab))
        return logits

    def block(self, layer: int, r: int, x: str, xn: list[str],
              keys: dict[tuple[int, int], tuple[str, str]]) -> str:
        """Layer ``layer`` on row block ``r``: attention, its all-reduce into the residual, the MLP
        and its.

        Parameters
        ----------
        layer, r, x, xn
            The layer, the row block, its residual stream and its normalised input on each GPU.
        keys : dict
            The layer's rotated keys and values by (head, row block), added to.

        Returns
        -------
        str
            The layer's output.
        """
        s, i = self.rows[r]
        owner, L = self.owner(r), f"{self.prefix}L{layer}"
        partials = [self.attention(layer, r, s, i, g, xn[g], keys) for g in range(self.gpus)]
        x = self.reduce(f"{L}.attn_res.b{r}", x, partials, owner)
        h = self.norm(f"{L}.mlp_in.b{r}", x, f"L{layer}.mlp_norm", owner)
        partials = [self._mlp(layer, r, g, h[g]) for g in range(self.gpus)]
        return self.reduce(f"{L}.mlp_res.b{r}", x, partials, owner)

    def project(self, id: str, layer: int, kind: str, part: str, r: int, x: str, w: str,
                g: int, shape: Shape) -> str:
        """``x W^T`` on GPU ``g``: projection ``kind`` (q, k, v, gate, up, down) of head or
        GPU slice ``part`` (``h3``, ``g1``) on row block ``r``.

        Parameters
        ----------
        id, layer, kind, part, r
            The vertex, the layer, the projection, its head or slice and the row block.
        x, w, g, shape
            The input, the weight, the GPU and the output's shape.

        Returns
        -------
        str
            ``id``.
        """
        return self.compute(id, "linear", [x, w], g, shape)

    def norm(self, id: str, x: str, gain: str, owner: int) -> list[str]:
        """RMSNorm of ``x`` on its owner, then on every GPU.

        Parameters
        ----------
        id, x, gain, owner
            The norm's vertex, its input, the gain's weight and the GPU of ``x``.

        Returns
        -------
        list of str
            The normalised vertex on each GPU (:meth:`gather`).
        """
        y = self.compute(id, "rmsnorm", [x, self.weight(gain, (self.c.dim,))], owner,
                         self.shapes[x])
        return self.gather(y, owner)

    def attention(self, layer: int, r: int, s: int, i: int, g: int, xn: str,
                  keys: dict[tuple[int, int], tuple[str, str]]) -> str:
        """GPU ``g``'s heads on row block ``r`` (block ``i`` of sequence ``s``): their
        projections, blocked causal attention, and the partial output projection.

        Parameters
        ----------
        layer, r, s, i, g : int
            The layer, the row block, its sequence and block there, and the GPU.
        xn : str
            The normalised input on ``g``.
        keys : dict
            The layer's rotated keys and values by (head, row block), added to.

        Returns
        -------
        str
            The partial output projection.
        """
        nb, q0 = len(self.starts), self.starts[i]
        queries = self.qkv(layer, r, g, xn, self.sizes[i], q0)
        for h, (_, kr, v) in queries.items():
            keys[h, r] = (kr, v)
        outs = [self.attend(layer, r, g, h, q, q0,
                            [(f"k{s * nb + j}", self.starts[j], *keys[h, s * nb + j])
                             for j in range(i + 1)])
                for h, (q, _, _) in queries.items()]
        return self.attn_out(layer, r, g, outs)

    def qkv(self, layer: int, r: int, g: int, xn: str, rows: int, q0: int
            ) -> dict[int, tuple[str, str, str]]:
        """GPU ``g``'s heads' projections of row block ``r``: per head, the rotated query and key
        and the value.

        Parameters
        ----------
        layer, r, g, xn
            The layer, the row block, the GPU and the normalised input there.
        rows, q0 : int
            The row block's tokens and its first position.

        Returns
        -------
        dict of int to tuple of (str, str, str)
            The vertices by head.
        """
        c = self.c
        dh, per_gpu = c.head_dim, c.heads // self.gpus
        W, L = f"L{layer}", f"{self.prefix}L{layer}"
        out = {}
        for h in range(g * per_gpu, (g + 1) * per_gpu):
            proj = {}
            for name in ("q", "k", "v"):
                w = self.weight(f"{W}.w{name}.h{h}", (dh, c.dim))
                proj[name] = self.project(f"{L}.{name}.h{h}.b{r}", layer, name, f"h{h}", r,
                                          xn, w, g, (rows, dh))
            rope = op_call("rotary", offset=q0)
            out[h] = (self.compute(f"{L}.qr.h{h}.b{r}", rope, [proj["q"]], g, (rows, dh)),
                      self.compute(f"{L}.kr.h{h}.b{r}", rope, [proj["k"]], g, (rows, dh)),
                      proj["v"])
        return out

    def attend(self, layer: int, r: int, g: int, h: int, query: str, q0: int,
               blocks: list[tuple[str, int, str, str]]) -> str:
        """Head ``h``'s attention of ``query`` over the key blocks: scores, the softmax's
        statistics and probabilities, and ``sum_j P_j V_j``.

        Parameters
        ----------
        layer, r, g, h : int
            The layer, the row block, the GPU and the head.
        query : str
            The rotated query.
        q0 : int
            Its first position.
        blocks : list of tuple of (str, int, str, str)
            ``(name, first position, keys, values)`` of each key block, contiguous from
            position 0.

        Returns
        -------
        str
            The head's output.
        """
        L, rows = f"{self.prefix}L{layer}", self.shapes[query][0]
        scores = [self.compute(f"{L}.S.h{h}.b{r}.{kb}", "attn_scores", [query, k], g,
                               (rows, self.shapes[k][0]))
                  for kb, _, k, _ in blocks]
        stats = self.compute(f"{L}.stats.h{h}.b{r}", op_call("softmax_stats", q0=q0),
                             scores, g, (rows, 2), self.stats_dtype)
        probs = [self.compute(f"{L}.P.h{h}.b{r}.{kb}",
                              op_call("causal_softmax", q0=q0, k0=k0),
                              [score, stats], g, self.shapes[score])
                 for (kb, k0, _, _), score in zip(blocks, scores)]
        return self.compute(f"{L}.O.h{h}.b{r}", "attn_values",
                            probs + [v for _, _, _, v in blocks], g,
                            (rows, self.c.head_dim))

    def attn_out(self, layer: int, r: int, g: int, outs: list[str]) -> str:
        """GPU ``g``'s heads' outputs ``outs`` times its columns of ``W_o``: a partial sum.

        Parameters
        ----------
        layer, r, g, outs
            The layer, the row block, the GPU and the heads' outputs there.

        Returns
        -------
        str
            The partial sum's vertex.
        """
        c = self.c
        wo = self.weight(f"L{layer}.wo.g{g}", (c.dim, c.heads // self.gpus * c.head_dim))
        return self.compute(f"{self.prefix}L{layer}.attn_out.g{g}.b{r}", "linear", [*outs, wo],
                            g, (self.shapes[outs[0]][0], c.dim))

    def _mlp(self, layer: int, r: int, g: int, xn: str) -> str:
        """GPU ``g``'s slice of the SwiGLU MLP on row block ``r``: a partial sum."""
        act = self.mlp_hidden(layer, r, g, xn)
        c, W, L = self.c, f"L{layer}", f"{self.prefix}L{layer}"
        return self.project(f"{L}.mlp_out.g{g}.b{r}", layer, "down", f"g{g}", r, act,
                            self.weight(f"{W}.w_down.g{g}", (c.dim, c.ffn // self.gpus)), g,
                            (self.shapes[xn][0], c.dim))

    def mlp_hidden(self, layer: int, r: int, g: int, xn: str) -> str:
        """GPU ``g``'s slice of the MLP's hidden layer ``silu(x W_gate^T) * x W_up^T``.

        Parameters
        ----------
        layer, r, g, xn
            The layer, the row block, the GPU and the normalised input there.

        Returns
        -------
        str
            The hidden layer's vertex.
        """
        c, W, L = self.c, f"L{layer}", f"{self.prefix}L{layer}"
        hidden = c.ffn // self.gpus
        rows = self.shapes[xn][0]
        gate = self.project(f"{L}.gate.g{g}.b{r}", layer, "gate", f"g{g}", r, xn,
                            self.weight(f"{W}.w_gate.g{g}", (hidden, c.dim)), g, (rows, hidden))
        up = self.project(f"{L}.up.g{g}.b{r}", layer, "up", f"g{g}", r, xn,
                          self.weight(f"{W}.w_up.g{g}", (hidden, c.dim)), g, (rows, hidden))
        return self.compute(f"{L}.swiglu.g{g}.b{r}", "swiglu", [gate, up], g, (rows, hidden))
