"""Progress of the command line's long work on stderr: one tqdm bar per phase (reading,
building, planning, verifying, simulating, running, writing), counting vertices where the
phase reports them, and a bar of steps for the commands that repeat a phase (``ablate``,
``validate``), each step named as it starts, with the count and an estimate of the time
left.  Shown on a terminal, or everywhere with ``--progress``; never with ``--quiet``.  On a
terminal bars are cleared when their phase ends, so that a command's own output stays as it
was; elsewhere (a log file, a pipe) each phase ends its line, so that what follows, such as
``offloadlab: interrupted``, starts a line of its own.

Whether shown or not, the phases are kept, so that a command that runs out of memory can
say what it was doing (:func:`ran_out_while`)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Report = Callable[[int], None]
"""``report(done)``: how many of the phase's ``total`` units are done."""

Step = Callable[[str], None]
"""``step(line)``: the next step starts; ``line`` says what it does."""

_doing: list[str] = []
_ran_out: str | None = None         # the innermost phase that ran out of memory


def ran_out_while() -> str | None:
    """What the innermost phase was doing when it ran out of memory (a ``MemoryError`` left it);
    forgotten once asked.

    Returns
    -------
    str or None
        E.g. ``"building random:..."``, or None.
    """
    global _ran_out
    what, _ran_out = _ran_out, None
    return what


def _ignore(done: int) -> None:
    pass


class Phases:
    """Progress bars for the phases of one command (disabled: every call costs nothing but
    keeping :func:`doing`)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    @contextmanager
    def phase(self, name: str, total: int | None = None, unit: str = "vertex"
              ) -> Iterator[Report]:
        """A bar named ``name`` for the duration of the ``with`` block.

        Parameters
        ----------
        name : str
            What the phase does (``"planning with buildmemgraph"``).
        total : int, optional
            How many units the phase does, if known.
        unit : str
            What it counts.

        Yields
        ------
        Report
            ``report(done)``, which the block calls with how many units are done (a no-op when
            disabled or without a ``total``).
        """
        with _kept(name):
            if not self.enabled:
                yield _ignore
                return
            if total is None:
                with _bar(desc=name, bar_format="{desc} ..."):
                    yield _ignore
                return
            with _bar(desc=name, total=total, unit=unit, mininterval=0.25,
                      unit_scale=True) as bar:
                def report(done: int) -> None:
                    bar.update(done - bar.n)
                yield report

    @contextmanager
    def steps(self, name: str, total: int) -> Iterator[Step]:
        """A bar of ``total`` steps for the ``with`` block.

        The bar shows the line of the step running, how many steps are done, and the time left at
        the pace so far (tqdm's estimate).

        Parameters
        ----------
        name : str
            What the steps do.
        total : int
            How many there are.

        Yields
        ------
        Step
            ``step(line)``, which the block calls as each step starts.
        """
        with _kept(name):
            if not self.enabled:
                yield lambda line: _set_doing(f"{name}: {line}")
                return
            with _bar(desc=name, total=total, unit="step", mininterval=0.25,
                      bar_format="{desc}: {n}/{total} steps, {elapsed} so far, "
                      "{remaining} left{postfix}") as bar:
                started = False

                def step(line: str) -> None:
                    nonlocal started
                    _set_doing(f"{name}: {line}")
                    if started:
                        bar.update(1)
                    started = True
                    bar.set_postfix_str(line.rstrip(". "))
                yield step


@contextmanager
def _bar(**options: Any) -> Iterator[Any]:
    """A tqdm bar on stderr for the ``with`` block, closed after it (off a terminal its last
    line stays, so that the line ends).  It is drawn only once made, inside the block: a
    signal that lands while it is made leaves nothing on stderr to end or clear."""
    from tqdm import tqdm

    bar = tqdm(file=sys.stderr, leave=_leave(), delay=math.inf, **options)
    try:
        bar.delay = 0
        bar.refresh()
        yield bar
    finally:
        bar.close()


def _leave() -> bool:
    """Whether a bar's last line stays when it closes: off a terminal, so that the line ends."""
    try:
        return not sys.stderr.isatty()
    except (AttributeError, ValueError):        # no stderr, or a closed one
        return True


@contextmanager
def _kept(name: str) -> Iterator[None]:
    """Keep the phase ``name`` for the ``with`` block (:func:`ran_out_while`)."""
    global _ran_out
    _doing.append(name)
    try:
        yield
    except MemoryError:
        _ran_out = _ran_out or _doing[-1]
        raise
    finally:
        _doing.pop()


def _set_doing(what: str) -> None:
    """The innermost phase is now doing ``what``."""
    if _doing:
        _doing[-1] = what
