"""Fit the kernel-time model (``cost=fitted``, offloadlab/core/kernel_model.py) to
microsoft/vidur's measured operator times, and report its error per op class (run by hand).

    python bench/fit_kernels.py --vidur PATH --attention CSV... [--commit SHA] [--docs PAGE]

PATH is a git clone of microsoft/vidur (bare or not); its profiling files are read at
``--commit`` with ``git show``, never copied: ``data/profiling/compute/{a100,h100}/MODEL/mlp.csv``
for MODEL ``meta-llama/Llama-2-7b-hf`` and ``meta-llama/Meta-Llama-3-8B`` (vidur has no H100
file for Llama-3-8B).  Each row is one layer's operators at a token count and tensor-parallel
degree, timed in float16 (median of its runs, in ms).  Each operator becomes the toolkit op it
is (:func:`_operators`: its output and input shapes), priced by the toolkit's own flops and
bytes touched.  Per GPU and op class, least squares on the relative error (scipy.optimize)
fits the fractions of the GPU's datasheet peak rates that its kernels achieve, a latency and
the blend exponent; the memory-bound classes keep the flop fraction at 1 and the GEMMs' blend.

Each ``--attention`` CSV has the columns of vidur's ``attention.csv`` (the whole file or rows of
it) and lies at ``.../GPU/ORG/MODEL/attention.csv``, which names its GPU and model.  Each
prefill row (``attn_prefill``: a chunk of tokens after ``kv_cache_size`` cached ones, one
tensor-parallel worker's heads) becomes the toolkit's blocked attention of each of those heads
(:func:`_attention_kernels`), and the attention class is fitted, all four parameters, to the
sum of their times, on the rows of :data:`FITTED_BACKEND` among those
``bench/vidur_attention_rows.csv`` lists (``--every-row``: all); the decode rows
(``attn_decode``) are priced the same way, one query row per sequence, and they and the other
backends' rows are reported, not fitted.  A GPU without attention rows takes the fitted
parameters of the first GPU that has them (the fractions are of each GPU's own peaks).

It prints the fitted parameters, rounded to 4 digits, as the ``kernel_model`` constants (and
exits 1 if those differ from the stored ones), and the median and largest relative error of
the rounded fit per GPU, class and operator (and the share of points within 15%, or within
vidur's 1 us resolution); ``--docs PAGE`` writes that table into PAGE
between the ``<!-- fit_kernels -->`` markers.  Needs scipy (``pip install scipy``).
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from timing import markdown, write_between

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's offloadlab
from offloadlab.core import kernel_model  # noqa: E402
from offloadlab.core.kernel_model import (  # noqa: E402
    ATTENTION,
    CLASSES,
    ELEMENTWISE,
    kernel_time,
    op_class,
)
from offloadlab.core.ops import DTYPES, op_flops, touched_bytes  # noqa: E402

VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
MODELS = ("meta-llama/Llama-2-7b-hf", "meta-llama/Meta-Llama-3-8B")
PEAKS = {"a100": (312e12, 2039e9), "h100": (989e12, 3.35e12)}
"""Datasheet float16 tensor-core flop/s (dense) and memory bytes/s of the GPUs vidur measured
(A100 80GB SXM, H100 SXM5): the fractions fitted are of these."""
STORED = {"a100": "A100_FIT", "h100": "H100_FIT"}
POOLED = ("norm", "rotary", "activation", "add")
"""The classes whose operators together fit the elementwise class (the ops vidur did not
measure): the contiguous memory-bound kernels, not the embedding's gather."""
GOAL = 0.15
RESOLUTION = 1e-6
"""vidur's times are in ms with three decimals."""
MARKER = "<!-- fit_kernels -->"
HALF = DTYPES["float16"]
FITTED_BACKEND = "AttentionBackend.FLASH_ATTENTION"
"""The attention backend whose kernels the attention class is fitted to: FlashAttention, which
has the backward pass that a training step runs; vidur timed Llama-3-8B with FlashInfer, an
inference kernel, whose rows are reported, not fitted."""
ATTENTION_OPS = "attn_scores, softmax_stats, causal_softmax, attn_values"
"""The toolkit ops one vidur attention measurement covers, per head (:func:`_attention_kernels`)."""


