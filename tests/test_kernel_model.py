"""The fitted kernel-time model (``cost=fitted``, docs/cost-model.md): its functional form, the
machine option, and the roofline kept exactly as it was (``cost=roofline``)."""

import hashlib
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core.errors import SpecError
from offloadlab.core.kernel_model import (
    A100_FIT,
    ATTENTION,
    CLASSES,
    ELEMENTWISE,
    H100_FIT,
    OP_CLASSES,
    by_class,
    fit_problem,
    kernel_time,
    op_class,
)
from offloadlab.core.machine import PRESETS, Machine, machine_from_spec
from offloadlab.core.ops import OPS
from offloadlab.core.workloads import build_workload
from offloadlab.lab.cli import main
from offloadlab.planner import plan
from offloadlab.simulator import makespan

FITTED = [name for name, m in PRESETS.items() if m.cost == "fitted"]
DTYPES = ("float16", "float32")
sizes = st.floats(min_value=0.0, max_value=1e15, allow_nan=False)
growth = st.floats(min_value=1.0, max_value=1e3)


def test_the_measured_gpus_presets_are_fitted_and_the_others_not():
    assert FITTED == ["a100x8", "h100-sxm"]
    for name, m in PRESETS.items():
        assert (m.cost == "fitted") == bool(m.kernel_fit), name
        if m.kernel_fit:
            assert fit_problem(m.kernel_fit) is None


def test_every_op_has_a_class():
    assert set(OP_CLASSES) <= set(OPS)
    assert set(OP_CLASSES.values()) | {ELEMENTWISE} == set(CLASSES)
    assert op_class("linear") == "gemm" and op_class("rotary:offset=8") == "rotary"
    assert op_class("softmax") == op_class("generic:aten.cumsum.default") == ELEMENTWISE
    assert op_class(None) == ELEMENTWISE
    attention = ("attn_scores", "softmax_stats", "causal_softmax", "attn_values", "attn_dprobs",
                 "attn_delta", "softmax_backward", "attn_dq", "attn_dk", "attn_dv")
    assert [op for op, cls in OP_CLASSES.items() if cls == ATTENTION] == list(attention)
    assert op_class("causal_softmax:q0=64,k0=0") == ATTENTION and op_class("softmax") == ELEMENTWISE


def test_attention_ops_take_the_attention_fit():
    """A blocked attention op is priced by the attention class's parameters, not the GEMMs'."""
    m = PRESETS["a100x8"]
    fit = by_class(m.kernel_fit)
    flops, touched = 2.0 * 128 * 1024 * 1024, 2 * (2 * 1024 * 128 + 1024 * 1024)
    seconds = m.duration("compute", "gpu0", 0, flops, touched, op="attn_scores",
                         dtype="float16")
    assert seconds == kernel_time(fit[ATTENTION], flops, touched, m.gpu_half_flops,
                                  m.gpu_mem_bandwidth)
    assert seconds != kernel_time(fit["gemm"], flops, touched, m.gpu_half_flops,
                                  m.gpu_mem_bandwidth)


@settings(max_examples=200, deadline=None)
@given(preset=st.sampled_from(FITTED), op=st.sampled_from(sorted(OPS)),
       dtype=st.sampled_from(DTYPES), flops=sizes, touched=sizes, more=growth)
def test_fitted_time_grows_with_flops_and_bytes(preset, op, dtype, flops, touched, more):
    m = PRESETS[preset]

    def t(f, b):
        return m.duration("compute", "gpu0", 0, f, b, op=op, dtype=dtype)
    assert t(flops * more, touched) >= t(flops, touched)
    assert t(flops, touched * more) >= t(flops, touched)


@settings(max_examples=200, deadline=None)
@given(preset=st.sampled_from(FITTED), op=st.sampled_from(sorted(OPS)),
       dtype=st.sampled_from(DTYPES), flops=sizes, touched=sizes)
def test_fitted_kernels_never_beat_the_roofline_rates(preset, op, dtype, flops, touched):
    """A fitted kernel takes at least what the roofline's peak rates allow, and at least its
    class's latency; an attention kernel at least its flops at the peak rate (a fused kernel
    does not move the score blocks' bytes its unfused ops declare)."""
    fitted = PRESETS[preset]
    roofline = machine_from_spec(f"{preset}:cost=roofline")
    latency = by_class(fitted.kernel_fit)[op_class(op)][2]
    moved = 0.0 if op_class(op) == ATTENTION else touched
    rates = roofline.duration("compute", "gpu0", 0, flops, moved, op=op, dtype=dtype) \
        - roofline.kernel_latency
    seconds = fitted.duration("compute", "gpu0", 0, flops, touched, op=op, dtype=dtype)
    assert seconds >= rates * (1 - 1e-12) and seconds >= latency


