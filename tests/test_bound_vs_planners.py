"""The MILP value is a lower bound: on random chains it is never below Σu and never above any
planner's steady-state iteration time (issue 4, "What must hold")."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_weight_offload import FRACTIONS, PLANNER_NAMES, V100, chains, generous, tightest

from offloadlab.ilp import lower_bound, transfer_bound
from offloadlab.planner.weight_offload import schedule_for

BANDWIDTHS = st.sampled_from([1e9, 4e9, 12e9, 50e9])


@given(chains(5), FRACTIONS, BANDWIDTHS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_bound_between_sum_u_and_every_planner(chain, fraction, bandwidth):
    low, high = tightest(chain, 1), generous(chain, 1)
    machine = replace(V100, gpu_memory=int(low + fraction * (high - low)),
                      h2d_bandwidth=bandwidth, d2h_bandwidth=bandwidth)
    bound = lower_bound(chain, machine.gpu_memory, bandwidth).bound
    assert bound >= chain.sum_u * (1 - 1e-6)   # the solver works to ~1e-7 relative
    for planner in PLANNER_NAMES:
        period = schedule_for(planner, chain, machine).iteration_time
        assert bound <= period * (1 + 1e-6) + 1e-9, (planner, bound, period)


@given(chains(5), FRACTIONS, BANDWIDTHS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_solved_bound_implies_the_transfer_volume_bound(chain, fraction, bandwidth):
    """The closed-form floor is implied by eqs. (2), (4), (5): the solved MILP never beats it,
    and no planner does either."""
    from offloadlab.ilp.milp import Milp, _solve_cbc
    low, high = tightest(chain, 1), generous(chain, 1)
    memory = int(low + fraction * (high - low))
    floor = transfer_bound(chain, memory, bandwidth)
    model = Milp(chain, memory, bandwidth, bandwidth)
    status, _, primal = _solve_cbc(model.prob, None, False, 1e-9)
    assert status == "optimal"
    assert chain.sum_u + model.tau * primal >= floor * (1 - 1e-6)
    machine = replace(V100, gpu_memory=memory, h2d_bandwidth=bandwidth, d2h_bandwidth=bandwidth)
    assert schedule_for("greedy-offload", chain, machine).iteration_time >= floor * (1 - 1e-9)


def test_transfer_bound_by_hand():
    from offloadlab.core.workloads import TrainingChain
    c = TrainingChain((1.0, 1.0), (1.0, 1.0), (100, 100), (10, 10), 0)
    # B_2 needs 2*100 + 20 = 220 bytes; with 250 bytes, 100 - 30 = 70 bytes of w_1 must be away
    assert transfer_bound(c, 250, 10.0) == pytest.approx(7.0)
    assert transfer_bound(c, 10**6, 10.0) == 0.0
