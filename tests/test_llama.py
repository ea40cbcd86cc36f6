"""Issue 19, LLaMA prefill: the ops it needs (kernels against plain NumPy, names with
parameters, unknown ops refused), the ``llama-prefill`` builder's flops against the closed form
of a decoder layer, and its tiny configuration executed under every planner and policy
against an independent NumPy LLaMA."""

from __future__ import annotations

import json

import numpy as np
import pytest

from offloadlab.core import formats
from offloadlab.core.errors import GraphError
from offloadlab.core.ops import OPS, OpError, op_call, op_flops, parse_op, touched_bytes
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.executor.kernels import kernel

RNG = np.random.default_rng(19)


def run_kernel(op: str, shape: tuple[int, ...], args: list[np.ndarray],
               dtype: str = "float32") -> np.ndarray:
    """``op`` through the executor's kernel, with poisoned scratch."""
    k = kernel(op, "v")
    out = np.full(shape, np.nan, dtype)
    k.fn(np, out, args, np.full(k.scratch(out, args), 255, np.uint8))
    return out


def normal(*shape: int, dtype: str = "float32") -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# -- ops ---------------------------------------------------------------------------------
def test_linear_is_x_times_w_transposed_with_column_shards():
    x, w = normal(5, 8), normal(6, 8)
    np.testing.assert_allclose(run_kernel("linear", (5, 6), [x, w]), x @ w.T, rtol=1e-5)
    np.testing.assert_allclose(run_kernel("linear", (5, 6), [x[:, :3], x[:, 3:], w]), x @ w.T,
                               rtol=1e-5, atol=1e-6)


def test_embedding_takes_rows_modulo_the_vocabulary():
    table, ids = normal(16, 4), np.array([3, -1, 17, 0], np.int32)
    np.testing.assert_array_equal(run_kernel("embedding", (4, 4), [ids, table]),
                                  table[ids % 16])


def test_swiglu_and_rmsnorm():
    g, u = normal(4, 6), normal(4, 6)
    np.testing.assert_allclose(run_kernel("swiglu", (4, 6), [g, u]), g / (1 + np.exp(-g)) * u,
                               rtol=1e-5, atol=1e-6)
    gain = normal(6)
    want = g / np.sqrt((g**2).mean(-1, keepdims=True) + 1e-5) * gain
    np.testing.assert_allclose(run_kernel("rmsnorm", (4, 6), [g, gain]), want, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("offset", [0, 5, 1000])
def test_rotary_rotates_by_the_rows_positions(offset):
    x = normal(5, 8)
    pos = np.arange(offset, offset + 5)[:, None]
    angle = pos * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    x1, x2 = x[:, :4], x[:, 4:]
    want = np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                           x2 * np.cos(angle) + x1 * np.sin(angle)], axis=1)
    got = run_kernel(op_call("rotary", offset=offset), (5, 8), [x])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * (1 + offset / 100))


@pytest.mark.parametrize("n,block", [(12, 4), (10, 4), (7, 7), (9, 2)])
def test_blocked_causal_attention_equals_full_attention(n, block):
    """Scores, statistics, masked probabilities and weighted sums per query/key block (blocks
    above the diagonal skipped, the last block possibly short) give causal attention."""
    dh = 8
    q, k, v = normal(n, dh), normal(n, dh), normal(n, dh)
    s = q @ k.T / np.sqrt(dh)
    s[np.triu_indices(n, 1)] = -np.inf
    p = np.exp(s - s.max(1, keepdims=True))
    want = (p / p.sum(1, keepdims=True)) @ v
    starts = list(range(0, n, block))
    for i, q0 in enumerate(starts):
        qi = q[q0:q0 + block]
        rows = len(qi)
        keys = starts[:i + 1]
        scores = [run_kernel("attn_scores", (rows, len(k[k0:k0 + block])),
                             [qi, k[k0:k0 + block]]) for k0 in keys]
        stats = run_kernel(op_call("softmax_stats", q0=q0), (rows, 2), scores)
        probs = [run_kernel(op_call("causal_softmax", q0=q0, k0=k0), sc.shape, [sc, stats])
                 for sc, k0 in zip(scores, keys)]
        out = run_kernel("attn_values", (rows, dh), probs + [v[k0:k0 + block] for k0 in keys])
        np.testing.assert_allclose(out, want[q0:q0 + block], rtol=1e-5, atol=1e-5)


