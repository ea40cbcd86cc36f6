"""Progress of the command line's long phases on stderr (reading, building, planning,
verifying, simulating, writing): one tqdm bar per phase, counting vertices where the phase
reports them.  Shown on a terminal, or everywhere with ``--progress``; never with ``--quiet``.
Bars are cleared when their phase ends, so that a command's own output stays as it was."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

Report = Callable[[int], None]
"""``report(done)``: how many of the phase's ``total`` units are done."""


def _ignore(done: int) -> None:
    pass


class Phases:
    """Progress bars for the phases of one command (disabled: every call costs nothing)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    @contextmanager
    def phase(self, name: str, total: int | None = None, unit: str = "vertex"
              ) -> Iterator[Report]:
        """A bar named ``name`` for the duration of the ``with`` block; the block gets a
        ``report(done)`` callback (a no-op when disabled or without a ``total``)."""
        if not self.enabled:
            yield _ignore
            return
        from tqdm import tqdm

        if total is None:
            bar = tqdm(desc=name, file=sys.stderr, leave=False, bar_format="{desc} ...")
            report: Report = _ignore
        else:
            bar = tqdm(desc=name, total=total, unit=unit, file=sys.stderr, leave=False,
                       mininterval=0.25, unit_scale=True)

            def report(done: int) -> None:
                bar.update(done - bar.n)
        try:
            yield report
        finally:
            bar.close()
