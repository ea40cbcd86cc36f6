"""The MemGraph by number that BuildMemGraph builds (planner/numbering.py), against the
MemGraph's own methods by id."""

from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core.memgraph import MemGraph, MemVertex
from offloadlab.planner.numbering import Emitted

KINDS = ("data", "memory")


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.lists(st.tuples(st.lists(st.integers(0, 7), max_size=4),
                                             st.integers(0, 7), st.sampled_from(KINDS)),
                                   max_size=30))
def test_emitted_links_as_add_edges_does(n, links):
    """Adding edges by number gives the MemGraph the edges, kinds and dict orders that
    ``add_edges`` by id gives it: self-loops skipped, a data edge never turned into a memory
    edge."""
    by_number, by_id = MemGraph(), MemGraph()
    emitted = Emitted(by_number)
    for k in range(n):
        assert emitted.add(MemVertex(f"v{k}", "compute", "gpu0", 4)) == k
        by_id.add_vertex(MemVertex(f"v{k}", "compute", "gpu0", 4))
    for sources, v, kind in links:
        sources, v = [u % n for u in sources], v % n
        emitted.link(sources, v, kind)
        by_id.add_edges([f"v{u}" for u in sources], f"v{v}", kind)
    assert emitted.ids == list(by_number.vertices)
    assert [list(d.items()) for d in by_number.succ.values()] == \
        [list(d.items()) for d in by_id.succ.values()]
    assert [list(d.items()) for d in by_number.pred.values()] == \
        [list(d.items()) for d in by_id.pred.values()]