def test_op_names_carry_integer_parameters():
    assert op_call("rotary", offset=0) == "rotary"
    assert op_call("causal_softmax", q0=8, k0=4) == "causal_softmax:q0=8,k0=4"
    assert parse_op("causal_softmax:k0=4") == ("causal_softmax", (("q0", 0), ("k0", 4)))
    for bad, message in [("rotary:offset=x", "must be an integer"),
                         ("rotary:offset=-1", ">= 0"), ("rotary:shift=1", "bad parameter"),
                         ("rotary:offset=1,offset=2", "bad parameter"),
                         ("linear:k=1", "no parameters"), ("conv9", "unknown op")]:
        with pytest.raises(OpError, match=message):
            parse_op(bad)


def test_flops_and_bytes_touched():
    assert op_flops("linear", (5, 6), [(5, 3), (5, 5), (6, 8)]) == 2 * 5 * 6 * 8
    assert op_flops("attn_scores", (4, 4), [(4, 8), (4, 8)]) == (2 * 8 + 1) * 16
    assert op_flops("attn_values", (4, 8), [(4, 4), (4, 4), (4, 8), (4, 8)]) == \
        2 * 4 * 8 * 8 + 4 * 8
    assert op_flops("rotary:offset=9", (4, 8), [(4, 8)]) == 3 * 32
    assert touched_bytes("linear", 10, [20, 30]) == 60
    assert touched_bytes("embedding", 64, [16, 10_000]) == 64 + 16 + 64   # rows, not table


def _graph_with_op(op: object) -> dict:
    g = TaskGraph(name="t")
    g.add_input("a", 64, shape=(4, 4))
    g.add_compute("b", "copy", ["a"], "gpu0", 64, shape=(4, 4))
    data = formats.to_dict(g)
    data["nodes"][1]["op"] = op
    return data


def test_an_unknown_op_in_a_taskgraph_file_names_the_vertex_and_the_known_ops(tmp_path):
    path = tmp_path / "tg.json"
    path.write_text(json.dumps(_graph_with_op("flash_attention")))
    with pytest.raises(GraphError) as err:
        formats.taskgraph_from_json(path)
    message = str(err.value)
    assert "vertex 'b'" in message and "unknown op 'flash_attention'" in message
    assert all(name in message for name in OPS)
    with pytest.raises(GraphError, match="vertex 'b'.*bad parameter"):
        formats.taskgraph_from_dict(_graph_with_op("rotary:angle=3"))
    graph = formats.taskgraph_from_dict(_graph_with_op("rotary:offset=3"))
    assert graph["b"].op == "rotary:offset=3"


def test_an_unknown_op_in_a_memgraph_file_names_the_vertex():
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.planner import plan
    g = formats.taskgraph_from_dict(_graph_with_op("rotary:offset=3"))
    data = formats.to_dict(plan(g, machine_from_spec("p100x4"), "buildmemgraph"))
    node = next(n for n in data["nodes"] if n["id"] == "b")
    node["op"] = "rotary:offset=three"
    with pytest.raises(GraphError, match="vertex 'b'.*must be an integer"):
        formats.memgraph_from_dict(data)


# -- the llama-prefill builder -------------------------------------------------------------
def closed_form_flops(layers: int, d: int, heads: int, ffn: int, vocab: int, seq: int,
                      block: int, gpus: int, batch: int) -> float:
    """The flops of LLaMA prefill from the textbook count of a decoder layer, written here
    independently of the builder.  Per sequence and layer, with query/key blocks of sizes b_i
    (sum seq):

    - projections Q, K, V and O: 4 * 2 seq d^2; SwiGLU MLP (gate, up, down): 3 * 2 seq d ffn;
    - attention (QK^T and PV): 2 * 2 seq^2 d halved for the causal mask, plus the upper halves
      of the diagonal blocks, which are computed and masked: 2 d (seq^2 + sum b_i^2);
    - elementwise, at the op conventions of core/ops/: per score (heads (seq^2 + sum b_i^2)
      / 2 of them) 1 to scale, 4 for the softmax's statistics, 3 for the probabilities; the
      weighted sums' adds d sum_i i b_i; rotary 3 per element of Q and K; RMSNorm 4 per
      element, twice; the residual adds of the gpus partials, twice: gpus seq d each; SwiGLU 5
      per element of the hidden layer;

    and per sequence the final RMSNorm and the LM head on the last block: 4 b d + 2 b d vocab.
    """
    sizes = [min(block, seq - s) for s in range(0, seq, block)]
    square = sum(b * b for b in sizes)
    scores = heads * (seq**2 + square) / 2
    matmuls = 8 * seq * d * d + 6 * seq * d * ffn + 2 * d * (seq**2 + square)
    elementwise = (8 * scores + d * sum(i * b for i, b in enumerate(sizes)) + 6 * seq * d
                   + 8 * seq * d + 2 * gpus * seq * d + 5 * seq * ffn)
    last = sizes[-1]
    return batch * (layers * (matmuls + elementwise) + 4 * last * d + 2 * last * d * vocab)


