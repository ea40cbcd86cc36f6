"""The verifier's interval map (core/intervals.py) against a map of every byte."""

from hypothesis import given, settings
from hypothesis import strategies as st

from offloadlab.core.intervals import LastWriter

SPACE = 64


@given(block=st.sampled_from([1, 2, 3, 256]),
       writes=st.lists(st.tuples(st.integers(0, SPACE - 1), st.integers(0, SPACE)), max_size=120))
@settings(max_examples=300, deadline=None)
def test_last_writer_agrees_with_a_map_of_every_byte(block, writes):
    """Any sequence of overwrites (empty ones too), with blocks small enough to split and to be
    spanned: each returns the writers of the bytes it covers, each once, in address order, and
    the blocks stay sorted, disjoint and described by their first starts."""
    owner: list[str | None] = [None] * SPACE
    lw = LastWriter(block)
    for k, (start, length) in enumerate(writes):
        end = min(start + length, SPACE)
        writer = f"w{k}"
        expected = list(dict.fromkeys(w for w in owner[start:end] if w is not None))
        assert lw.writers(start, end) == expected
        assert lw.overwrite(start, end, writer) == expected
        owner[start:end] = [writer] * (end - start)
        flat = [item for items in lw.blocks for item in items]
        assert all(items for items in lw.blocks)
        assert all(len(items) <= 2 * block for items in lw.blocks)
        assert lw.firsts == [items[0].start for items in lw.blocks]
        assert all(a.end <= b.start for a, b in zip(flat, flat[1:]))
        assert [x.writer for x in flat for _ in range(x.start, x.end)] == \
            [w for w in owner if w is not None]
        assert all(owner[x.start:x.end] == [x.writer] * (x.end - x.start) for x in flat)


def test_an_overwrite_across_many_writers_names_each_once_in_address_order():
    """Past a few previous writers, repeats are found in a set: each still once, in order."""
    lw = LastWriter(block=4)
    for k in range(200):
        lw.overwrite(k, k + 1, f"w{k % 50}")
    assert lw.overwrite(0, 200, "all") == [f"w{k}" for k in range(50)]
    assert [x.writer for items in lw.blocks for x in items] == ["all"]
