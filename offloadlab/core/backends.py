"""The executor's backends as the rest of the toolkit sees them: a name, a description and how
closely its outputs must match the NumPy reference (docs/extending.md, A backend).

The backends are declared here, in ``core``, so that the command line can offer them
(``--backend``) without importing the executor and NumPy; each is implemented by a module of
:mod:`offloadlab.executor` that registers its factory against the name
(:func:`offloadlab.executor.device.backend`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import Registry


@dataclass(frozen=True)
class BackendKind:
    """A backend's description and the ``(rtol, atol)`` its outputs must meet against the
    reference (:func:`offloadlab.executor.check_outputs`)."""

    doc: str
    tolerance: tuple[float, float] = (1e-3, 1e-4)


BACKENDS: Registry[BackendKind] = Registry("backend", listed="valid backends",
                                           doc=lambda b: b.doc)
"""The backends by name, in the order the command line lists them."""

BACKENDS["numpy"] = BackendKind("threads on the CPU (any machine): arenas in host RAM, copies "
                                "paced to the machine's links", tolerance=(1e-5, 1e-6))
BACKENDS["cupy"] = BackendKind("NVIDIA GPUs through CuPy: one arena per GPU, a pinned host "
                               "block, CUDA streams and events", tolerance=(1e-3, 1e-4))
