"""The names of the executor's backends, read without importing the executor or NumPy, so that
the command line can offer them (``--backend``).

Each backend is one module, ``offloadlab/executor/NAME_backend.py``, which declares it with
its description and tolerance (:func:`offloadlab.executor.device.backend`; docs/extending.md,
A backend); the executor imports those modules in this order.
"""

from __future__ import annotations

import functools
import pkgutil
from pathlib import Path

SUFFIX = "_backend"
"""How a backend's module name ends."""

REFERENCE = "numpy"
"""The backend every other is checked against, first wherever backends are listed."""


@functools.cache
def backend_names() -> tuple[str, ...]:
    """The backends, one per module ``offloadlab/executor/NAME_backend.py``.

    Returns
    -------
    tuple of str
        ``numpy`` first, then the others by name.
    """
    executor = Path(__file__).resolve().parents[1] / "executor"
    names = [m.name.removesuffix(SUFFIX) for m in pkgutil.iter_modules([str(executor)])
             if m.name.endswith(SUFFIX)]
    return tuple(sorted(names, key=lambda name: (name != REFERENCE, name)))
