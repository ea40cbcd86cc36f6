"""The compiled planner core (README, Performance): .ci/run's second pass sets
OFFLOADLAB_EXPECT_COMPILED=1 after a mypyc build, so that the suite provably ran compiled."""

import os

import pytest

from offloadlab.core import memgraph
from offloadlab.planner import allocator, buildmemgraph


@pytest.mark.skipif(os.environ.get("OFFLOADLAB_EXPECT_COMPILED") != "1",
                    reason="only in .ci/run's pass over the mypyc build")
def test_the_planner_core_is_compiled():
    for module in (allocator, buildmemgraph, memgraph):
        assert module.__file__.endswith((".so", ".pyd")), module.__file__