@pytest.mark.parametrize("preset", FITTED)
def test_fitted_is_slower_than_the_roofline_on_llama_shapes(preset):
    """A 7B layer's projection, norm and SwiGLU at 4096 tokens in float16: each slower than the
    roofline prices it, none more than 10x slower."""
    fitted, roofline = PRESETS[preset], machine_from_spec(f"{preset}:cost=roofline")
    n, dim, ffn = 4096, 4096, 11008
    kernels = [("linear", 2 * n * dim * dim, 2 * (3 * n * dim)),
               ("rmsnorm", 4 * n * dim, 2 * (2 * n * dim + dim)),
               ("swiglu", 5 * n * ffn, 2 * 3 * n * ffn)]
    for op, flops, touched in kernels:
        slow = fitted.duration("compute", "gpu0", 0, flops, touched, op=op, dtype="float16")
        fast = roofline.duration("compute", "gpu0", 0, flops, touched, op=op, dtype="float16")
        assert fast < slow < 10 * fast, op


def test_kernel_time_blends_the_two_limits():
    """p = 1 is the sum of latency, compute and memory time; p -> large their maximum;
    unlimited rates cost nothing but the latency."""
    assert kernel_time((0.5, 0.5, 1e-6, 1.0), 4.0, 6.0, 2.0, 3.0) == pytest.approx(1e-6 + 8.0)
    assert kernel_time((1.0, 1.0, 0.0, 200.0), 4.0, 6.0, 2.0, 3.0) == pytest.approx(2.0, 1e-2)
    assert kernel_time((1.0, 1.0, 3e-6, 2.0), 1e12, 1e9, float("inf"), float("inf")) == 3e-6
    assert kernel_time((0.9, 0.8, 2e-6, 3.0), 0.0, 0.0, 1e12, 1e9) == 2e-6


def test_measured_rates_and_profiled_times_still_win():
    m = replace(PRESETS["a100x8"], op_rates=(("add", 1e9, 2e9),))
    assert m.op_rates == (("add", 1e9, 2e9, 0.0),)        # a file's entry without overhead
    assert m.duration("compute", "gpu0", 10, 0, 30, op="add") == \
        pytest.approx(m.kernel_latency + 10 / 1e9 + 20 / 2e9)
    assert m.duration("compute", "gpu0", 10, 1e9, 30, time=0.25, op="linear") == 0.25
    assert m.duration("compute", "cpu", 10, 2e12, 30, op="linear") == 1.0


def test_a_measured_op_pays_its_overhead_and_is_never_below_its_flops_at_the_peak_rate():
    """An op measured at small shapes keeps the roofline's compute term: a large kernel of it
    is priced at the GPU's flop rate, not at the bytes it moved when measured small."""
    m = replace(PRESETS["a100x8"], op_rates=(("linear", 1e11, 1e11, 2e-5),))
    small = m.duration("compute", "gpu0", 10, 10.0, 30, op="linear")
    assert small == pytest.approx(m.kernel_latency + 2e-5 + 30 / 1e11)
    big = m.duration("compute", "gpu0", 2**20, 1e13, 2**22, op="linear")
    assert big == pytest.approx(m.kernel_latency + 2e-5 + 1e13 / m.gpu_flops)
    half = m.duration("compute", "gpu0", 2**20, 1e13, 2**22, op="linear", dtype="float16")
    assert half == pytest.approx(m.kernel_latency + 2e-5 + 1e13 / m.gpu_half_flops)


def test_a_folding_ops_flops_are_its_vertexs_and_do_not_price_its_kernel():
    """The random workload's ``mix`` vertices carry the planner's flops, not their kernel's
    work (a fold of bytes): a calibrated machine prices them by their bytes alone, as the
    executor runs them (with the flops they were priced 2-3x slow in bench_validate)."""
    m = replace(PRESETS["a100x8"], op_rates=(("mix", 1e9, 2e9, 0.0),))
    assert m.duration("compute", "gpu0", 10, 1e15, 30, op="mix") == \
        pytest.approx(m.kernel_latency + 10 / 1e9 + 20 / 2e9)


@pytest.mark.parametrize("entry", [["add", 1e9, 1e9, -1e-6], ["add", 1e9, 1e9, float("inf")],
                                   ["add", 1e9, 1e9, 0.0, 1.0], ["add", 1e9]])
