"""Export the TaskGraphs of offloadlab's ``model`` workload: small versions of five real
networks, written in plain PyTorch here, traced with :func:`offloadlab.core.workloads.from_torch`
for inference and for one training step on 1, 2 and 3 GPUs.

    pip install ".[torch]" && python offloadlab/data/models/export.py

writes ``<model>-<infer|train>-g<N>.json`` beside this file (``--out DIR`` elsewhere,
``--only NAME`` for one model).  Models are built on the meta device: no weight is allocated.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from offloadlab.core.formats import to_json
from offloadlab.core.taskgraph import TaskGraph
from offloadlab.core.workloads.from_torch import from_torch

HERE = Path(__file__).resolve().parent
MODES = ("infer", "train")
GPUS = (1, 2, 3)


# -- MLP -----------------------------------------------------------------------------------
class MLP(nn.Module):
    """``depth`` Linear layers with ReLU between them."""

    def __init__(self, width: int = 512, depth: int = 24, classes: int = 10):
        super().__init__()
        dims = [width] * depth + [classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == len(self.layers) - 1 else F.relu(layer(x))
        return x


# -- ResNet-18 -----------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    """ResNet-18 (He et al.): a 7x7 stem and max-pool, BasicBlocks [2, 2, 2, 2] of widths
    ``width * (1, 2, 4, 8)``, global average pool, a linear classifier."""

    def __init__(self, width: int = 32, classes: int = 100):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], width
        for i, n in enumerate((2, 2, 2, 2)):
            cout = width * 2 ** i
            for j in range(n):
                blocks.append(BasicBlock(cin, cout, 2 if j == 0 and i > 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(x.mean(dim=(2, 3)))


# -- transformers --------------------------------------------------------------------------
def heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, T, n*d]`` -> ``[B, n, T, d]``."""
    b, t, c = x.shape
    return x.view(b, t, n, c // n).transpose(1, 2)


def merge(x: torch.Tensor) -> torch.Tensor:
    """``[B, n, T, d]`` -> ``[B, T, n*d]``."""
    b, n, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, n * d)


class BertLayer(nn.Module):
    """Post-LayerNorm encoder layer: self-attention, then a GELU MLP."""

    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.attn_out = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.ln2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (heads(f(x), self.n_heads) for f in (self.query, self.key, self.value))
        att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
        x = self.ln1(x + self.attn_out(merge(att @ v)))
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class Bert(nn.Module):
    """BERT (Devlin et al.): word, position and token-type embeddings, ``depth`` encoder
    layers, the masked-LM head (dense, GELU, LayerNorm, decoder tied to the word embeddings)."""

    position_ids: torch.Tensor
    type_ids: torch.Tensor

    def __init__(self, vocab: int = 4096, dim: int = 256, depth: int = 4, n_heads: int = 4,
                 seq: int = 64):
        super().__init__()
        self.words, self.positions = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.types = nn.Embedding(2, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList(BertLayer(dim, n_heads) for _ in range(depth))
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim))
        self.decoder = nn.Linear(dim, vocab)
        self.decoder.weight = self.words.weight
        self.register_buffer("position_ids", torch.arange(seq), persistent=False)
        self.register_buffer("type_ids", torch.zeros(seq, dtype=torch.long), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.words(ids) + self.positions(self.position_ids[:t]) + self.types(self.type_ids[:t])
        x = self.ln(x)
        for layer in self.layers:
            x = layer(x)
        return self.decoder(self.head(x))


class GPT2Block(nn.Module):
    """Pre-LayerNorm decoder block: causal self-attention, then a GELU (tanh) MLP."""

    causal: torch.Tensor

    def __init__(self, dim: int, n_heads: int, seq: int):
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.c_fc, self.mlp_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        q, k, v = (heads(y, self.n_heads) for y in self.c_attn(self.ln1(x)).split(x.shape[-1], 2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        att = torch.softmax(att.masked_fill(~self.causal[:t, :t], float("-inf")), dim=-1)
        x = x + self.c_proj(merge(att @ v))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """GPT-2 (Radford et al.): token and position embeddings, ``depth`` decoder blocks, a
    final LayerNorm and the LM head tied to the token embeddings."""

    def __init__(self, vocab: int = 4096, dim: int = 256, depth: int = 4, n_heads: int = 4,
                 seq: int = 64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(GPT2Block(dim, n_heads, seq) for _ in range(depth))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaBlock(nn.Module):
    """Pre-RMSNorm block: causal attention with rotary position embeddings (fused
    ``scaled_dot_product_attention``), then a SwiGLU MLP."""

    def __init__(self, dim: int, n_heads: int, hidden: int):
        super().__init__()
        self.n_heads = n_heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)
        q, k, v = (heads(w(h), self.n_heads) for w in (self.wq, self.wk, self.wv))
        q, k = (y * cos + rotate_half(y) * sin for y in (q, k))
        x = x + self.wo(merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        h = self.mlp_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    """LLaMA (Touvron et al.): token embeddings, ``depth`` blocks, a final RMSNorm and an
    untied output projection; rotary tables as buffers."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, vocab: int = 4096, dim: int = 256, depth: int = 4, n_heads: int = 4,
                 hidden: int = 688, seq: int = 64):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(LlamaBlock(dim, n_heads, hidden) for _ in range(depth))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        d = dim // n_heads
        angles = torch.outer(torch.arange(seq).float(),
                             1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.tok(ids)
        for block in self.blocks:
            x = block(x, self.cos[:t], self.sin[:t])
        return self.output(self.norm(x))


# -- export --------------------------------------------------------------------------------
BATCH, SEQ = 4, 64


def tokens() -> torch.Tensor:
    return torch.empty(BATCH, SEQ, dtype=torch.long, device="meta")


# name -> (module factory, input, training loss, its target)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], torch.Tensor], str,
                        Callable[[], torch.Tensor | None]]] = {
    "mlp": (MLP, lambda: torch.empty(256, 512, device="meta"), "cross_entropy",
            lambda: torch.empty(256, dtype=torch.long, device="meta")),
    "resnet18": (ResNet18, lambda: torch.empty(8, 3, 64, 64, device="meta"), "cross_entropy",
                 lambda: torch.empty(8, dtype=torch.long, device="meta")),
    "bert": (Bert, tokens, "cross_entropy", tokens),
    "gpt2": (GPT2, tokens, "cross_entropy", tokens),
    "llama": (Llama, tokens, "cross_entropy", tokens),
}


def export(name: str, mode: str, gpus: int) -> TaskGraph:
    """The TaskGraph of model ``name`` for ``mode`` (``infer`` or ``train``) on ``gpus`` GPUs."""
    make, data, loss, target = MODELS[name]
    with torch.device("meta"):
        module = make()
    return from_torch(module, data(), train=mode == "train", gpus=gpus,
                      name=f"{name}-{mode}-g{gpus}", loss=loss,
                      target=target() if mode == "train" else None, optimizer="adam")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="directory (default: beside "
                        "this script)")
    parser.add_argument("--only", choices=sorted(MODELS), help="export one model")
    args = parser.parse_args()
    for name in [args.only] if args.only else MODELS:
        for mode in MODES:
            for gpus in GPUS:
                graph = export(name, mode, gpus)
                path = args.out / f"{name}-{mode}-g{gpus}.json"
                to_json(graph, path)
                print(f"{path.name}: {len(graph)} vertices, "
                      f"{sum(t.bytes for t in graph) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
