"""offloadlab: plan, simulate and execute CPU-RAM offload of GPU computations.

Layers (imports point down): ``core`` <- ``planner``, ``ilp`` <- ``simulator``,
``executor`` <- ``lab``.  See docs/design.md.
"""

__version__ = "0.1.0"