def _operators(tokens: int, row: pd.Series) -> dict[str, tuple[str, tuple, list[tuple]]]:
    """vidur's operators of one layer at ``tokens`` tokens as toolkit ops: ``{vidur name: (op,
    output shape, [(input shape, dtype), ...])}``, float16 unless said; the shapes are one
    tensor-parallel worker's."""
    tp, dim = int(row.num_tensor_parallel_workers), int(row.n_embd)
    head = dim // int(row.n_head)
    q, kv = int(row.n_head) // tp * head, int(row.n_kv_head) // tp * head
    ffn, vocab = int(row.n_expanded_embd) // tp, int(row.vocab_size) // tp
    x = ((tokens, dim), "float16")
    return {
        "emb": ("embedding", (tokens, dim), [((tokens,), "int64"), ((vocab, dim), "float16")]),
        "input_layernorm": ("rmsnorm", (tokens, dim), [x, ((dim,), "float16")]),
        "attn_pre_proj": ("linear", (tokens, q + 2 * kv), [x, ((q + 2 * kv, dim), "float16")]),
        "attn_rope": ("rotary", (tokens, q + kv), [((tokens, q + kv), "float16")]),
        "attn_post_proj": ("linear", (tokens, dim), [((tokens, q), "float16"),
                                                     ((dim, q), "float16")]),
        "post_attention_layernorm": ("rmsnorm", (tokens, dim), [x, ((dim,), "float16")]),
        "mlp_up_proj": ("linear", (tokens, 2 * ffn), [x, ((2 * ffn, dim), "float16")]),
        "mlp_act": ("swiglu", (tokens, ffn), [((tokens, ffn), "float16")] * 2),
        "mlp_down_proj": ("linear", (tokens, dim), [((tokens, ffn), "float16"),
                                                    ((dim, ffn), "float16")]),
        "add": ("add", (tokens, dim), [x, x]),
    }


def read(vidur: Path, commit: str) -> pd.DataFrame:
    """A row per GPU, model, tensor-parallel degree, token count and operator: its toolkit op
    and class, flops, bytes touched and measured seconds (the median)."""
    rows = []
    for gpu in PEAKS:
        for model in MODELS:
            path = f"data/profiling/compute/{gpu}/{model}/mlp.csv"
            shown = subprocess.run(["git", "-C", str(vidur), "show", f"{commit}:{path}"],
                                   capture_output=True, text=True)
            if shown.returncode:
                print(f"{gpu} {model}: no {path} at {commit[:12]}, skipped")
                continue
            for _, r in pd.read_csv(io.StringIO(shown.stdout)).iterrows():
                for name, (op, out, ins) in _operators(int(r.num_tokens), r).items():
                    shapes = [shape for shape, _ in ins]
                    sizes = [int(np.prod(shape)) * DTYPES[dtype] for shape, dtype in ins]
                    nbytes = int(np.prod(out)) * HALF
                    rows.append(dict(gpu=gpu, model=model.split("/")[1], operator=name, op=op,
                                     cls=op_class(op), tp=int(r.num_tensor_parallel_workers),
                                     tokens=int(r.num_tokens),
                                     flops=op_flops(op, out, shapes),
                                     touched=touched_bytes(op, nbytes, sizes),
                                     seconds=float(r[f"time_stats.{name}.median"]) * 1e-3))
    return pd.DataFrame(rows)


