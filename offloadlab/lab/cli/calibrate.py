"""``offloadlab calibrate``: its parser and its handler."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...core.backends import backend_names
from .common import AddCommand, progress_shown
from .outputs import check_writable


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Measure a backend's kernel rates, copy bandwidths, duplex factor and dispatch overhead
    through the executor and write them as a Machine JSON file.

    Parameters
    ----------
    args : argparse.Namespace
        The ``calibrate`` command line, parsed.

    Returns
    -------
    int
        The exit status: 0 once the Machine file is written.
    """
    from ...core.machine import machine_from_spec
    from ...executor.calibrate import calibrate

    out = Path(args.out)
    if args.table is None:
        args.table = str(out.with_suffix(".csv"))
    table_path = Path(args.table)
    check_writable(args, "out", "table")
    base = machine_from_spec(args.machine)
    say = (lambda what: print(f"measuring {what} ...", file=sys.stderr)) \
        if progress_shown(args) else None
    result = calibrate(base, args.backend, quick=args.quick, progress=say)
    m = result.machine
    with args.outputs.file(out) as tmp:
        tmp.write_text(m.to_json())
    with args.outputs.file(table_path) as tmp:
        result.table.to_csv(tmp, index=False)
    args.outputs.commit()
    print(f"{m.name}: {m.source}")
    print(f"  matmul {m.gpu_flops / 1e9:.4g} GFLOP/s, add {m.gpu_mem_bandwidth / 1e9:.4g} GB/s "
          f"touched, kernel latency + dispatch {m.kernel_latency * 1e6:.3g} us")
    print(f"  float16 matmul {m.gpu_half_flops / 1e9:.4g} GFLOP/s")
    print("  other ops (GB/s written/read, +overhead per kernel): " + ", ".join(
        f"{op} {written / 1e9:.3g}/{read / 1e9:.3g}"
        + (f" +{overhead * 1e6:.3g} us" if overhead else "")
        for op, written, read, overhead in m.op_rates))
    print(f"  host->GPU {m.h2d_bandwidth / 1e9:.4g} GB/s, GPU->host {m.d2h_bandwidth / 1e9:.4g} "
          f"GB/s, latency {m.link_latency * 1e6:.3g} us, duplex factor {m.duplex:.3g}")
    if m.gpus > 1:
        print(f"  GPU->GPU {m.gpu_gpu_bandwidth / 1e9:.4g} GB/s")
    print(f"  CPU matmul {m.cpu_flops / 1e9:.4g} GFLOP/s")
    print(f"  GPU engine {m.engine}")
    print(f"wrote {out} (use it as --machine {out}) and {table_path}")
    return 0


def add_parser(add: AddCommand) -> None:
    """The ``calibrate`` command and its options.

    Parameters
    ----------
    add : AddCommand
        Makes the ``calibrate`` parser (:func:`~offloadlab.lab.cli.parser.build_parser`).
    """
    p = add("calibrate", cmd_calibrate, "measure a backend's kernel rates, copy bandwidths, "
            "duplex factor and dispatch overhead through the executor; write a Machine JSON")
    p.add_argument("--backend", choices=backend_names(), default="numpy",
                   help="backend to measure (numpy)")
    p.add_argument("--machine", default="p100x4", metavar="SPEC",
                   help="the machine to start from: its fields that are not measured are kept, "
                        "and the numpy backend paces copies to its links (p100x4)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    p.add_argument("--out", required=True, metavar="JSON", help="Machine JSON file to write")
    p.add_argument("--table", metavar="CSV",
                   help="every measurement as CSV (default: beside --out, .csv)")
