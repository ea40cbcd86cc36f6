"""lab layer (see docs/design.md): experiments (compare), plots and the ``offloadlab`` CLI.

Importing it is cheap: pandas, matplotlib and the simulator load when first used.
"""

from .compare import COLUMNS, Run, compare, run_all, table
from .plots import gantt, lane_key, memory_plot

__all__ = ["COLUMNS", "Run", "compare", "run_all", "table", "gantt", "lane_key", "memory_plot"]