def _attention_kernels(row: pd.Series) -> tuple[list[tuple[float, int]], int]:
    """One vidur attention row as the toolkit's blocked attention (``core/workloads/llama.py``,
    ``attend``) of one head of one sequence, and how many such heads it times: ``[(flops,
    bytes touched), ...]`` of ``attn_scores`` against each key block, ``softmax_stats``,
    ``causal_softmax`` per key block and ``attn_values``, in float16 with float32 statistics.
    A prefill row is a query block of ``prefill_chunk_size`` tokens whose keys are the
    ``kv_cache_size`` cached tokens (one block) and its own; a decode row one query token per
    sequence against its ``kv_cache_size`` cached keys."""
    heads = int(row.n_q_head) // int(row.num_tensor_parallel_workers)
    dh = int(row.n_embd) // int(row.n_q_head)
    cached = int(row.kv_cache_size)
    if row.is_prefill:
        rows, keys, copies = int(row.prefill_chunk_size), [cached] * (cached > 0), heads
        keys.append(rows)
    else:
        rows, keys, copies = 1, [cached], heads * int(row.batch_size)
    q = ((rows, dh), "float16")
    stats = ((rows, 2), "float32")
    ops = [("attn_scores", (rows, k), [q, ((k, dh), "float16")], "float16") for k in keys]
    ops.append(("softmax_stats", (rows, 2), [((rows, k), "float16") for k in keys], "float32"))
    ops += [("causal_softmax", (rows, k), [((rows, k), "float16"), stats], "float16")
            for k in keys]
    ops.append(("attn_values", (rows, dh), [((rows, k), "float16") for k in keys]
                + [((k, dh), "float16") for k in keys], "float16"))
    kernels = []
    for op, out, ins, dtype in ops:
        sizes = [int(np.prod(shape)) * DTYPES[dt] for shape, dt in ins]
        kernels.append((op_flops(op, out, [shape for shape, _ in ins]),
                        touched_bytes(op, int(np.prod(out)) * DTYPES[dtype], sizes)))
    return kernels, copies


SAMPLE = Path(__file__).with_name("vidur_attention_rows.csv")
"""The keys (GPU, model, prefill or not, tensor-parallel workers, batch, chunk and cached
tokens) of the vidur attention rows the stored attention fit was fitted to: read one by one
from a public copy of the files (docs/cost-model.md), not the whole files."""
KEYS = ["is_prefill", "num_tensor_parallel_workers", "batch_size", "prefill_chunk_size",
        "kv_cache_size"]


def _sampled(rows: pd.DataFrame, gpu: str, model: str) -> pd.DataFrame:
    """The rows of one vidur ``attention.csv`` whose keys :data:`SAMPLE` lists (the first of
    rows repeated in the file)."""
    keys = pd.read_csv(SAMPLE, comment="#").rename(columns={"tp": KEYS[1]})
    keys = keys[(keys["gpu"] == gpu) & (keys["model"] == model)][KEYS]
    return rows.drop_duplicates(KEYS).merge(keys, on=KEYS)


def read_attention(paths: list[Path], every_row: bool = False) -> pd.DataFrame:
    """A row per measured attention kernel: GPU, model, ``attn_prefill`` or ``attn_decode``,
    the toolkit's kernels it covers (:func:`_attention_kernels`) and the measured seconds;
    only the rows :data:`SAMPLE` lists unless ``every_row``."""
    rows = []
    for path in paths:
        gpu, model = path.parts[-4], path.parts[-2]
        measured = pd.read_csv(path)
        for _, r in (measured if every_row else _sampled(measured, gpu, model)).iterrows():
            name = "attn_prefill" if r.is_prefill else "attn_decode"
            kernels, copies = _attention_kernels(r)
            backend = str(r.attention_backend).rsplit(".", 1)[-1]
            rows.append(dict(gpu=gpu, model=model, backend=backend, operator=name,
                             fitted=r.is_prefill and r.attention_backend == FITTED_BACKEND,
                             op=ATTENTION_OPS, cls=ATTENTION,
                             tp=int(r.num_tensor_parallel_workers), kernels=kernels,
                             copies=copies,
                             seconds=float(r[f"time_stats.{name}.median"]) * 1e-3))
    return pd.DataFrame(rows)


