"""The MILP value is a lower bound: on random chains it is never below Σu and never above any
planner's steady-state iteration time (issue 4, "What must hold")."""

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offloadlab.ilp import lower_bound
from offloadlab.planner.weight_offload import schedule_for

from test_weight_offload import FRACTIONS, PLANNER_NAMES, V100, chains, generous, tightest

BANDWIDTHS = st.sampled_from([1e9, 4e9, 12e9, 50e9])


@given(chains(5), FRACTIONS, BANDWIDTHS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_bound_between_sum_u_and_every_planner(chain, fraction, bandwidth):
    low, high = tightest(chain, 1), generous(chain, 1)
    machine = replace(V100, gpu_memory=int(low + fraction * (high - low)),
                      h2d_bandwidth=bandwidth, d2h_bandwidth=bandwidth)
    bound = lower_bound(chain, machine.gpu_memory, bandwidth).bound
    assert bound >= chain.sum_u * (1 - 1e-9)
    for planner in PLANNER_NAMES:
        period = schedule_for(planner, chain, machine).iteration_time
        assert bound <= period * (1 + 1e-6) + 1e-9, (planner, bound, period)
