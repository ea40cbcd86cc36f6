"""Issue 19, LLaMA LoRA training: the backward ops' kernels against NumPy (finite differences of
NumPy forwards), the ``llama-lora-train`` builder's flops against a closed form with and without
checkpointing, its tiny configuration planned, verified and executed against an independent
NumPy LoRA step with a hand-written backward, the CoTrain and Gemini planners on it, and its
bad options."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from offloadlab.core.ops import op_call
from offloadlab.executor.kernels import kernel

RNG = np.random.default_rng(1916)


def run_kernel(op: str, shape: tuple[int, ...], args: list[np.ndarray],
               dtype: str = "float64") -> np.ndarray:
    """``op`` through the executor's kernel, output and scratch poisoned."""
    k = kernel(op, "v")
    out = np.full(shape, np.nan, dtype)
    k.fn(np, out, args, np.full(k.scratch(out, args), 255, np.uint8))
    return out


def normal(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def vjp_check(forward, args: list[np.ndarray], wrt: int, grad: np.ndarray, dy: np.ndarray,
              eps: float = 1e-6) -> None:
    """``<grad, v> == <dy, d forward(args) / d args[wrt] v>`` for a random direction ``v``, the
    derivative by central differences of the NumPy ``forward``."""
    v = normal(*args[wrt].shape)
    plus, minus = list(args), list(args)
    plus[wrt], minus[wrt] = args[wrt] + eps * v, args[wrt] - eps * v
    numeric = np.sum(dy * (forward(*plus) - forward(*minus))) / (2 * eps)
    assert np.sum(grad * v) == pytest.approx(numeric, rel=1e-6, abs=1e-8)


# -- NumPy forwards (independent of the kernels) ----------------------------------------
def np_rmsnorm(x, g):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g


def np_silu(x):
    return x / (1 + np.exp(-x))


def np_rotary(x, offset=0):
    n, dh = x.shape
    angle = np.arange(offset, offset + n)[:, None] * 10000.0 ** (-np.arange(0, dh, 2) / dh)
    x1, x2 = x[:, :dh // 2], x[:, dh // 2:]
    return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                           x2 * np.cos(angle) + x1 * np.sin(angle)], axis=1)


def np_rotary_backward(d, offset=0):
    """The transpose of the rotation: rotation by the opposite angles."""
    n, dh = d.shape
    angle = np.arange(offset, offset + n)[:, None] * 10000.0 ** (-np.arange(0, dh, 2) / dh)
    d1, d2 = d[:, :dh // 2], d[:, dh // 2:]
    return np.concatenate([d1 * np.cos(angle) + d2 * np.sin(angle),
                           d2 * np.cos(angle) - d1 * np.sin(angle)], axis=1)


def np_rmsnorm_backward(x, g, dy):
    r = np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5)
    return g * dy / r - x * np.sum(g * dy * x, axis=-1, keepdims=True) / (x.shape[-1] * r**3)


def np_cross_entropy(logits, labels):
    """Summed over rows (the kernel's ``tokens`` divides)."""
    m = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(1, keepdims=True)) + m
    return float(np.sum(lse[:, 0] - logits[np.arange(len(labels)), labels % logits.shape[1]]))