@pytest.mark.parametrize("spec", [
    "model=tiny,seq=30,block=8,gpus=2,batch=2",
    "model=tiny,seq=32,block=32",
    "model=7b,seq=4096,block=1024,gpus=4",
    "model=13b,seq=3000,block=1024,gpus=2,batch=2",
    "model=65b,seq=2048,block=512,gpus=8",
])
def test_flops_equal_the_closed_form_of_a_decoder_layer(spec):
    from offloadlab.core.workloads import build_workload
    from offloadlab.core.workloads.llama import CONFIGS
    g = build_workload(f"llama-prefill:{spec}")
    meta = g.meta
    c = CONFIGS[meta["model"]]
    want = closed_form_flops(c.layers, c.dim, c.heads, c.ffn, c.vocab, meta["seq"],
                             meta["block"], meta["gpus"], meta["batch"])
    assert sum(t.flops for t in g) == pytest.approx(want, rel=1e-12)
    matmul_ops = ("linear", "attn_scores", "attn_values")
    assert all(t.op is None or t.op.split(":")[0] in OPS for t in g)
    assert sum(t.flops for t in g if t.op in matmul_ops) > 0.9 * want


def test_seven_b_at_1k_is_two_flops_per_parameter_and_token_plus_attention():
    """A check of the closed form itself: LLaMA-7B's 6.74e9 parameters (embedding excluded
    from the flops: a lookup) at 1024 tokens; the last block's LM head only."""
    from offloadlab.core.workloads import build_workload
    g = build_workload("llama-prefill:model=7b,seq=1024")
    params = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    assert sum(t.flops for t in g if t.op == "linear") == \
        2 * 1024 * params + 2 * 1024 * 4096 * 32000
    weights = sum(t.bytes for t in g if t.kind == "input" and not t.id.startswith("tokens"))
    assert weights == 2 * (params + 2 * 32000 * 4096 + 65 * 4096)     # fp16, norms included
    assert all(t.device == "host" for t in g if t.kind == "input")


@pytest.mark.parametrize("spec,message", [
    ("model=8b", "unknown model '8b'; known: 7b, 13b, 65b, tiny"),
    ("seq=0", "seq must be a positive integer"),
    ("seq=-5", "seq must be a positive integer"),
    ("batch=0", "batch must be a positive integer"),
    ("block=0", "block must be a positive integer"),
    ("gpus=3", "7b has heads 32, not divisible by gpus \\(3\\)"),
    ("model=tiny,gpus=8", "tiny has heads 4, not divisible by gpus \\(8\\)"),
    ("dtype=int8", "dtype must be one of float16, float32, float64"),
    ("seq=1.5", "cannot read '1.5'"),
    ("layers=3", "unknown option"),
])
def test_bad_options_are_one_clear_error(spec, message):
    from offloadlab.core.errors import SpecError
    from offloadlab.core.workloads import build_workload
    with pytest.raises(SpecError, match=message):
        build_workload(f"llama-prefill:{spec}")