def predict(params, rows: pd.DataFrame, gpu: str) -> np.ndarray:
    peak, bandwidth = PEAKS[gpu]
    if "kernels" in rows:           # attention: the sum over a measurement's kernels
        return np.array([copies * sum(kernel_time(params, f, b, peak, bandwidth)
                                      for f, b in kernels)
                         for kernels, copies in zip(rows["kernels"], rows["copies"])])
    return np.array([kernel_time(params, f, b, peak, bandwidth)
                     for f, b in zip(rows["flops"], rows["touched"])])


def fit_class(rows: pd.DataFrame, gpu: str) -> tuple[float, ...]:
    """``(e, beta, latency, p)`` minimising the relative error on ``rows``: all four for the
    GEMMs and attention (whose bandwidth fraction may exceed 1), the others with ``e = 1``
    (their flops are a few per byte: the fit cannot tell them from their bytes)."""
    from scipy.optimize import least_squares
    seconds = rows["seconds"].to_numpy()
    four = bool(rows["cls"].isin(("gemm", ATTENTION)).all())      # all four parameters

    def params(x):          # the latency is fitted in microseconds: every x of order 1
        return (x[0], x[1], x[2] * 1e-6, x[3]) if four else (1.0, x[0], x[1] * 1e-6, x[2])

    def residuals(x):
        return predict(params(x), rows, gpu) / seconds - 1.0
    low, high = [1e-3, 0.0, 1.0], [1e3 if ATTENTION in set(rows["cls"]) else 1.0, 1e3, 50.0]
    start = [0.7, 5.0, 2.0]
    if four:
        low, high, start = [1e-3] + low, [1.0] + high, [0.7] + start
    return params(least_squares(residuals, start, bounds=(low, high)).x)


def fit(table: pd.DataFrame, attention: pd.DataFrame) -> dict[str, tuple]:
    """Per GPU, the kernel_model fit: ``((class, e, beta, latency, p), ...)``, rounded to 4
    significant digits (the fractions never above 1, but attention's bandwidth fraction)."""
    measured = {str(gpu): tuple(map(_round, fit_class(rows, str(gpu))))
                for gpu, rows in attention[attention["fitted"]].groupby("gpu", sort=False)}
    fits = {}
    for gpu, rows in table.groupby("gpu", sort=False):
        fits[gpu] = tuple((cls, *(measured.get(str(gpu), next(iter(measured.values())))
                                  if cls == ATTENTION else
                                  map(_round, fit_class(_members(rows, cls), str(gpu)))))
                          for cls in CLASSES)
    return fits


def _members(rows: pd.DataFrame, cls: str) -> pd.DataFrame:
    """The rows a class is fitted to; :data:`POOLED` for the elementwise class."""
    return rows[rows["cls"].isin(POOLED) if cls == ELEMENTWISE else rows["cls"] == cls]


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def errors(table: pd.DataFrame, attention: pd.DataFrame,
           fits: dict[str, tuple]) -> pd.DataFrame:
    """The relative error of each row under its GPU's fit, and of the rows of :data:`POOLED`
    again under the elementwise class's fit, marked ``elementwise``; attention's operators are
    named with their model and backend, and those not fitted are marked."""
    parts = []
    for gpu, rows in table.groupby("gpu", sort=False):
        by_class = kernel_model.by_class(fits[gpu])
        for cls in CLASSES:
            group = (attention[attention["gpu"] == gpu] if cls == ATTENTION
                     else _members(rows, cls).assign(cls=cls))
            parts.append(group.assign(error=predict(by_class[cls], group, str(gpu))
                                      / group["seconds"] - 1.0))
    errs = pd.concat(parts, ignore_index=True)
    attn = errs["cls"] == ATTENTION
    errs.loc[attn, "operator"] += (" (" + errs.loc[attn, "model"] + ", "
                                   + errs.loc[attn, "backend"] + ")")
    errs.loc[attn & ~errs["fitted"].astype(bool), "operator"] += ", not fitted"
    return errs


