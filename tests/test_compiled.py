"""The two builds of the core (docs/install.md, The compiled build): ``pip install .`` compiles the
planner core (``planner/allocator.py``, ``planner/blocked.py``, ``planner/buildmemgraph.py``,
``planner/residents.py``),
the MemGraph, its readers and its verifier (``core/memgraph.py``,
``core/formats/nodelink.py``, ``core/formats/memgraph_json.py``, ``core/formats/parquet.py``,
``core/formats/arrow.py``, ``core/checks.py``, ``core/verify.py``, ``core/intervals.py``),
the simulator's model (``simulator/model.py``, ``simulator/resources.py``,
``core/dispatch.py``, ``core/bound.py``, ``core/memory.py``)
and the random workload's drawing loop (``core/workloads/layered.py``) with mypyc where it
can, and installs them as pure Python otherwise (or with ``OFFLOADLAB_PURE=1``).

``.ci/run`` tells each of its passes which build it must be importing through
``OFFLOADLAB_EXPECT_COMPILED`` (``1``: compiled, ``0``: pure Python); without it (a developer's
run) either build passes.  The other tests hold in both builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from offloadlab.core import (
    bound,
    checks,
    dispatch,
    intervals,
    memgraph,
    memory,
    verify,
)
from offloadlab.core.formats import arrow, memgraph_json, nodelink, parquet
from offloadlab.core.workloads import layered
from offloadlab.lab.cli import main
from offloadlab.planner import (
    PLANNERS,
    allocator,
    blocked,
    buildmemgraph,
    planner_options,
    residents,
)
from offloadlab.simulator import model, resources

REPO = Path(__file__).resolve().parents[1]
CORE = (allocator, blocked, buildmemgraph, residents, memgraph, verify, intervals, checks, nodelink,
        memgraph_json, parquet, arrow, dispatch, bound, model, resources, memory, layered)
EXPECT = os.environ.get("OFFLOADLAB_EXPECT_COMPILED")


def compiled(module) -> bool:
    return module.__file__.endswith((".so", ".pyd"))


COMPILED = compiled(buildmemgraph)


@pytest.mark.skipif(EXPECT not in ("0", "1"), reason=".ci/run says which build to expect")
def test_the_planner_core_is_the_expected_build():
    files = [m.__file__ for m in CORE]
    if EXPECT == "1":
        assert all(f.endswith((".so", ".pyd")) for f in files), files
    else:
        assert all(f.endswith(".py") for f in files), files


def test_the_planner_core_is_all_compiled_or_all_pure_python():
    assert len({compiled(m) for m in CORE}) == 1, [m.__file__ for m in CORE]


def test_list_describes_every_planner(capsys):
    """mypyc drops the docstrings of compiled functions; registered entry points live in
    pure-Python modules (planner/turnip.py for buildmemgraph), so ``offloadlab list`` reads
    the same in both builds."""
    assert main(["list", "planners"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in PLANNERS:
        line = next(line for line in lines if line.split()[:1] == [name])
        assert line.split(None, 1)[1:], f"no description for {name}: {line!r}"
    assert any(line.split()[:2] == ["buildmemgraph", "TURNIP's"] for line in lines), lines
    assert planner_options("buildmemgraph") == {"victim": "belady", "ahead": True,
                                                "reserve": 1.0, "order": "given",
                                                "retry": True, "search": 1}


PLANS = ("buildmemgraph", "buildmemgraph:victim=lru", "buildmemgraph:ahead=false", "levelwise")
SCRIPT = """
import hashlib, os, sys
from offloadlab.core import formats
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.planner import buildmemgraph, plan
from offloadlab.planner.buildmemgraph import min_capacity
from offloadlab.simulator import model, simulate
print("pure" if buildmemgraph.__file__.endswith(".py") else "compiled")
graph = build_workload(sys.argv[1])
machine = machine_from_spec(sys.argv[2].format(memory=int(min_capacity(graph) * 1.3)))
digest = lambda text: hashlib.sha256(text.encode()).hexdigest()
for spec in sys.argv[4:]:
    mg = plan(graph, machine, spec)
    print(digest(formats.to_json(mg)))
for policy in ("dynamic", "fixed", "random"):      # the last plan, simulated
    print(digest(simulate(mg, machine, policy, noise=0.1, seed=3).trace.to_csv()))
for name in ("mg.json", "mg.parquet"):             # and read back from either format
    path = os.path.join(sys.argv[3], name)
    formats.write_memgraph(mg, path)
    print(digest(formats.to_json(formats.read_memgraph(path))))
"""


@pytest.mark.skipif(not COMPILED, reason="compares the compiled build with the pure-Python one")
@pytest.mark.skipif(not (REPO / "offloadlab" / "planner" / "buildmemgraph.py").is_file() or
                    any((REPO / "offloadlab").rglob("*.so")),
                    reason="needs the pure-Python sources beside the tests")
def test_compiled_plans_simulations_and_files_are_byte_identical_to_pure_python_ones(tmp_path):
    """The same plans, the same simulated traces of the last plan under each policy (with
    noise), and the same MemGraph read back from JSON and from Parquet, in both builds."""
    workload = "random:vertices=2000,gpus=2,seed=5,host_fraction=0.5"
    spec = "a100x8:gpus=2,gpu_memory={memory}"
    ours = subprocess.run([sys.executable, "-c", SCRIPT, workload, spec, str(tmp_path), *PLANS],
                          cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ""})
    # run from the checkout, whose sources come first on sys.path: the pure-Python build
    pure = subprocess.run([sys.executable, "-c", SCRIPT, workload, spec, str(tmp_path), *PLANS],
                          cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ""})
    assert pure.returncode == 0 and ours.returncode == 0, pure.stderr + ours.stderr
    assert pure.stdout.split()[0] == "pure" and ours.stdout.split()[0] == "compiled"
    assert len(pure.stdout.split()) == 1 + len(PLANS) + 5
    assert pure.stdout.split()[1:] == ours.stdout.split()[1:]
