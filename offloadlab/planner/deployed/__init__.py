"""The offload schemes users deploy, as planners: ``accelerate-offload`` (Hugging Face
Accelerate), ``zero-offload`` (DeepSpeed ZeRO-Offload) and ``fsdp-cpu-offload`` (PyTorch FSDP
with ``CPUOffload(offload_params=True)``); docs/deployed.md."""

from . import accelerate, fsdp, zero  # noqa: F401
