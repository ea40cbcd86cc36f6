"""LoRA fine-tuning of LLaMA, the training workload of TURNIP's and DISCO's experiments (TURNIP
Sec. 8 (2), Fig. 13; DISCO Fig. 14): forward and backward of one batch of a LLaMA decoder with
rank-16 LoRA adapters (Hu et al. 2021) on the Q, K, V and feed-forward matrices, the base
weights frozen, activation checkpointing, a cross-entropy loss and an optimizer step of every
adapter.

The forward pass is :mod:`.llama`'s prefill graph with every projection a ``lora_linear``; the
backward pass runs the layers in reverse.  How the adapters are split over the GPUs and which
ops each pass uses: docs/workloads.md ("LLaMA LoRA training").
"""

from __future__ import annotations

from collections import defaultdict

from ..errors import SpecError
from ..ops import op_call
from ..taskgraph import TaskGraph
from .llama import DEFAULT_BLOCK, LlamaBuilder, LlamaConfig, Shape, check_options, llama_vertices
from .registry import workload

OPTIMIZERS = {"adam": "adam_update", "sgd": "sgd_update"}


@workload("llama-lora-train", vertices=lambda o: 5 * llama_vertices(o))   # and the backward
def llama_lora_train(model: str = "7b", seq: int = 1024, batch: int = 1, gpus: int = 1,
                     block: int = DEFAULT_BLOCK, dtype: str = "float32", rank: int = 16,
                     checkpoint: bool = True, optimizer: str = "adam") -> TaskGraph:
    """One LoRA training step of LLaMA ``model`` (as ``llama-prefill``) on ``batch`` sequences
    of ``seq`` tokens: adapters of rank ``rank`` on Q, K, V, gate, up and down, activation
    checkpointing (``checkpoint``), cross-entropy loss, ``optimizer`` (adam or sgd) step of
    the adapters; float32 as in the papers (TURNIP Sec. 8: "single precision").

    Parameters
    ----------
    model : str
        ``7b``, ``13b``, ``65b`` or ``tiny``.
    seq : int
        Tokens per sequence.
    batch : int
        Sequences.
    gpus : int
        GPUs it is split over.
    block : int
        Tokens per query/key block of attention.
    dtype : str
        A float dtype.
    rank : int
        The adapters' rank.
    checkpoint : bool
        Recompute the forward's activations in the backward.
    optimizer : str
        ``adam`` or ``sgd``.

    Returns
    -------
    TaskGraph

    Raises
    ------
    SpecError
        A bad value, as for ``llama-prefill``, or a bad rank, checkpoint or optimizer.
    """
    name = "llama-lora-train"
    config, dtype = check_options(name, model, seq, batch, gpus, block, dtype)
    if type(rank) is not int or rank <= 0:
        raise SpecError(f"{name}: rank must be a positive integer, got {rank!r}")
    if optimizer not in OPTIMIZERS:
        raise SpecError(f"{name}: optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                        f"{optimizer!r}")
    if type(checkpoint) is not bool:
        raise SpecError(f"{name}: checkpoint must be true or false, got {checkpoint!r}")
    builder = _LoraBuilder(config, model, seq, batch, gpus, min(block, seq), dtype, rank,
                           checkpoint, OPTIMIZERS[optimizer])
    return builder.build()


class _LoraBuilder(LlamaBuilder):
    """The prefill builder with adapters on its projections, a loss, and the backward pass."""

    def __init__(self, config: LlamaConfig, model: str, seq: int, batch: int, gpus: int,
                 block: int, dtype: str, rank: int, checkpoint: bool, update: str) -> None:
        super().__init__(config, model, seq, batch, gpus, block, dtype)
        self.rank, self.checkpoint, self.update = rank, checkpoint, update
        self.g.name = f"llama-lora-train-{model}"
        self.g.meta.update(rank=rank, checkpoint=checkpoint, optimizer=update.split("_")[0],
                           loss="cross_entropy")
        self.grads: dict[str, list[str]] = defaultdict(list)    # adapter -> gradient parts

    def category(self, id: str, op: str) -> str:
        """Forward vertices are activations, backward ones gradients, but a layer's forward
        recomputed under checkpointing (``re.L...``: scratch the backward drops) is workspace
        and an optimizer update writes a weight."""
        if op == self.update:
            return "weights"
        if id.startswith("re."):
            return "workspace"
        return "gradients" if "forward" in self.g.meta else "activations"

    # -- adapters -----------------------------------------------------------------------
    def adapter_a(self, layer: int, kind: str, g: int) -> str:
        """``A`` (rank, in) of projection ``kind``: one per layer, the down projection's
        split by its input columns (GPU ``g``'s slice of the hidden dimension)."""
        if kind == "down":
            return self.weight(f"L{layer}.lora_A.down.g{g}", (self.rank, self.c.ffn // self.gpus))
        return self.weight(f"L{layer}.lora_A.{kind}", (self.rank, self.c.dim))

    def adapter_b(self, layer: int, kind: str, part: str, out: int) -> str:
        """``B`` (out, rank): per head or GPU slice like ``W``; the down projection's whole."""
        if kind == "down":
            return self.weight(f"L{layer}.lora_B.down", (self.c.dim, self.rank))
        return self.weight(f"L{layer}.lora_B.{kind}.{part}", (out, self.rank))

    def u_id(self, layer: int, kind: str, g: int, r: int) -> str:
        return f"{self.prefix}L{layer}.u_{kind}.g{g}.b{r}"

    def lora_u(self, layer: int, kind: str, g: int, r: int, x: str) -> str:
        """``u = x A^T`` of adapter ``kind`` on GPU ``g`` and row block ``r``, added once."""
        u = self.u_id(layer, kind, g, r)
        if u not in self.g.tasks:
            self.compute(u, "linear", [x, self.adapter_a(layer, kind, g)], g,
                         (self.shapes[x][0], self.rank))
        return u

    def project(self, id: str, layer: int, kind: str, part: str, r: int, x: str, w: str,
                g: int, shape: Shape) -> str:
        """``x W^T + u B^T``, ``u = x A^T`` added on its GPU's first use."""
        u = self.lora_u(layer, kind, g, r, x)
        b = self.adapter_b(layer, kind, part, shape[1])
        return self.compute(id, "lora_linear", [x, w, u, b], g, shape)

    # -- the step -----------------------------------------------------------------------
    def build(self) -> TaskGraph:
        c = self.c
        x, xn = self.embed()
        inputs: list[dict[int, str]] = []            # layer -> row block -> its input
        for layer in range(c.layers):
            inputs.append(dict(x))
            keys: dict[tuple[int, int], tuple[str, str]] = {}
            for r in range(len(self.rows)):
                x[r] = self.block(layer, r, x[r], xn[r], keys)
                if layer + 1 < c.layers:
                    xn[r] = self.norm(f"L{layer + 1}.attn_in.b{r}", x[r],
                                      f"L{layer + 1}.attn_norm", self.owner(r))
        dx = self.loss(x)
        for layer in reversed(range(c.layers)):
            dx = self.layer_backward(layer, inputs[layer], dx)
        return self.g

    def loss(self, x: dict[int, str]) -> dict[int, str]:
        """Final norm, logits and cross-entropy of every row block, the loss summed on GPU 0
        (``meta["forward"]`` counts the compute vertices up to here); then the gradients of
        the last layer's outputs."""
        c, tokens = self.c, self.batch * sum(self.sizes)
        parts, logits, labels = [], {}, {}
        for r, (_, i) in enumerate(self.rows):
            owner = self.owner(r)
            final = self.compute(f"final_norm.b{r}", "rmsnorm",
                                 [x[r], self.weight("norm", (c.dim,))], owner, self.shapes[x[r]])
            logits[r] = self.compute(f"logits.b{r}", "linear",
                                     [final, self.weight("lm_head", (c.vocab, c.dim))], owner,
                                     (self.sizes[i], c.vocab))
            labels[r] = self.weight(f"labels.b{r}", (self.sizes[i],), "int32", "activations")
            part = self.compute(f"loss.b{r}", op_call("cross_entropy", tokens=tokens),
                                [logits[r], labels[r]], owner, (1,))
            parts.append(part if owner == 0 else self.send(part, 0))
        self.compute("loss", "add", parts, 0, (1,))
        self.g.meta["forward"] = sum(t.kind == "compute" for t in self.g)
        dx = {}
        for r in range(len(self.rows)):
            owner = self.owner(r)
            dlogits = self.compute(f"d.logits.b{r}",
                                   op_call("cross_entropy_backward", tokens=tokens),
                                   [logits[r], labels[r]], owner, self.shapes[logits[r]])
            dfinal = self.compute(f"d.final_norm.b{r}", "linear_dx",
                                  [dlogits, "lm_head"], owner, self.shapes[x[r]])
            dx[r] = self.compute(f"d.L{c.layers - 1}.out.b{r}", "rmsnorm_backward",
                                 [x[r], "norm", dfinal], owner, self.shapes[x[r]])
        return dx

    def layer_backward(self, layer: int, x_in: dict[int, str],
                       dy: dict[int, str]) -> dict[int, str]:
        """The backward of layer ``layer`` (inputs ``x_in``, output gradients ``dy`` by row
        block), recomputing its forward first under checkpointing; returns the gradients of
        its inputs (none for layer 0: nothing below it trains) after updating its adapters."""
        if self.checkpoint:
            self.prefix = "re."
            keys: dict[tuple[int, int], tuple[str, str]] = {}
            for r, (s, i) in enumerate(self.rows):
                self.recompute(layer, r, s, i, x_in[r], keys)
        dmid = {r: self.mlp_backward(layer, r, dy[r]) for r in range(len(self.rows))}
        dx = self.attention_backward(layer, x_in, dmid)
        for adapter in sorted(a for a in self.grads if a.startswith(f"L{layer}.")):
            self.step(layer, adapter, self.grads.pop(adapter))
        self.prefix = ""
        return dx

    def recompute(self, layer: int, r: int, s: int, i: int, x: str,
                  keys: dict[tuple[int, int], tuple[str, str]]) -> None:
        """Layer ``layer``'s forward on row block ``r`` again from its input ``x``, up to
        what the backward reads: not the down projection and the residual add after it."""
        owner, L = self.owner(r), f"re.L{layer}"
        xn = self.norm(f"{L}.attn_in.b{r}", x, f"L{layer}.attn_norm", owner)
        partials = [self.attention(layer, r, s, i, g, xn[g], keys) for g in range(self.gpus)]
        x = self.reduce(f"{L}.attn_res.b{r}", x, partials, owner)
        h = self.norm(f"{L}.mlp_in.b{r}", x, f"L{layer}.mlp_norm", owner)
        for g in range(self.gpus):
            self.lora_u(layer, "down", g, r, self.mlp_hidden(layer, r, g, h[g]))

    def at(self, id: str, g: int, owner: int) -> str:
        """Tensor ``id`` of ``owner`` as GPU ``g`` has it (the forward's gathered copy)."""
        return id if g == owner else f"{id}>gpu{g}"

    def grad(self, adapter: str, part: str) -> None:
        self.grads[adapter].append(part)

    def mlp_backward(self, layer: int, r: int, dy: str) -> str:
        """The MLP's backward on row block ``r``: adapters' gradient parts, and the gradient
        of the attention's residual output (on the owner)."""
        c, owner = self.c, self.owner(r)
        P, W, D = f"{self.prefix}L{layer}", f"L{layer}", f"d.L{layer}"
        rows, hidden = self.shapes[dy][0], c.ffn // self.gpus
        dys = self.gather(dy, owner)
        parts = []
        for g in range(self.gpus):
            xn = self.at(f"{P}.mlp_in.b{r}", g, owner)
            gate, up = f"{P}.gate.g{g}.b{r}", f"{P}.up.g{g}.b{r}"
            act, u_down = f"{P}.swiglu.g{g}.b{r}", self.u_id(layer, "down", g, r)
            a_down, b_down = f"{W}.lora_A.down.g{g}", f"{W}.lora_B.down"
            du_down = self.compute(f"{D}.u_down.g{g}.b{r}", "linear_dx", [dys[g], b_down], g,
                                   (rows, self.rank))
            self.grad(b_down, self.compute(f"{D}.B_down.g{g}.b{r}", "linear_dw",
                                           [dys[g], u_down], g, (c.dim, self.rank)))
            self.grad(a_down, self.compute(f"{D}.A_down.g{g}.b{r}", "linear_dw",
                                           [du_down, act], g, (self.rank, hidden)))
            dact = self.compute(f"{D}.swiglu.g{g}.b{r}", "linear_dx",
                                [dys[g], du_down, f"{W}.w_down.g{g}", a_down], g, (rows, hidden))
            dgate = self.compute(f"{D}.gate.g{g}.b{r}", "swiglu_dgate", [gate, up, dact], g,
                                 (rows, hidden))
            dup = self.compute(f"{D}.up.g{g}.b{r}", "swiglu_dup", [gate, up, dact], g,
                               (rows, hidden))
            parts.append(self.lora_backward(layer, r, g, xn, [("gate", f"g{g}", dgate),
                                                               ("up", f"g{g}", dup)]))
        dh = self.compute(f"{D}.mlp_in.b{r}", "add", [p if g == owner else self.send(p, owner)
                                                       for g, p in enumerate(parts)],
                          owner, self.shapes[dy])
        dn = self.compute(f"{D}.mlp_norm.b{r}", "rmsnorm_backward",
                          [f"{P}.attn_res.b{r}", f"{W}.mlp_norm", dh], owner, self.shapes[dy])
        return self.compute(f"{D}.mid.b{r}", "add", [dy, dn], owner, self.shapes[dy])

    def lora_backward(self, layer: int, r: int, g: int, x: str,
                      grads: list[tuple[str, str, str]], need_dx: bool = True) -> str:
        """Projections of ``x`` on GPU ``g`` with output gradients ``(kind, part, dY)``: the
        adapters' gradient parts (``dB = dY^T u``, ``du = sum dY B``, ``dA = du^T x``) and, if
        ``need_dx``, GPU ``g``'s part of ``dx = sum dY W + sum du A`` (else "")."""
        W, D = f"L{layer}", f"d.L{layer}"
        rows = self.shapes[x][0]
        dus, ws, adapters_a = [], [], []
        for kind in dict.fromkeys(k for k, _, _ in grads):
            mine = [(part, dY) for k, part, dY in grads if k == kind]
            u = self.u_id(layer, kind, g, r)
            bs = [f"{W}.lora_B.{kind}.{part}" for part, _ in mine]
            for b, (_, dY) in zip(bs, mine):
                self.grad(b, self.compute(f"{D}.B_{b.split('.', 2)[2]}.b{r}.g{g}", "linear_dw",
                                          [dY, u], g, (self.shapes[dY][1], self.rank)))
            du = self.compute(f"{D}.u_{kind}.g{g}.b{r}", "linear_dx",
                              [dY for _, dY in mine] + bs, g, (rows, self.rank))
            a = f"{W}.lora_A.{kind}"
            self.grad(a, self.compute(f"{D}.A_{kind}.g{g}.b{r}", "linear_dw", [du, x], g,
                                      (self.rank, self.c.dim)))
            dus.append(du)
            adapters_a.append(a)
            ws += [f"{W}.w{kind}.{part}" if kind in "qkv" else f"{W}.w_{kind}.{part}"
                   for part, _ in mine]
        if not need_dx:
            return ""
        return self.compute(f"{D}.x_{'attn' if grads[0][0] in 'qkv' else 'mlp'}.g{g}.b{r}",
                            "linear_dx", [dY for _, _, dY in grads] + dus + ws + adapters_a,
                            g, self.shapes[x])

    def attention_backward(self, layer: int, x_in: dict[int, str],
                           dmid: dict[int, str]) -> dict[int, str]:
        """Attention's backward, sequence by sequence: dQ per query block, dK and dV per key
        block over the query blocks at or after it; returns the layer's input gradients."""
        c, nb = self.c, len(self.starts)
        dh, per_gpu = c.head_dim, c.heads // self.gpus
        P, W, D = f"{self.prefix}L{layer}", f"L{layer}", f"d.L{layer}"
        dx: dict[int, str] = {}
        for s in range(self.batch):
            seq_rows = [s * nb + i for i in range(nb)]
            ds: dict[tuple[int, int, int], str] = {}        # (head, query row, key row) -> dS
            do: dict[tuple[int, int], str] = {}             # (head, row) -> dO
            dq: dict[tuple[int, int], str] = {}
            for i, r in enumerate(seq_rows):
                owner, rows = self.owner(r), self.sizes[i]
                dys = self.gather(dmid[r], owner)
                for g in range(self.gpus):
                    for local, h in enumerate(range(g * per_gpu, (g + 1) * per_gpu)):
                        do[h, r] = self.compute(f"{D}.O.h{h}.b{r}",
                                                op_call("linear_dx", col0=local * dh),
                                                [dys[g], f"{W}.wo.g{g}"], g, (rows, dh))
                        delta = self.compute(f"{D}.delta.h{h}.b{r}", "attn_delta",
                                             [do[h, r], f"{P}.O.h{h}.b{r}"], g, (rows, 1),
                                             self.stats_dtype)
                        for j in range(i + 1):
                            kb = s * nb + j
                            dp = self.compute(f"{D}.dP.h{h}.b{r}.k{kb}", "attn_dprobs",
                                              [do[h, r], f"{P}.v.h{h}.b{kb}"], g,
                                              (rows, self.sizes[j]))
                            ds[h, r, kb] = self.compute(
                                f"{D}.S.h{h}.b{r}.k{kb}", "softmax_backward",
                                [f"{P}.P.h{h}.b{r}.k{kb}", dp, delta], g, (rows, self.sizes[j]))
                        keys = seq_rows[:i + 1]
                        dq[h, r] = self.compute(
                            f"{D}.qr.h{h}.b{r}", "attn_dq",
                            [ds[h, r, kb] for kb in keys] + [f"{P}.kr.h{h}.b{kb}" for kb in keys],
                            g, (rows, dh))
            for j, kb in enumerate(seq_rows):
                owner, rows = self.owner(kb), self.sizes[j]
                later = seq_rows[j:]
                parts = []
                for g in range(self.gpus):
                    grads = []
                    for h in range(g * per_gpu, (g + 1) * per_gpu):
                        dkr = self.compute(f"{D}.kr.h{h}.b{kb}", "attn_dk",
                                           [ds[h, r, kb] for r in later] +
                                           [f"{P}.qr.h{h}.b{r}" for r in later], g, (rows, dh))
                        dv = self.compute(f"{D}.v.h{h}.b{kb}", "attn_dv",
                                          [f"{P}.P.h{h}.b{r}.k{kb}" for r in later] +
                                          [do[h, r] for r in later], g, (rows, dh))
                        rope = op_call("rotary_backward", offset=self.starts[j])
                        dqh = self.compute(f"{D}.q.h{h}.b{kb}", rope, [dq[h, kb]], g, (rows, dh))
                        dk = self.compute(f"{D}.k.h{h}.b{kb}", rope, [dkr], g, (rows, dh))
                        grads += [("q", f"h{h}", dqh), ("k", f"h{h}", dk), ("v", f"h{h}", dv)]
                    grads.sort(key=lambda t: "qkv".index(t[0]))
                    xn = self.at(f"{P}.attn_in.b{kb}", g, owner)
                    parts.append(self.lora_backward(layer, kb, g, xn, grads, layer > 0))
                if layer > 0:
                    dh_ = self.compute(f"{D}.attn_in.b{kb}", "add",
                                       [p if g == owner else self.send(p, owner)
                                        for g, p in enumerate(parts)], owner,
                                       self.shapes[dmid[kb]])
                    dn = self.compute(f"{D}.attn_norm.b{kb}", "rmsnorm_backward",
                                      [x_in[kb], f"{W}.attn_norm", dh_], owner,
                                      self.shapes[dh_])
                    dx[kb] = self.compute(f"d.L{layer - 1}.out.b{kb}", "add",
                                          [dmid[kb], dn], owner, self.shapes[dh_])
        return dx

    def step(self, layer: int, adapter: str, parts: list[str]) -> None:
        """The adapter's gradient, its parts summed on one GPU (theirs if they share one,
        else GPU ``layer % gpus``), and its optimizer update there."""
        gpus = {self.g[p].device for p in parts}
        home = int(gpus.pop()[3:]) if len(gpus) == 1 else layer % self.gpus
        moved = [p if self.g[p].device == f"gpu{home}" else self.send(p, home) for p in parts]
        total = moved[0] if len(moved) == 1 else self.compute(
            f"{adapter}.grad", "add", moved, home, self.shapes[adapter])
        self.compute(f"{adapter}.new", self.update, [adapter, total], home,
                     self.shapes[adapter])
