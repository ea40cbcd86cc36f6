"""Gemini's options."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.errors import PlanError
from ...core.machine import MiB
from ..registry import Options, option

EVICTIONS = ("opt", "lru")
MAX_TRIES = 65537       # chunk sizes a search may try (Colossal-AI's default: 8193)


@dataclass(frozen=True)
class GeminiOptions(Options):
    chunk_size: int = option(32 * MiB, "bytes of parameters a chunk holds (a larger parameter "
                                       "is a chunk of its own)")
    warmup_share: float = option(0.3, "share of GPU memory model data may use in the warm-up "
                                      "iteration, in (0, 1] (Gemini's 30%)")
    eviction: str = option("opt", "which HOLD chunk moves to host RAM: opt (needed latest, "
                                  "Gemini's) or lru (least recently used)")
    search_range: int = option(0, "bytes above the least chunk size (chunk_size, or the "
                                  "largest parameter) over which the chunk size is searched "
                                  "(Colossal-AI's search_range_m; 0: chunk_size as given)")
    search_interval: int = option(4096, "step of the chunk size search in bytes "
                                        "(Colossal-AI's hidden_dim: 1024 fp32 elements)")
    grad_chunks: bool = option(False, "gradients in chunks of their own that mirror the "
                                      "parameters' (Colossal-AI's grad chunks, GeminiDDP "
                                      "without master weights); false: in their parameter's")
    max_prefetch: int = option(0, "chunks per GPU whose loads may be in flight ahead of the "
                                  "operators that need them (GeminiDDP's max_prefetch; 0: "
                                  "every load on demand, Colossal-AI's default)")

    def __post_init__(self) -> None:
        if type(self.chunk_size) is not int or self.chunk_size <= 0:
            raise PlanError(f"gemini: chunk_size must be a positive number of bytes, got "
                            f"{self.chunk_size!r}")
        share = self.warmup_share
        if type(share) not in (int, float) or not 0 < share <= 1:
            raise PlanError(f"gemini: warmup_share must be in (0, 1], got {share!r}")
        if self.eviction not in EVICTIONS:
            raise PlanError(f"gemini: unknown eviction {self.eviction!r}; use "
                            f"{' or '.join(EVICTIONS)}")
        if type(self.search_range) is not int or self.search_range < 0:
            raise PlanError(f"gemini: search_range must be a number of bytes >= 0, got "
                            f"{self.search_range!r}")
        if type(self.search_interval) is not int or self.search_interval <= 0:
            raise PlanError(f"gemini: search_interval must be a positive number of bytes, "
                            f"got {self.search_interval!r}")
        tries = self.search_range // self.search_interval + 1
        if tries > MAX_TRIES:
            raise PlanError(f"gemini: search_range={self.search_range} in steps of "
                            f"search_interval={self.search_interval} is {tries} chunk sizes "
                            f"to try, more than {MAX_TRIES}")
        if type(self.max_prefetch) is not int or self.max_prefetch < 0:
            raise PlanError(f"gemini: max_prefetch must be a number of chunks >= 0, got "
                            f"{self.max_prefetch!r}")