def test_bad_options_exit_2_from_the_cli_without_a_traceback(tmp_path):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "offloadlab", "plan", "--workload",
                           "llama-prefill:model=7b,gpus=3", "--machine", "a100x8", "--out",
                           str(tmp_path / "mg.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "not divisible by gpus (3)" in proc.stderr and "Traceback" not in proc.stderr


# -- the tiny configuration, executed ------------------------------------------------------
def numpy_llama(seq: int, block: int, gpus: int, batch: int) -> dict[str, np.ndarray]:
    """The tiny LLaMA in plain NumPy (float64), whole matrices and whole sequences, written
    from the model's definition (Touvron et al. 2023; Hugging Face's half-split rotary).  Its
    weights are the executor's input values, assembled from the shards' vertex ids: head h's
    rows of W_q, W_k and W_v, GPU g's columns of W_o and W_down and rows of W_gate and W_up."""
    from offloadlab.core.workloads.llama import CONFIGS
    from offloadlab.executor.kernels import initial_value
    c = CONFIGS["tiny"]
    d, heads, dh = c.dim, c.heads, c.dim // c.heads
    hidden, per_gpu = c.ffn // gpus, heads // gpus

    def w(vertex: str, *shape: int) -> np.ndarray:
        return initial_value(vertex, shape, "float32").astype(np.float64)

    def rmsnorm(x: np.ndarray, gain: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * gain

    def rotary(x: np.ndarray) -> np.ndarray:
        angle = np.arange(seq)[:, None] * 10000.0 ** (-np.arange(0, dh, 2) / dh)
        x1, x2 = x[:, :dh // 2], x[:, dh // 2:]
        return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                               x2 * np.cos(angle) + x1 * np.sin(angle)], axis=1)

    starts = list(range(0, seq, block))
    nb = len(starts)
    embed = w("embed", c.vocab, d)
    results: dict[str, np.ndarray] = {}
    for s in range(batch):
        tokens = np.concatenate([initial_value(f"tokens.b{s * nb + i}",
                                               (min(block, seq - b0),), "int32")
                                 for i, b0 in enumerate(starts)])
        x = embed[tokens % c.vocab]
        for layer in range(c.layers):
            L = f"L{layer}"
            h = rmsnorm(x, w(f"{L}.attn_norm", d))
            wq, wk, wv = (np.vstack([w(f"{L}.w{n}.h{i}", dh, d) for i in range(heads)])
                          for n in "qkv")
            q, k, v = h @ wq.T, h @ wk.T, h @ wv.T
            out = np.empty((seq, d))
            for i in range(heads):
                cols = slice(i * dh, (i + 1) * dh)
                scores = rotary(q[:, cols]) @ rotary(k[:, cols]).T / np.sqrt(dh)
                scores[np.triu_indices(seq, 1)] = -np.inf
                p = np.exp(scores - scores.max(axis=1, keepdims=True))
                out[:, cols] = (p / p.sum(axis=1, keepdims=True)) @ v[:, cols]
            wo = np.hstack([w(f"{L}.wo.g{g}", d, per_gpu * dh) for g in range(gpus)])
            x = x + out @ wo.T
            h = rmsnorm(x, w(f"{L}.mlp_norm", d))
            gate = h @ np.vstack([w(f"{L}.w_gate.g{g}", hidden, d) for g in range(gpus)]).T
            up = h @ np.vstack([w(f"{L}.w_up.g{g}", hidden, d) for g in range(gpus)]).T
            down = np.hstack([w(f"{L}.w_down.g{g}", d, hidden) for g in range(gpus)])
            x = x + (gate / (1 + np.exp(-gate)) * up) @ down.T
        last = starts[-1]
        logits = rmsnorm(x[last:], w("norm", d)) @ w("lm_head", c.vocab, d).T
        results[f"logits.s{s}"] = logits
        for i, b0 in enumerate(starts[:-1]):
            results[f"L{c.layers - 1}.mlp_res.b{s * nb + i}"] = x[b0:b0 + block]
    return results


TINY = [
    dict(seq=32, block=8, gpus=2, batch=1),
    dict(seq=30, block=8, gpus=4, batch=2),      # a short last block, one head per GPU
    dict(seq=16, block=16, gpus=1, batch=1),     # one block: the whole causal mask at once
]


@pytest.mark.slow
@pytest.mark.parametrize("options", TINY, ids=lambda o: ",".join(f"{k}={v}"
                                                                 for k, v in o.items()))
def test_tiny_llama_executes_to_the_numpy_model_under_every_planner_and_policy(options):
    from offloadlab.core.machine import Machine
    from offloadlab.core.verify import verify
    from offloadlab.core.workloads import llama_prefill
    from offloadlab.executor import check_outputs, execute, reference_outputs
    from offloadlab.planner import plan
    from offloadlab.planner.buildmemgraph import min_capacity
    graph = llama_prefill(model="tiny", **options)
    want = numpy_llama(**options)
    reference = reference_outputs(graph)
    assert set(reference) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(reference[name], value, rtol=1e-4, atol=1e-4, err_msg=name)
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
                assert check_outputs(result.outputs, reference) is None, (planner, policy)
                for name, value in want.items():
                    np.testing.assert_allclose(result.outputs[name], value, rtol=1e-4,
                                               atol=1e-4, err_msg=f"{planner} {policy} {name}")

