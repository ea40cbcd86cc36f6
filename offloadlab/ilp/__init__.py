"""ilp layer (see docs/design.md): MILP models, solved with PuLP (CBC bundled, HiGHS optional)."""

from .milp import IlpResult, lower_bound, transfer_bound

__all__ = ["IlpResult", "lower_bound", "transfer_bound"]
