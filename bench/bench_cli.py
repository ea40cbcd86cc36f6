"""Whole command-line processes, start-up included (issue 16's goal: 50,000 vertices/s each).

    python bench/bench_cli.py                       # the benchmark's 100k-vertex DAG
    python bench/bench_cli.py --vertices 30000 --repeat 1 --formats parquet
    python bench/bench_cli.py --pythons /tmp/old/bin/python,/tmp/new/bin/python --repeat 5
    python bench/bench_cli.py --workload llama-lora-train:model=7b,seq=1024,batch=32,gpus=8 \
        --machine a100x8 --commands plan --formats json --repeat 1 --pythons OLD,NEW

Runs ``offloadlab plan`` on the benchmark DAG (``random`` with every input in host RAM, 4 GPUs
of an a100x8 whose memory is 1.5x the tightest feasible) and then ``offloadlab simulate`` on
the MemGraph it wrote, each as its own process with verification on (as users run them), and
reports the best and the median wall time of ``--repeat`` rounds in TaskGraph vertices
planned per second and MemGraph vertices simulated per second, with ``offloadlab --version``
as the start-up floor; once per MemGraph file format (``--formats``: node-link JSON, the
default, and Parquet).  With ``--pythons``, each round runs the commands under every one of
those interpreters (each its own install of offloadlab) in turn, so that two versions are
compared on the same machine at the same time.  With ``--ending``, each command also runs
``--repeat`` more times through a driver that notes when the verifier's verdict arrives (the
commands verify beside writing or simulating, in a child process), and the seconds from
then to the process's end are reported: what the command does after its work, exiting
included (CHANGELOG.md: no teardown at exit).  ``--workload`` plans any workload spec instead,
on ``--machine`` as that spec gives it (its memory unchanged), and ``--commands plan`` leaves
out ``simulate``.  Each line also gives the largest peak resident memory of the command's runs
(the process, or the child verifying beside it if that was larger).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from offloadlab.core import formats
from offloadlab.core.workloads import build_workload
from offloadlab.planner.buildmemgraph import min_capacity


def timed(python: str, argv: list[str], cwd: str) -> tuple[float, float]:
    """Wall time and peak resident memory (MiB: the largest of the process and the children it
    waited for) of one ``PYTHON -m offloadlab ARGV`` run in the directory ``cwd``: not the
    repository's, where ``-m`` would import the source tree instead of the installed build."""
    start = time.perf_counter()
    child = subprocess.Popen([python, "-m", "offloadlab", *argv], stdout=subprocess.DEVNULL,
                             cwd=cwd)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args)
    return seconds, usage.ru_maxrss / 1024


ENDING = """import sys, time
from offloadlab.lab import beside, cli
verdict = beside._Child.verdict
def noted(self, *args):
    verdict(self, *args)
    print(f"verdict at {time.time()!r}", file=sys.stderr, flush=True)
beside._Child.verdict = noted
sys.argv[0] = "offloadlab"
cli.run()
"""


