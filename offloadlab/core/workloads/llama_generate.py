"""LLaMA generation: the prefill of :mod:`.llama` followed by ``gen`` greedy decode steps,
the workload FlexGen is built for (Sheng et al. 2023, Sec. 3: a prefill over the prompts,
then one token per sequence per step through every layer, attending to the KV cache).

The prefill is ``llama-prefill``'s graph, vertex for vertex; decode step ``t`` (vertices
``d<t>.``) runs every layer on one row per sequence and attends to the sequence's whole KV
cache, whose lifetime the data dependencies make.  The steps, the cache and the outputs:
docs/workloads.md ("LLaMA generation").
"""

from __future__ import annotations

from ..errors import SpecError
from ..taskgraph import TaskGraph
from .llama import (
    CONFIGS,
    DEFAULT_BLOCK,
    LlamaBuilder,
    LlamaConfig,
    check_options,
    llama_vertices,
)
from .registry import workload


def _generate_vertices(o: dict) -> int:
    """The prefill's vertices (:func:`.llama.llama_vertices`) and each decode step's: per
    layer, sequence and head the projections, rotations, statistics and output (7) and a
    score and probability block per key block (the prompt's and one per token so far), each
    GPU's share of the MLP, reductions and gathers, and the embedding and head."""
    prefill, config = llama_vertices(o), CONFIGS.get(o["model"])
    if not prefill or config is None or o["gen"] <= 0:
        return prefill
    gen, batch, gpus = o["gen"], o["batch"], o["gpus"]
    nb = -(-o["seq"] // min(o["block"], o["seq"]))
    keys = gen * nb + gen * (gen + 1) // 2          # key blocks, summed over the steps
    return (prefill + config.layers * batch * (config.heads * (7 * gen + 2 * keys)
                                               + 10 * gpus * gen)
            + batch * (gen + 1) * (6 + gpus))


@workload("llama-generate", vertices=_generate_vertices)
def llama_generate(model: str = "7b", seq: int = 1024, gen: int = 16, batch: int = 1,
                   gpus: int = 1, block: int = DEFAULT_BLOCK, dtype: str = "") -> TaskGraph:
    """Greedy generation with LLaMA ``model``: the prefill of ``batch`` prompts of ``seq``
    tokens (as ``llama-prefill``), then ``gen`` decode steps, each one token per sequence
    through every layer attending to the KV cache; options as ``llama-prefill``'s.

    Parameters
    ----------
    model, seq, batch, gpus, block, dtype
        As :func:`~offloadlab.core.workloads.llama.llama_prefill`'s.
    gen : int
        Decode steps: tokens generated per sequence.

    Returns
    -------
    TaskGraph
        The prefill, then the decode steps.

    Raises
    ------
    SpecError
        A bad option, as ``llama-prefill`` refuses it, or a ``gen`` that is not a positive
        integer.
    """
    config, dtype = check_options("llama-generate", model, seq, batch, gpus, block, dtype)
    if type(gen) is not int or gen <= 0:
        raise SpecError(f"llama-generate: gen must be a positive integer, got {gen!r}")
    return GenerateBuilder(config, model, seq, batch, gpus, min(block, seq), dtype,
                           gen).build()


class GenerateBuilder(LlamaBuilder):
    """The prefill builder, then the decode steps (``step`` > 0 while one is built)."""

    def __init__(self, config: LlamaConfig, model: str, seq: int, batch: int, gpus: int,
                 block: int, dtype: str, gen: int) -> None:
        super().__init__(config, model, seq, batch, gpus, block, dtype)
        self.g.name = f"llama-generate-{model}"
        self.g.meta["gen"] = gen
        self.seq, self.gen, self.step = seq, gen, 0
        self.decoded: dict[tuple[int, int, int], list[tuple[str, int, str, str]]] = {}
        """Per (layer, head, sequence), the key blocks of the tokens decoded so far."""

    def build(self) -> TaskGraph:
        """The prefill, then each decode step: every sequence's next token (``argmax`` of its
        logits), its embedding and every layer on it.

        Returns
        -------
        TaskGraph
            The graph built.
        """
        c, nb = self.c, len(self.starts)
        x, xn = self.embed()
        logits = self.forward(list(range(len(self.rows))), x, xn)
        last = [s * nb + nb - 1 for s in range(self.batch)]   # each sequence's last row
        for t in range(1, self.gen + 1):
            tokens = {r: self.compute(f"{self.prefix}token.s{s}", "argmax", [logits[s]],
                                      self.owner(r), (1,), "int32")
                      for s, r in enumerate(last)}
            self.step, self.prefix = t, f"d{t}."
            for r in last:
                x[r] = self.compute(f"d{t}.embed.b{r}", "embedding",
                                    [tokens[r], "embed"], self.owner(r), (1, c.dim))
                xn[r] = self.norm(f"d{t}.L0.attn_in.b{r}", x[r], "L0.attn_norm", self.owner(r))
            logits = self.forward(last, x, xn)
        return self.g

    def attention(self, layer: int, r: int, s: int, i: int, g: int, xn: str,
                  keys: dict[tuple[int, int], tuple[str, str]]) -> str:
        """In a decode step, GPU ``g``'s heads on sequence ``s``'s token (row ``r``): its
        projections at position ``seq + step - 1`` and attention over the prompt's key
        blocks, the earlier steps' tokens and its own.

        Parameters
        ----------
        layer, r, s, i, g, xn, keys
            As :meth:`LlamaBuilder.attention` takes them.

        Returns
        -------
        str
            The partial output projection.
        """
        if not self.step:
            return super().attention(layer, r, s, i, g, xn, keys)
        nb, q0 = len(self.starts), self.seq + self.step - 1
        outs = []
        for h, (q, k, v) in self.qkv(layer, r, g, xn, 1, q0).items():
            cache = self.decoded.setdefault((layer, h, s), [])
            cache.append((f"t{self.step}", q0, k, v))
            prompt = [(f"k{s * nb + j}", self.starts[j], *keys[h, s * nb + j])
                      for j in range(nb)]
            outs.append(self.attend(layer, r, g, h, q, q0, prompt + cache))
        return self.attn_out(layer, r, g, outs)
