"""The shared vocabulary: TaskGraph, MemGraph, Machine (+ cost model), Trace, verifier,
workloads, and the graphs' files (:mod:`.formats`)."""

from .errors import GraphError, OffloadlabError, PlanError, SpecError, VerificationError
from .machine import PRESETS, Machine, machine_from_spec
from .memgraph import Loc, MemGraph, MemVertex
from .presets import HOST_MEMORY
from .taskgraph import Task, TaskGraph

__all__ = ["GraphError", "OffloadlabError", "PlanError", "SpecError", "VerificationError",
           "PRESETS", "HOST_MEMORY", "Machine", "machine_from_spec", "Loc", "MemGraph", "MemVertex",
           "Task", "TaskGraph"]