# -- ops ---------------------------------------------------------------------------------
def test_linear_backward_and_lora_linear():
    x, w, u, b, dy = normal(5, 8), normal(6, 8), normal(5, 3), normal(6, 3), normal(5, 6)
    np.testing.assert_allclose(run_kernel("lora_linear", (5, 6), [x, w, u, b]),
                               x @ w.T + u @ b.T)
    np.testing.assert_allclose(run_kernel("linear_dx", (5, 8), [dy, w]), dy @ w)
    vjp_check(lambda x: x @ w.T, [x], 0, run_kernel("linear_dx", (5, 8), [dy, w]), dy)
    np.testing.assert_allclose(run_kernel("linear_dw", (6, 8), [dy, x]), dy.T @ x)
    vjp_check(lambda w: x @ w.T, [w], 0, run_kernel("linear_dw", (6, 8), [dy, x]), dy)
    # pairs summed, and a column window of W (one head's columns of W_o)
    dy2, w2 = normal(5, 2), normal(2, 8)
    np.testing.assert_allclose(run_kernel("linear_dx", (5, 8), [dy, dy2, w, w2]),
                               dy @ w + dy2 @ w2)
    np.testing.assert_allclose(run_kernel(op_call("linear_dx", col0=4), (5, 3), [dy, w]),
                               dy @ w[:, 4:7])
    x2 = normal(4, 8)
    dya, dyb = normal(5, 6), normal(4, 6)
    np.testing.assert_allclose(run_kernel("linear_dw", (6, 8), [dya, dyb, x, x2]),
                               dya.T @ x + dyb.T @ x2)


def test_rmsnorm_swiglu_rotary_backward():
    x, g, dy = normal(4, 6), normal(6), normal(4, 6)
    got = run_kernel("rmsnorm_backward", (4, 6), [x, g, dy])
    np.testing.assert_allclose(got, np_rmsnorm_backward(x, g, dy))
    vjp_check(np_rmsnorm, [x, g], 0, got, dy)
    gate, up = normal(4, 6), normal(4, 6)
    dgate = run_kernel("swiglu_dgate", (4, 6), [gate, up, dy])
    dup = run_kernel("swiglu_dup", (4, 6), [gate, up, dy])
    vjp_check(lambda a, b: np_silu(a) * b, [gate, up], 0, dgate, dy)
    vjp_check(lambda a, b: np_silu(a) * b, [gate, up], 1, dup, dy)
    for offset in (0, 7, 1000):
        q, dq = normal(5, 8), normal(5, 8)
        got = run_kernel(op_call("rotary_backward", offset=offset), (5, 8), [dq])
        np.testing.assert_allclose(got, np_rotary_backward(dq, offset), atol=1e-6)
        vjp_check(lambda q: np_rotary(q, offset), [q], 0, got, dq)


def test_cross_entropy_forward_and_backward():
    logits, labels = normal(6, 10), np.array([3, -1, 12, 0, 9, 4], np.int32)
    loss = run_kernel(op_call("cross_entropy", tokens=4), (1,), [logits, labels])
    assert loss[0] == pytest.approx(np_cross_entropy(logits, labels) / 4, rel=1e-12)
    got = run_kernel(op_call("cross_entropy_backward", tokens=4), (6, 10), [logits, labels])
    vjp_check(lambda z: np.array(np_cross_entropy(z, labels) / 4), [logits], 0, got,
              np.array(1.0))


