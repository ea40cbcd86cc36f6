"""Errors raised for bad input; the CLI turns each into a message and exit code 2."""


class OffloadlabError(Exception):
    """Base class of every error offloadlab raises for bad input or impossible requests."""


class GraphError(OffloadlabError):
    """A TaskGraph or MemGraph is malformed (cycle, unknown vertex, bad size, ...)."""


class PlanError(OffloadlabError):
    """A planner cannot produce a MemGraph (for example a vertex does not fit on its GPU)."""


class HostMemoryError(PlanError):
    """A plan holds more in host RAM at once than the machine's ``host_memory``."""


class SpecError(OffloadlabError):
    """A ``NAME:key=value,...`` specification names an unknown thing or a bad value."""


class VerificationError(OffloadlabError):
    """A MemGraph breaks one of the correctness rules of docs/design.md."""
