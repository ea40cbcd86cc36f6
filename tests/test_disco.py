"""DISCO Figs. 2-3: on ``disco-example`` a chain of n tensor-parallel matmuls takes exactly 3n
time units levelwise and 2n+1 with BuildMemGraph and work-conserving dispatch."""

import pytest

from offloadlab.core.verify import verify
from offloadlab.core.workloads import build_workload
from offloadlab.planner import plan
from offloadlab.simulator import simulate


@pytest.mark.parametrize("n", range(1, 21))
def test_levelwise_3n_and_dynamic_2n_plus_1(disco, n):
    g = build_workload(f"matmul-chain:layers={n}")
    levelwise = plan(g, disco, "levelwise")
    turnip = plan(g, disco, "buildmemgraph")
    for mg in (levelwise, turnip):
        verify(mg, g, disco)
        assert mg.count("offload") == mg.count("reload") == 0
    assert simulate(levelwise, disco, "dynamic").makespan == 3 * n
    result = simulate(turnip, disco, "dynamic")
    assert result.makespan == 2 * n + 1
    assert result.busy["bus:h2d"] == 2 * n            # the host bus never idles
    assert max(result.peak_memory[d] for d in disco.gpu_names()) <= disco.gpu_memory


def test_fixed_order_is_no_faster(disco):
    g = build_workload("matmul-chain:layers=6")
    mg = plan(g, disco, "buildmemgraph")
    assert simulate(mg, disco, "fixed").makespan >= simulate(mg, disco, "dynamic").makespan