@pytest.mark.parametrize("n,block", [(12, 4), (10, 4), (7, 7), (9, 2)])
def test_blocked_attention_backward_equals_the_gradient_of_causal_attention(n, block):
    """dQ, dK, dV from per-block dP, delta, dS as the builder wires them, against finite
    differences of whole-matrix causal attention."""
    dh = 8
    q, k, v, do = normal(n, dh), normal(n, dh), normal(n, dh), normal(n, dh)

    def attention(q, k, v):
        s = q @ k.T / np.sqrt(dh)
        s[np.triu_indices(n, 1)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        return (p / p.sum(1, keepdims=True)) @ v

    o = attention(q, k, v)
    starts = list(range(0, n, block))
    blk = [slice(s, s + block) for s in starts]
    probs, ds = {}, {}
    dq = np.zeros_like(q)
    for i, q0 in enumerate(starts):
        rows = len(q[blk[i]])
        scores = [run_kernel("attn_scores", (rows, len(k[blk[j]])), [q[blk[i]], k[blk[j]]])
                  for j in range(i + 1)]
        stats = run_kernel(op_call("softmax_stats", q0=q0), (rows, 2), scores)
        delta = run_kernel("attn_delta", (rows, 1), [do[blk[i]], o[blk[i]]])
        for j in range(i + 1):
            probs[i, j] = run_kernel(op_call("causal_softmax", q0=q0, k0=starts[j]),
                                     scores[j].shape, [scores[j], stats])
            dp = run_kernel("attn_dprobs", scores[j].shape, [do[blk[i]], v[blk[j]]])
            ds[i, j] = run_kernel("softmax_backward", dp.shape, [probs[i, j], dp, delta])
        dq[blk[i]] = run_kernel("attn_dq", (rows, dh), [ds[i, j] for j in range(i + 1)] +
                                [k[blk[j]] for j in range(i + 1)])
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for j in range(len(starts)):
        later = range(j, len(starts))
        shape = (len(k[blk[j]]), dh)
        dk[blk[j]] = run_kernel("attn_dk", shape, [ds[i, j] for i in later] +
                                [q[blk[i]] for i in later])
        dv[blk[j]] = run_kernel("attn_dv", shape, [probs[i, j] for i in later] +
                                [do[blk[i]] for i in later])
    for wrt, grad in enumerate((dq, dk, dv)):
        vjp_check(attention, [q, k, v], wrt, grad, do)


# -- the NumPy LoRA step -------------------------------------------------------------------
def numpy_lora_step(seq: int, block: int, gpus: int, batch: int, rank: int,
                    dtype: str) -> tuple[float, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The tiny LLaMA's LoRA training step in plain NumPy (float64), whole matrices and whole
    sequences, the backward by hand: the loss, and each adapter's gradient and initial value,
    by the builder's vertex ids (the full adapters cut like the shards: B of Q, K, V by heads,
    of gate and up by GPU slices; A of down by GPU column slices)."""
    from offloadlab.core.workloads.llama import CONFIGS
    from offloadlab.executor.kernels import initial_value
    c = CONFIGS["tiny"]
    d, heads, dh, V = c.dim, c.heads, c.dim // c.heads, c.vocab
    hidden = c.ffn // gpus

    def w(vertex: str, *shape: int) -> np.ndarray:
        return initial_value(vertex, shape, dtype).astype(np.float64)

    def stack(fmt: str, n: int, *shape: int, axis: int = 0) -> np.ndarray:
        return np.concatenate([w(fmt.format(i), *shape) for i in range(n)], axis=axis)

    starts = list(range(0, seq, block))
    nb, tokens = len(starts), batch * seq
    sizes = [min(block, seq - s) for s in starts]
    layers = []
    for layer in range(c.layers):
        L = f"L{layer}"
        p = dict(attn_norm=w(f"{L}.attn_norm", d), mlp_norm=w(f"{L}.mlp_norm", d),
                 wo=stack(L + ".wo.g{}", gpus, d, d // gpus, axis=1),
                 w_down=stack(L + ".w_down.g{}", gpus, d, hidden, axis=1),
                 A_down=stack(L + ".lora_A.down.g{}", gpus, rank, hidden, axis=1),
                 B_down=w(f"{L}.lora_B.down", d, rank))
        for n in "qkv":
            p["w" + n] = stack(L + ".w" + n + ".h{}", heads, dh, d)
            p["A_" + n] = w(f"{L}.lora_A.{n}", rank, d)
            p["B_" + n] = stack(L + ".lora_B." + n + ".h{}", heads, dh, rank)
        for n in ("gate", "up"):
            p["w_" + n] = stack(L + ".w_" + n + ".g{}", gpus, hidden, d)
            p["A_" + n] = w(f"{L}.lora_A.{n}", rank, d)
            p["B_" + n] = stack(L + ".lora_B." + n + ".g{}", gpus, hidden, rank)
        layers.append(p)
    embed, norm, lm_head = w("embed", V, d), w("norm", d), w("lm_head", V, d)
    grads = [{k: np.zeros_like(v) for k, v in p.items() if k[:2] in ("A_", "B_")}
             for p in layers]
    loss = 0.0
    for s in range(batch):
        ids = [s * nb + i for i in range(nb)]
        tok = np.concatenate([initial_value(f"tokens.b{r}", (n,), "int32")
                              for r, n in zip(ids, sizes)])
        lab = np.concatenate([initial_value(f"labels.b{r}", (n,), "int32")
                              for r, n in zip(ids, sizes)]) % V
        x = embed[tok % V]
        saved = []
        for p in layers:                                          # forward
            f: dict[str, np.ndarray] = dict(x=x, h=np_rmsnorm(x, p["attn_norm"]))
            for n in "qkv":
                f["u_" + n] = f["h"] @ p["A_" + n].T
                f[n] = f["h"] @ p["w" + n].T + f["u_" + n] @ p["B_" + n].T
            o = np.empty((seq, d))
            f["P"], f["qr"], f["kr"] = [], [], []
            for i in range(heads):
                cols = slice(i * dh, (i + 1) * dh)
                qr, kr = np_rotary(f["q"][:, cols]), np_rotary(f["k"][:, cols])
                sc = qr @ kr.T / np.sqrt(dh)
                sc[np.triu_indices(seq, 1)] = -np.inf
                e = np.exp(sc - sc.max(1, keepdims=True))
                pr = e / e.sum(1, keepdims=True)
                o[:, cols] = pr @ f["v"][:, cols]
                f["P"].append(pr)
                f["qr"].append(qr)
                f["kr"].append(kr)
            f["o"] = o
            f["x1"] = x + o @ p["wo"].T
            f["h2"] = np_rmsnorm(f["x1"], p["mlp_norm"])
            for n in ("gate", "up"):
                f["u_" + n] = f["h2"] @ p["A_" + n].T
                f[n] = f["h2"] @ p["w_" + n].T + f["u_" + n] @ p["B_" + n].T
            f["act"] = np_silu(f["gate"]) * f["up"]
            f["u_down"] = f["act"] @ p["A_down"].T
            x = f["x1"] + f["act"] @ p["w_down"].T + f["u_down"] @ p["B_down"].T
            saved.append(f)
        final = np_rmsnorm(x, norm)
        logits = final @ lm_head.T
        m = logits.max(1, keepdims=True)
        e = np.exp(logits - m)
        loss += float(np.sum(np.log(e.sum(1)) + m[:, 0] - logits[np.arange(seq), lab])) / tokens
        dlogits = e / e.sum(1, keepdims=True)
        dlogits[np.arange(seq), lab] -= 1
        dlogits /= tokens
        dx = np_rmsnorm_backward(x, norm, dlogits @ lm_head)
        for p, f, gr in reversed(list(zip(layers, saved, grads))):     # backward
            du = dx @ p["B_down"]
            gr["B_down"] += dx.T @ f["u_down"]
            gr["A_down"] += du.T @ f["act"]
            dact = dx @ p["w_down"] + du @ p["A_down"]
            sg = 1 / (1 + np.exp(-f["gate"]))
            dy = dict(gate=dact * f["up"] * sg * (1 + f["gate"] * (1 - sg)),
                      up=dact * np_silu(f["gate"]))
            dh2 = np.zeros_like(dx)
            for n in ("gate", "up"):
                du = dy[n] @ p["B_" + n]
                gr["B_" + n] += dy[n].T @ f["u_" + n]
                gr["A_" + n] += du.T @ f["h2"]
                dh2 += dy[n] @ p["w_" + n] + du @ p["A_" + n]
            dx1 = dx + np_rmsnorm_backward(f["x1"], p["mlp_norm"], dh2)
            do = dx1 @ p["wo"]
            dy = {n: np.empty((seq, d)) for n in "qkv"}
            for i in range(heads):
                cols = slice(i * dh, (i + 1) * dh)
                pr, qr, kr, doh = f["P"][i], f["qr"][i], f["kr"][i], do[:, cols]
                dp = doh @ f["v"][:, cols].T
                dsc = pr * (dp - np.sum(dp * pr, axis=1, keepdims=True)) / np.sqrt(dh)
                dy["q"][:, cols] = np_rotary_backward(dsc @ kr)
                dy["k"][:, cols] = np_rotary_backward(dsc.T @ qr)
                dy["v"][:, cols] = pr.T @ doh
            dxn = np.zeros_like(dx)
            for n in "qkv":
                du = dy[n] @ p["B_" + n]
                gr["B_" + n] += dy[n].T @ f["u_" + n]
                gr["A_" + n] += du.T @ f["h"]
                dxn += dy[n] @ p["w" + n] + du @ p["A_" + n]
            dx = dx1 + np_rmsnorm_backward(f["x"], p["attn_norm"], dxn)
    by_id: dict[str, np.ndarray] = {}
    initial: dict[str, np.ndarray] = {}
    for layer, (p, gr) in enumerate(zip(layers, grads)):
        L = f"L{layer}"
        for key, value in gr.items():
            kind, n = key.split("_")
            if (kind, n) == ("B", "down") or kind == "A" and n != "down":
                pieces = {f"{L}.lora_{kind}.{n}": (value, p[key])}
            elif kind == "A":
                pieces = {f"{L}.lora_A.down.g{g}": (value[:, g * hidden:(g + 1) * hidden],
                                                     p[key][:, g * hidden:(g + 1) * hidden])
                          for g in range(gpus)}
            else:
                part, size, count = ("h", dh, heads) if n in "qkv" else ("g", hidden, gpus)
                pieces = {f"{L}.lora_B.{n}.{part}{i}": (value[i * size:(i + 1) * size],
                                                        p[key][i * size:(i + 1) * size])
                          for i in range(count)}
            for vid, (gval, wval) in pieces.items():
                by_id[vid], initial[vid] = gval, wval
    return loss, by_id, initial


def check_step(outputs: dict[str, np.ndarray], options: dict, optimizer: str,
               rtol: float, where: str = "") -> None:
    """The executed step's loss and updated adapters against :func:`numpy_lora_step`: SGD's
    step recovers the gradient, ``(w - w') / lr``; Adam's is compared as the update."""
    from offloadlab.core.ops.elementwise import ADAM_EPS, ADAM_LR, SGD_LR
    loss, grads, initial = numpy_lora_step(**options)
    assert set(outputs) == {"loss"} | {f"{a}.new" for a in grads}, where
    assert outputs["loss"][0] == pytest.approx(loss, rel=rtol), where
    for adapter, g in grads.items():
        new = outputs[f"{adapter}.new"].astype(np.float64)
        if optimizer == "sgd":
            scale = np.abs(g).max()
            np.testing.assert_allclose((initial[adapter] - new) / SGD_LR / scale, g / scale,
                                       rtol=0, atol=rtol, err_msg=f"{where} {adapter}")
        else:
            want = initial[adapter] - ADAM_LR * g / (np.abs(g) + ADAM_EPS)
            np.testing.assert_allclose(new, want, rtol=0, atol=rtol * ADAM_LR,
                                       err_msg=f"{where} {adapter}")


TINY = [
    dict(seq=16, block=8, gpus=2, batch=1, rank=4, dtype="float64"),
    dict(seq=14, block=4, gpus=4, batch=2, rank=3, dtype="float64"),   # short last block
    dict(seq=12, block=12, gpus=1, batch=1, rank=16, dtype="float32"),
]


@pytest.mark.parametrize("checkpoint", [True, False])
@pytest.mark.parametrize("options", TINY, ids=lambda o: ",".join(f"{k}={v}"
                                                                 for k, v in o.items()))
def test_the_reference_evaluation_equals_the_numpy_step(options, checkpoint):
    from offloadlab.core.workloads import llama_lora_train
    from offloadlab.executor import reference_outputs
    for optimizer in ("sgd", "adam"):
        graph = llama_lora_train(model="tiny", checkpoint=checkpoint, optimizer=optimizer,
                                 **options)
        rtol = 1e-9 if options["dtype"] == "float64" else 2e-3
        check_step(reference_outputs(graph), options, optimizer, rtol, optimizer)


@pytest.mark.slow
@pytest.mark.parametrize("options", TINY[:2], ids=["gpus=2", "gpus=4,batch=2"])
def test_tiny_lora_step_executes_to_the_numpy_step_under_every_planner_and_policy(options):
    from offloadlab.core.machine import Machine
    from offloadlab.core.verify import verify
    from offloadlab.core.workloads import llama_lora_train
    from offloadlab.executor import execute
    from offloadlab.planner import plan
    from offloadlab.planner.buildmemgraph import min_capacity
    graph = llama_lora_train(model="tiny", optimizer="sgd", **options)
    tight = min_capacity(graph)
    machine = Machine(gpus=options["gpus"], gpu_memory=tight + tight // 4)
    for planner in ("buildmemgraph", "levelwise"):
        mg = plan(graph, machine, planner)
        verify(mg, graph, machine)
        assert mg.count("offload") + mg.count("reload") > 0, f"{planner} never offloads"
        for policy, seeds in (("dynamic", [0]), ("fixed", [0]), ("random", range(10))):
            for seed in seeds:
                result = execute(mg, machine, policy=policy, seed=seed, poison=True,
                                 rate_limit=False)
                check_step(result.outputs, options, "sgd", 1e-9, f"{planner} {policy} {seed}")


# -- flops ---------------------------------------------------------------------------------
def closed_form_flops(layers: int, d: int, heads: int, ffn: int, vocab: int, seq: int,
                      block: int, gpus: int, batch: int, rank: int, checkpoint: bool,
                      update: float) -> float:
    """One LoRA step's flops, written from the model, per sequence of blocks b_i (sum seq):

    forward of a layer: the prefill's (its docstring in test_llama.py), plus the adapters:
      u = x A^T on every GPU for q, k, v, gate, up: 5 gpus 2 seq d r; for down, split:
      2 seq ffn r; u B^T and its add: (2 r + 1) seq (3 d + 2 ffn + gpus d);
    the loss: per row block the final RMSNorm 4 b d, the logits 2 b d vocab, cross entropy 4
      b vocab; their sum: batch nb - 1;
    backward of the loss: 8 seq vocab (cross entropy) + 2 seq d vocab + 8 seq d (RMSNorm);
    backward of a layer (no gradient of W, the gains, W_o):
      down: du = dy B (2 seq d r per GPU), dB_down (2 seq d r per GPU), dA_down (2 seq r
        ffn), dact = dy W + du A (2 seq ffn (d + r) + seq ffn);
      swiglu: 10 + 5 per hidden element; gate/up like q, k, v below with ffn outputs;
      per projection family (q, k, v on d outputs; gate, up on ffn): dB = 2 seq out r,
        du = 2 seq out r + (parts - 1) seq r, dA = 2 seq d r per GPU; dx per GPU: 2 seq d
        (sum of outputs + families r) + (pairs - 1) seq d;
      reduce of the dx parts ((gpus - 1) seq d), RMSNorm backward 8 seq d, residual add seq d,
        twice (not for attention's in layer 0);
      attention per head: dO = dy W_o (2 seq d dh), delta 2 seq dh; per score dP 2 dh, dS 2,
        dQ, dK, dV 2 dh each; dQ's sums over key blocks dh sum_i i b_i, dK's and dV's over
        query blocks dh sum_j (nb - 1 - j) b_j; dQ's and dK's scale; rotary 3 per element of
        dQ and dK;
    the updates: ``update`` per adapter element, and the sums of their gradient parts (per
      row block and GPU for A of q, k, v, gate, up and B of down; per row block for the rest);
    checkpointing: each layer's forward once more, less the down projection and its add.
    """
    sizes = [min(block, seq - s) for s in range(0, seq, block)]
    nb, dh, hid = len(sizes), d // heads, ffn // gpus
    square = sum(b * b for b in sizes)
    scores = heads * (seq**2 + square) / 2           # score elements per layer, all heads
    attn_fwd = (8 * seq * d * d + 2 * d * (seq**2 + square) + 8 * scores
                + d * sum(i * b for i, b in enumerate(sizes)) + 6 * seq * d
                + 8 * seq * d + 5 * seq * ffn)
    prefill = attn_fwd + 6 * seq * d * ffn + 2 * gpus * seq * d
    lora_fwd = (5 * gpus * 2 * seq * d * rank + 2 * seq * ffn * rank
                + (2 * rank + 1) * seq * (3 * d + 2 * ffn + gpus * d))
    down_and_add = 2 * seq * d * ffn + (2 * rank + 1) * seq * gpus * d + gpus * seq * d
    forward = prefill + lora_fwd
    per_head = heads // gpus

    def family(out: int, parts_per_gpu: int) -> float:
        return (2 * seq * out * rank + 2 * seq * out * rank
                + gpus * (parts_per_gpu - 1) * seq * rank + gpus * 2 * seq * d * rank)

    def backward(layer: int) -> float:
        mlp = (gpus * 4 * seq * d * rank + 2 * seq * rank * ffn + 2 * seq * ffn * (d + rank)
               + seq * ffn + 15 * seq * ffn + 2 * family(ffn, 1)
               + gpus * (2 * seq * d * (2 * hid + 2 * rank) + 3 * seq * d)
               + (gpus - 1) * seq * d + 8 * seq * d + seq * d)
        later = sum((nb - 1 - j) * b for j, b in enumerate(sizes))
        attn = (heads * (2 * seq * d * dh + 2 * seq * dh)      # dO, delta
                + scores * (2 * dh + 2 + 3 * 2 * dh)           # dP, dS; dQ, dK, dV
                + heads * dh * (sum(i * b for i, b in enumerate(sizes)) + 2 * later)  # sums
                + heads * 2 * seq * dh                          # dQ and dK's scale
                + heads * 2 * 3 * seq * dh + 3 * family(d, per_head))
        if layer > 0:
            attn += (gpus * (2 * seq * d * (3 * per_head * dh + 3 * rank)
                             + (3 * per_head + 3 - 1) * seq * d)
                     + (gpus - 1) * seq * d + 8 * seq * d + seq * d)
        return mlp + attn

    loss = 4 * seq * d + 2 * seq * d * vocab + 4 * seq * vocab
    loss_back = 8 * seq * vocab + 2 * seq * d * vocab + 8 * seq * d
    per_seq = (layers * forward + loss + loss_back + sum(backward(i) for i in range(layers))
               + (layers * (forward - down_and_add) if checkpoint else 0))
    adapters = layers * rank * (3 * 2 * d + 2 * (d + ffn) + ffn + d)
    parts = batch * nb             # an adapter's gradient parts: one per row block and GPU
    sums = layers * rank * ((5 * d + d) * (gpus * parts - 1) + (3 * d + 3 * ffn) * (parts - 1))
    return batch * per_seq + (batch * nb - 1) + update * adapters + sums


@pytest.mark.parametrize("spec", [
    "model=tiny,seq=16,block=16",
    "model=tiny,seq=30,block=8,gpus=2,batch=2",
    "model=tiny,seq=30,block=8,gpus=4,checkpoint=false,optimizer=sgd",
    "model=7b,seq=1024,block=512,gpus=4",
])
def test_flops_equal_the_closed_form(spec):
    from offloadlab.core.workloads import build_workload
    from offloadlab.core.workloads.llama import CONFIGS
    g = build_workload(f"llama-lora-train:{spec}")
    m = g.meta
    c = CONFIGS[m["model"]]
    want = closed_form_flops(c.layers, c.dim, c.heads, c.ffn, c.vocab, m["seq"], m["block"],
                             m["gpus"], m["batch"], m["rank"], m["checkpoint"],
                             12.0 if m["optimizer"] == "adam" else 2.0)
    assert sum(t.flops for t in g) == pytest.approx(want, rel=1e-12)


# -- planners and options ------------------------------------------------------------------
def test_cotrain_and_gemini_plan_it_beside_buildmemgraph_and_levelwise(tmp_path):
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner.cotrain import layers
    graph = build_workload("llama-lora-train:model=tiny,seq=16,block=8,gpus=2")
    compute = [t for t in graph if t.kind == "compute"]
    forward = compute[:graph.meta["forward"]]
    assert forward[-1].id == "loss" and not any(t.id.startswith("d.") for t in forward)
    # per layer: A of q, k, v; B of each of 4 heads; A of gate, up; B of their 2 GPU slices;
    # A of down per GPU; B of down
    assert len(layers(graph)) == 2 * (3 + 3 * 4 + 2 + 2 * 2 + 2 + 1)
    proc = subprocess.run([sys.executable, "-m", "offloadlab", "compare", "--workload",
                           "llama-lora-train:model=tiny,seq=16,block=8,gpus=2", "--machine",
                           "p100x4", "--planner", "cotrain", "--planner", "gemini", "--planner",
                           "buildmemgraph", "--planner", "levelwise", "--planner",
                           "cotrain:k=4"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for planner in ("cotrain", "gemini", "buildmemgraph", "levelwise"):
        assert planner in proc.stdout


def test_frozen_weights_get_no_gradient_and_checkpointing_recomputes_each_layer():
    from offloadlab.core.workloads import build_workload
    g = build_workload("llama-lora-train:model=tiny,seq=16,block=8,gpus=2")
    updated = {t.inputs[0] for t in g if t.op in ("adam_update", "sgd_update")}
    inputs = {t.id for t in g if t.kind == "input"}
    assert updated == {i for i in inputs if ".lora_" in i}
    assert all(g[i].device == "host" for i in inputs)
    assert {t.id.split(".")[1] for t in g if t.id.startswith("re.")} == {"L0", "L1"}
    plain = build_workload("llama-lora-train:model=tiny,seq=16,block=8,gpus=2,"
                           "checkpoint=false")
    assert not any(t.id.startswith("re.") for t in plain)


@pytest.mark.parametrize("spec,message", [
    ("model=8b", "unknown model '8b'; known: 7b, 13b, 65b, tiny"),
    ("seq=0", "seq must be a positive integer"),
    ("gpus=3", "7b has heads 32, not divisible by gpus \\(3\\)"),
    ("dtype=int8", "dtype must be one of float16, float32, float64"),
    ("rank=0", "rank must be a positive integer"),
    ("optimizer=lamb", "optimizer must be one of adam, sgd"),
    ("checkpoint=maybe", "checkpoint"),
    ("layers=3", "unknown option"),
])
def test_bad_options_are_one_clear_error(spec, message):
    from offloadlab.core.errors import SpecError
    from offloadlab.core.workloads import build_workload
    with pytest.raises(SpecError, match=message):
        build_workload(f"llama-lora-train:{spec}")


def test_bad_options_exit_2_from_the_cli_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "offloadlab", "plan", "--workload",
                           "llama-lora-train:model=tiny,rank=-1", "--machine", "a100x8", "--out",
                           str(tmp_path / "mg.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "llama-lora-train: rank must be a positive integer" in proc.stderr
    assert "Traceback" not in proc.stderr