def report(errs: pd.DataFrame, fits: dict[str, tuple], commit: str) -> str:
    def stats(group: pd.DataFrame) -> dict:
        e = group["error"].abs()
        near = (e <= GOAL) | (e * group["seconds"] <= RESOLUTION)
        return {"points": len(e), "median": f"{100 * e.median():.1f}%",
                "90th percentile": f"{100 * e.quantile(0.9):.1f}%", "max": f"{100 * e.max():.1f}%",
                f"within {GOAL:.0%}": f"{(e <= GOAL).mean():.0%}",
                f"within {GOAL:.0%} or 1 us": f"{near.mean():.0%}"}
    fitted = ~errs["operator"].str.endswith("not fitted")
    per_class = [{"GPU": gpu.upper(), "class": cls,
                  "operators": ", ".join(sorted(set(group["operator"]))), **stats(group)}
                 for (gpu, cls), group in errs[fitted].groupby(["gpu", "cls"], sort=False)]
    per_op = [{"GPU": gpu.upper(), "operator": name, "toolkit op": group["op"].iloc[0],
               "class": cls, **stats(group)}
              for (gpu, cls, name), group in errs[errs["cls"] != ELEMENTWISE]
              .groupby(["gpu", "cls", "operator"], sort=False)]
    params = [{"GPU": gpu.upper(), "class": cls, "e": e, "beta": beta,
               "latency (us)": f"{latency * 1e6:.3g}", "p": p}
              for gpu, fit in fits.items() for cls, e, beta, latency, p in fit]
    mlp, attn = errs[~errs["cls"].isin((ELEMENTWISE, ATTENTION))], errs[errs["cls"] == ATTENTION]

    def models(rows: pd.DataFrame) -> str:
        return ", ".join(sorted(set(rows["model"] + " (" + rows["gpu"].str.upper() + ")")))
    head = [f"Fitted to microsoft/vidur's `mlp.csv` at commit `{commit}`: {models(mlp)}; "
            f"{len(mlp)} measured operator times; and {len(attn)} rows of its "
            f"`attention.csv` ({models(attn)}; those not marked \"not fitted\" fitted). "
            "Relative error |fitted / measured - 1| of the stored (rounded) parameters:", ""]
    return "\n".join(head + markdown(pd.DataFrame(per_class)) + ["", "Per operator:", ""]
                     + markdown(pd.DataFrame(per_op)) + ["", "The parameters:", ""]
                     + markdown(pd.DataFrame(params))) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vidur", type=Path, required=True, help="a git clone of vidur")
    parser.add_argument("--attention", type=Path, nargs="+", required=True,
                        help="vidur attention.csv files or samples of their rows, at "
                             ".../GPU/ORG/MODEL/attention.csv")
    parser.add_argument("--every-row", action="store_true",
                        help="fit attention to every row of the --attention files, not only "
                             "those of bench/vidur_attention_rows.csv (other constants result)")
    parser.add_argument("--commit", default=VIDUR_COMMIT)
    parser.add_argument("--docs", type=Path, help="write the error table into this page")
    args = parser.parse_args()
    table = read(args.vidur, args.commit)
    attention = read_attention(args.attention, args.every_row)
    fits = fit(table, attention)
    text = report(errors(table, attention, fits), fits, args.commit)
    print(text)
    stale = []
    for gpu, fit_ in fits.items():
        print(f"{STORED[gpu]}: KernelFit = (")
        print("".join(f"    {entry!r},\n" for entry in fit_) + ")")
        stale += [STORED[gpu]] if getattr(kernel_model, STORED[gpu]) != fit_ else []
    if args.docs:
        write_between(args.docs, MARKER, text)
    if stale:
        raise SystemExit(f"the stored {', '.join(stale)} differ from this fit: paste the "
                         f"constants above into offloadlab/core/kernel_model.py")


if __name__ == "__main__":
    main()