def ending(python: str, argv: list[str], cwd: str) -> float:
    """Seconds from the verifier's verdict to the end of one ``offloadlab ARGV`` process."""
    done = subprocess.run([python, "-c", ENDING, *argv], check=True, cwd=cwd, text=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.time()
    noted = re.findall(r"verdict at ([0-9.]+)", done.stderr)
    if not noted:
        raise SystemExit("bench_cli --ending: no verdict came from a child process (MemGraphs "
                         "under 20,000 vertices are verified in the command's own process)")
    return end - float(noted[-1])


def build_of(python: str, cwd: str) -> str:
    """Which build of offloadlab ``python`` runs from ``cwd``: compiled or pure Python."""
    probe = "import offloadlab.planner.buildmemgraph as m; print(m.__file__)"
    where = subprocess.run([python, "-c", probe], check=True, capture_output=True, text=True,
                           cwd=cwd).stdout.strip()
    return f"{'compiled' if where.endswith('.so') else 'pure Python'}, {os.path.dirname(where)}"


def summary(runs: list[tuple[float, float]], count: int, what: str) -> str:
    seconds = [s for s, _ in runs]
    best, median = min(seconds), statistics.median(seconds)
    return (f"{best:.2f} s = {count / best:,.0f} {what}/s best, {median:.2f} s = "
            f"{count / median:,.0f}/s median of {len(seconds)}, peak "
            f"{max(peak for _, peak in runs) / 1024:.2f} GiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vertices", type=int, default=100_000)
    p.add_argument("--factor", type=float, default=1.5)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--formats", default="json,parquet",
                   help="MemGraph file formats, comma-separated (json,parquet)")
    p.add_argument("--ending", action="store_true",
                   help="also time each command from the verifier's verdict to its end")
    p.add_argument("--workload", help="a workload spec to plan instead of the benchmark DAG")
    p.add_argument("--machine", default="a100x8",
                   help="with --workload: the machine spec to plan on (a100x8)")
    p.add_argument("--commands", default="plan,simulate",
                   help="the commands to time, comma-separated (plan,simulate)")
    p.add_argument("--pythons", default=sys.executable,
                   help="interpreters to run the commands with, comma-separated, interleaved "
                        "round by round (default: this one)")
    args = p.parse_args()
    pythons = args.pythons.split(",")
    if args.repeat < 1 or args.vertices < 1:
        p.error("--repeat and --vertices must be at least 1")
    if not 0 < args.factor < float("inf"):
        p.error(f"--factor must be a finite number > 0, got {args.factor}")
    if not set(args.formats.split(",")) <= {"json", "parquet"}:
        p.error(f"--formats: json, parquet or both, comma-separated; got {args.formats!r}")
    commands = args.commands.split(",")
    if not set(commands) <= {"plan", "simulate"} or "plan" not in commands:
        p.error(f"--commands: plan, or plan,simulate; got {args.commands!r}")
    for python in pythons:
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            p.error(f"--pythons: {python!r} is not an executable file")
    if args.workload:
        workload, machine = args.workload, args.machine
        vertices = len(build_workload(workload))
    else:
        workload = f"random:vertices={args.vertices},gpus=4,seed=1,host_fraction=1"
        tight = min_capacity(build_workload(workload))
        machine = f"a100x8:gpus=4,gpu_memory={int(tight * args.factor)}"
        vertices = args.vertices
    print(f"workload   {workload} on {machine}: {vertices:,} vertices")
    with tempfile.TemporaryDirectory() as tmp:
        for python in pythons:
            startup = min(timed(python, ["--version"], tmp)[0] for _ in range(args.repeat))
            print(f"start-up   {startup:.2f} s (offloadlab --version, {python}: "
                  f"{build_of(python, tmp)})")
        for fmt in args.formats.split(","):
            outs = {python: os.path.join(tmp, f"mg{k}.{fmt}") for k, python in enumerate(pythons)}
            plan_s: dict[str, list[tuple[float, float]]] = {python: [] for python in pythons}
            sim_s: dict[str, list[tuple[float, float]]] = {python: [] for python in pythons}
            for _ in range(args.repeat):
                for python, out in outs.items():
                    plan_s[python].append(timed(python, ["plan", "--workload", workload,
                                                         "--machine", machine, "--out", out, "-q"],
                                                tmp))
                    if "simulate" in commands:
                        sim_s[python].append(timed(python, ["simulate", out], tmp))
            for python, out in outs.items():
                label = f" ({python})" if len(pythons) > 1 else ""
                print(f"plan       {summary(plan_s[python], vertices, 'TaskGraph vertices')}"
                      f" (build, plan, verify, write {fmt}){label}")
                if "simulate" not in commands:
                    continue
                memgraph = len(formats.read_memgraph(out))
                print(f"simulate   {summary(sim_s[python], memgraph, 'MemGraph vertices')} "
                      f"({memgraph} vertices: read {fmt}, verify, simulate; file "
                      f"{os.path.getsize(out) / 2**20:.1f} MiB){label}")
            if args.ending:
                ends: dict[tuple[str, str], list[float]] = {}
                for _ in range(args.repeat):
                    for python, out in outs.items():
                        ends.setdefault(("plan", python), []).append(ending(
                            python, ["plan", "--workload", workload, "--machine", machine,
                                     "--out", out], tmp))
                        if "simulate" in commands:
                            ends.setdefault(("simulate", python), []).append(ending(
                                python, ["simulate", out], tmp))
                for (command, python), seconds in ends.items():
                    label = f" ({python})" if len(pythons) > 1 else ""
                    print(f"ending     {command} ({fmt}): {min(seconds):.2f} s best, "
                          f"{statistics.median(seconds):.2f} s median of {len(seconds)}, "
                          f"from the verdict to the process's end{label}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("bench_cli: interrupted", file=sys.stderr)
        sys.exit(130)
