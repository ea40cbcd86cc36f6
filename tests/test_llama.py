"""Issue 19, LLaMA prefill: the ops it needs (kernels against plain NumPy, names with
parameters, unknown ops refused), the ``llama-prefill`` builder's flops against the closed form
of a decoder layer, and its tiny configuration executed under every planner and policy
against an independent NumPy LLaMA."""

from __future__ import annotations

import json

import numpy as np
import pytest

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
    data = g.to_dict()
    data["nodes"][1]["op"] = op
    return data


def test_an_unknown_op_in_a_taskgraph_file_names_the_vertex_and_the_known_ops(tmp_path):
    path = tmp_path / "tg.json"
    path.write_text(json.dumps(_graph_with_op("flash_attention")))
    with pytest.raises(GraphError) as err:
        TaskGraph.from_json(path)
    message = str(err.value)
    assert "vertex 'b'" in message and "unknown op 'flash_attention'" in message
    assert all(name in message for name in OPS)
    with pytest.raises(GraphError, match="vertex 'b'.*bad parameter"):
        TaskGraph.from_dict(_graph_with_op("rotary:angle=3"))
    assert TaskGraph.from_dict(_graph_with_op("rotary:offset=3"))["b"].op == "rotary:offset=3"


def test_an_unknown_op_in_a_memgraph_file_names_the_vertex():
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.memgraph import MemGraph
    from offloadlab.planner import plan
    g = TaskGraph.from_dict(_graph_with_op("rotary:offset=3"))
    data = plan(g, machine_from_spec("p100x4"), "buildmemgraph").to_dict()
    node = next(n for n in data["nodes"] if n["id"] == "b")
    node["op"] = "rotary:offset=three"
    with pytest.raises(GraphError, match="vertex 'b'.*must be an integer"):
        MemGraph.from_dict(data)
