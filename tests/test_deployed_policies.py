"""Issue 45's goals for the deployed schemes, each scheme on a small graph it plans: its plan
passes the verifier and executes to the reference on the numpy backend under every dispatch
policy, and on random problems busy + attributed idle = makespan on every GPU of its
simulated trace under every policy."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_explain import adds_up
from test_properties import SETTINGS

from offloadlab.core.dispatch import POLICIES
from offloadlab.core.errors import PlanError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.executor import check_outputs, execute, reference_outputs
from offloadlab.lab.explain import explain
from offloadlab.planner import PLANNERS, plan
from offloadlab.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_deployed import DEPLOYED  # noqa: E402

TRAIN = ("training-chain:w=64KB;48KB;64KB,a=16KB;24KB;16KB,uF=0.01;0.01;0.01,"
         "uB=0.02;0.02;0.02,iterations=2")
GENERATE = "llama-generate:model=tiny,seq=8,block=4,gen=2"
HOST = "flexgen:w_gpu_percent=0,cache_gpu_percent=0,act_gpu_percent=0"
CASES = [("torch-compile-offload", TRAIN), ("torchtune-offload", TRAIN),
         ("zero-offload", TRAIN), ("fsdp-cpu-offload:min_num_params=10000", TRAIN),
         ("accelerate-offload", TRAIN), ("accelerate-offload", GENERATE),
         ("flexgen", GENERATE), (HOST, GENERATE)]
MACHINE = machine_from_spec("p100x4:gpus=1,gpu_memory=1GB")


def test_every_deployed_scheme_is_a_case():
    assert {spec.split(":")[0] for spec, _ in CASES} == set(DEPLOYED) <= set(PLANNERS)


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "workload"), CASES)
def test_every_scheme_executes_to_the_reference_under_every_policy(spec, workload):
    graph = build_workload(workload)
    mg = plan(graph, MACHINE, spec)
    verify(mg, graph, MACHINE)
    assert mg.count("load") + mg.count("offload") > 0       # it moves something
    reference = reference_outputs(graph)
    for policy in POLICIES:
        for seed in range(1 if policy in ("dynamic", "fixed") else 2):
            run = execute(mg, MACHINE, policy=policy, seed=seed, rate_limit=False, poison=True)
            wrong = check_outputs(run.outputs, reference)
            assert wrong is None, f"{spec} on {workload}, {policy}, seed {seed}: {wrong}"


def _chain(draw) -> str:
    layers = draw(st.integers(1, 4))
    sizes = st.integers(1, 64).map(lambda k: str(k * 4096))
    w = ";".join(draw(sizes) for _ in range(layers))
    a = ";".join(draw(sizes) for _ in range(layers))
    u = ";".join(["0.01"] * layers)
    return f"training-chain:w={w},a={a},uF={u},uB={u},iterations={draw(st.integers(1, 3))}"


def _generation(draw) -> str:
    seq = draw(st.sampled_from([4, 8, 12]))
    return (f"llama-generate:model=tiny,seq={seq},block={draw(st.sampled_from([4, seq]))},"
            f"batch={draw(st.integers(1, 2))},gen={draw(st.integers(1, 3))}")


@settings(max_examples=60, **SETTINGS)
@given(data=st.data(), spec=st.sampled_from([spec for spec, _ in CASES]),
       policy=st.sampled_from(list(POLICIES)), memory=st.integers(300_000, 30_000_000),
       noise=st.sampled_from([0.0, 0.3]))
def test_busy_and_attributed_idle_add_up_on_random_plans_of_every_scheme(data, spec, policy,
                                                                         memory, noise):
    if spec.startswith("flexgen"):
        generation = True
    else:
        generation = spec.startswith("accelerate") and data.draw(st.booleans())
    workload = data.draw(st.composite(_generation if generation else _chain)())
    m = machine_from_spec(f"p100x4:gpus=1,gpu_memory={memory}")
    try:
        mg = plan(build_workload(workload), m, spec)
    except PlanError as exc:            # the scheme runs out of memory: nothing to explain
        assert "memory" in str(exc) or "bytes" in str(exc), str(exc)
        return
    trace = simulate(mg, m, policy, noise=noise, seed=1).trace
    adds_up(explain(trace, mg), trace)