def test_a_machine_file_with_a_bad_op_rate_entry_is_refused_naming_the_field(entry):
    with pytest.raises(SpecError, match="op_rates"):
        Machine.from_dict({**PRESETS["a100x8"].to_dict(), "op_rates": [entry]})


def test_op_rates_with_and_without_overhead_read_back():
    data = PRESETS["a100x8"].to_dict()
    old = Machine.from_dict({**data, "op_rates": [["add", 1e9, 2e9]]})
    new = Machine.from_dict({**data, "op_rates": [["add", 1e9, 2e9, 3e-6]]})
    assert old.op_rates == (("add", 1e9, 2e9, 0.0),)
    assert Machine.from_dict(json.loads(new.to_json())) == new


# -- the option ---------------------------------------------------------------------------------
def test_cost_is_a_spec_option():
    assert machine_from_spec("a100x8").cost == "fitted"
    roofline = machine_from_spec("a100x8:cost=roofline")
    assert roofline.cost == "roofline" and roofline.kernel_fit == ()
    assert machine_from_spec("h100-sxm:cost=fitted") == PRESETS["h100-sxm"]
    assert machine_from_spec("v100:cost=roofline") == PRESETS["v100"]


@pytest.mark.parametrize("spec, message", [
    ("a100x8:cost=magic", "machine 'a100x8': cost must be one of roofline, fitted, got 'magic'"),
    ("v100:cost=fitted", "machine 'v100': cost=fitted needs the fitted kernel parameters "
                         "(kernel_fit), which this machine has not; presets with them: a100x8, "
                         "h100-sxm"),
    ("a100x8:kernel_fit=1", "unknown option(s) kernel_fit"),
])
def test_bad_cost_options_are_refused_by_name(spec, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        machine_from_spec(spec)


# Rows of vidur's A100 attention.csv for Llama-2-7b-hf (FlashAttention, the backend fitted) at
# sourced commit 7ac2fe9 of a copy of vidur (docs/cost-model.md): tensor-parallel degree,
# prefill chunk, cached tokens, the median attn_prefill in ms
VIDUR_PREFILL = [(1, 128, 0, 0.016), (1, 1024, 0, 0.255), (1, 2048, 0, 0.781),
                 (1, 4096, 0, 2.742), (2, 1024, 0, 0.165), (8, 4096, 0, 0.484),
                 (1, 1024, 2048, 0.492), (1, 2560, 1024, 1.412)]


def _vidur_attention_seconds(fit, tp, chunk, cached):
    """The fitted time of one vidur attn_prefill measurement: the toolkit's blocked attention of
    one tensor-parallel worker's heads, priced at the measured A100 80GB's peaks."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import fit_kernels
    row = dict(n_q_head=32, n_embd=4096, num_tensor_parallel_workers=tp, batch_size=1,
               prefill_chunk_size=chunk, kv_cache_size=cached, is_prefill=True)
    kernels, copies = fit_kernels._attention_kernels(type("Row", (), row))
    return copies * sum(kernel_time(fit, f, b, *fit_kernels.PEAKS["a100"]) for f, b in kernels)


def test_the_attention_fit_prices_vidurs_measured_prefill():
    """Each embedded row within the fit's largest error (44.9%, docs/cost-model.md), their
    median within its 90th percentile (24.3%); the H100 takes the A100's fractions."""
    fit = by_class(A100_FIT)[ATTENTION]
    errors = sorted(abs(_vidur_attention_seconds(fit, tp, chunk, cached) / (ms * 1e-3) - 1)
                    for tp, chunk, cached, ms in VIDUR_PREFILL)
    assert errors[-1] <= 0.449 and errors[len(errors) // 2] <= 0.243, errors
    assert by_class(H100_FIT)[ATTENTION] == fit


@pytest.mark.parametrize("change, message", [
    ({"cost": "exact"}, "cost must be one of roofline, fitted, got 'exact'"),
    ({"cost": 1}, "cost must be a string, got 1"),
    ({"cost": "roofline"}, "kernel_fit is given but cost is roofline"),
    ({"kernel_fit": []}, "cost=fitted needs the fitted kernel parameters"),
    ({"kernel_fit": "fast"}, "kernel_fit must be a list of [class, e, beta, latency, p]"),
    ({"kernel_fit": [["gemm", 0.5, 0.5, 1e-6]]}, "kernel_fit entries must be [class, e, beta"),
    ({"kernel_fit": [["conv", 0.5, 0.5, 1e-6, 2.0]]}, "kernel_fit entries must be"),
    ({"kernel_fit": [["gemm", 1.5, 0.5, 1e-6, 2.0]]}, "kernel_fit gemm: needs 0 < e <= 1"),
    ({"kernel_fit": [["gemm", 0.5, 0.5, -1e-6, 2.0]]}, "latency >= 0"),
    ({"kernel_fit": [["gemm", 0.5, 0.5, 1e-6, 0.5]]}, "p >= 1"),
    ({"kernel_fit": [["gemm", 0.5, 0.5, 1e-6, 2.0]]}, "kernel_fit must give each class once"),
    ({"kernel_fit": [["attention", 0.5, 0.0, 1e-6, 2.0]]}, "kernel_fit attention: needs"),
    ({"kernel_fit": [["attention", 0.5, 8.0, 1e-6, 2.0]]}, "kernel_fit must give each class once"),
])
def test_machine_files_check_the_fit(tmp_path, change, message):
    path = tmp_path / "m.json"
    path.write_text(json.dumps(PRESETS["a100x8"].to_dict() | change))
    with pytest.raises(SpecError, match=re.escape(f"machine file '{path}': ") + ".*"
                       + re.escape(message)):
        Machine.from_json_file(path)


def test_a_fitted_machine_file_round_trips_and_takes_overrides(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(PRESETS["h100-sxm"].to_json())
    assert machine_from_spec(str(path)) == PRESETS["h100-sxm"]
    assert machine_from_spec(f"{path}:cost=roofline") == \
        machine_from_spec("h100-sxm:cost=roofline")


# -- cost=roofline is the model as it was --------------------------------------------------------
ROOFLINE_KEYS = ["name", "source", "gpus", "gpu_memory", "gpu_flops", "gpu_half_flops",
                 "gpu_mem_bandwidth", "kernel_latency", "streams", "engine", "h2d_bandwidth",
                 "d2h_bandwidth", "duplex", "link_latency", "host_bus_bandwidth",
                 "gpus_per_bus", "gpu_gpu_bandwidth", "gpu_gpu_latency", "cpu_flops", "op_rates"]


def test_a_roofline_machine_is_written_as_before():
    """No cost and no kernel_fit in its JSON, so MemGraph files and plan hashes keep their
    bytes; an older file (without the fields) reads as the roofline."""
    for name in PRESETS:
        spec = f"{name}:cost=roofline,host_memory=unlimited"      # both fields as before
        data = machine_from_spec(spec).to_dict()
        assert list(data) == ROOFLINE_KEYS, name
        assert Machine.from_dict(data) == machine_from_spec(spec)
    fitted = machine_from_spec("a100x8:host_memory=unlimited").to_dict()
    assert list(fitted) == ROOFLINE_KEYS + ["cost", "kernel_fit"]


# SHA-1 of the presets' JSON before the fitted model, when they were the roofline
ROOFLINE_JSON = {"a100x8": "263f424b3483cf88c3fe58a9da9ae730c49af138",
                 "h100-sxm": "92305e61bd29a9d829bf5fc268f5a560f58e7ad4"}


@pytest.mark.parametrize("preset", sorted(ROOFLINE_JSON))
def test_a_fitted_preset_with_cost_roofline_is_the_old_preset_byte_for_byte(preset):
    text = machine_from_spec(f"{preset}:cost=roofline,host_memory=unlimited").to_json()
    assert hashlib.sha1(text.encode()).hexdigest() == ROOFLINE_JSON[preset]


def test_list_machines_cites_the_fit(capsys):
    assert main(["list", "machines"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    for name in PRESETS:
        cited = "cost=fitted: kernel times fitted" in lines[name] and \
            "vidur" in lines[name] and "vidur@7d47513" in lines[name]
        assert cited == (name in FITTED), name


# makespans on main before the fitted model (a100x8 and h100-sxm were the roofline then)
ROOFLINE_MAKESPANS = {
    ("a100x8", "llama-lora-train:model=tiny,seq=64,batch=2,gpus=2,block=32"):
        0.004897579550287006,
    ("h100-sxm", "llama-prefill:model=tiny,seq=64,batch=2,gpus=2,block=16"):
        0.0025520012322388045,
}


@pytest.mark.parametrize("preset, workload", sorted(ROOFLINE_MAKESPANS))
def test_cost_roofline_keeps_the_old_makespans_exactly(preset, workload):
    machine = machine_from_spec(f"{preset}:cost=roofline,gpus=2")
    graph = build_workload(workload)
    assert makespan(plan(graph, machine), machine) == ROOFLINE_MAKESPANS[preset, workload]
