"""Weight offloading for training chains (Beaumont et al., "Weight Offloading Strategies for
Training Large DNN Models"): Algorithm 1 (selection), Algorithm 2 and L2L (analytic
steady-state schedules), their MemGraphs, and the planners ``greedy-offload``,
``greedy-offload-nodiscount``, ``l2l`` and ``ilp-select``."""

from .memgraph import to_memgraph
from .planners import SCHEDULERS, ilp_selection, schedule_for, steady_state_iteration_time
from .schedule import Event, Schedule, algorithm2, l2l
from .selection import check_fits, greedy_selection

__all__ = ["SCHEDULERS", "Event", "Schedule", "algorithm2", "check_fits", "greedy_selection",
           "ilp_selection", "l2l", "schedule_for", "steady_state_iteration_time", "to_memgraph"]
