"""Signals in a section that must not be cut half-way (:mod:`offloadlab.lab.signals`): a
Ctrl-C there waits for the section's end, and the processes started in
:func:`~offloadlab.lab.signals.sigint_blocked` never see one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from offloadlab.lab.signals import Terminated, deferred, sigint_blocked, sigterm_stops

REPO = Path(__file__).resolve().parents[1]


def _busy(seconds: float) -> None:
    """Run Python code (where signal handlers run) for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_ctrl_c_in_a_deferred_section_stops_it_once_it_ends(ctrl_c):
    finished = False
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            _busy(0.2)
            finished = True
    assert finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_in_nested_sections_waits_for_the_outer_one(ctrl_c):
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with deferred():
            with deferred():
                os.kill(os.getpid(), signal.SIGINT)
                _busy(0.2)
            steps.append("inner ended")
            _busy(0.2)
            steps.append("outer ends")
    assert steps == ["inner ended", "outer ends"]


def test_an_ignored_ctrl_c_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with deferred():
            os.kill(os.getpid(), signal.SIGINT)
            _busy(0.2)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_sigterm_and_ctrl_c_in_a_deferred_section_stop_it_as_sigterm(ctrl_c):
    with pytest.raises(Terminated):
        with sigterm_stops(), deferred():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            _busy(0.2)


def test_a_ctrl_c_taken_by_another_thread_waits_too(ctrl_c):
    """A thread started before the section (a progress bar's monitor) does not block SIGINT:
    the kernel gives it the signal, and the main thread's handler still only records it."""
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        finished = False
        with pytest.raises(KeyboardInterrupt):
            with deferred(), sigint_blocked():
                os.kill(os.getpid(), signal.SIGINT)
                _busy(0.2)
                finished = True
        assert finished
    finally:
        stop.set()
        thread.join()


_SPAWNS = """
import multiprocessing, threading, sys
from offloadlab.lab.signals import sigint_blocked

def blocked():
    status = open("/proc/self/status").read().splitlines()
    mask = int(next(line for line in status if line.startswith("SigBlk:")).split()[1], 16)
    print(bool(mask & (1 << 1)))        # SIGINT is signal 2: bit 1

def spawn():                            # a LocalCluster's nanny: a Queue, then a process
    context = multiprocessing.get_context("spawn")
    context.Queue()
    process = context.Process(target=blocked)
    process.start()
    process.join()

if __name__ == "__main__":
    with sigint_blocked():
        thread = threading.Thread(target=spawn)     # the cluster's event loop
        thread.start()
    thread.join()
"""


def test_processes_started_from_threads_started_in_the_section_block_ctrl_c(tmp_path):
    """As a LocalCluster starts its workers: from a thread started in the section, in a
    fresh process (whose first Queue starts multiprocessing's resource tracker)."""
    (tmp_path / "spawns.py").write_text(_SPAWNS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(tmp_path / "spawns.py")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "True\n", out.stdout


def test_planning_without_a_progress_hook_still_lets_signals_in(monkeypatch):
    """BuildMemGraph's loop, compiled, runs no signal handler itself: with no progress hook it
    calls the interpreted :func:`~offloadlab.core.util.let_signals_in` every 4096 items, so
    that a Ctrl-C or a SIGTERM stops planning there rather than after the whole run."""
    from offloadlab.core import util
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import buildmemgraph, plan

    assert hasattr(util.let_signals_in, "__code__"), "core/util.py must stay interpreted"
    calls = []
    monkeypatch.setattr(buildmemgraph, "let_signals_in", calls.append)
    graph = build_workload("random:vertices=9000,gpus=2,seed=1")
    plan(graph, machine_from_spec("a100x8:gpus=2"))
    assert len(calls) >= 9000 // 4096


def test_verifying_lets_signals_in(monkeypatch):
    """The verifier's passes over the vertices and the GPU writers (compiled) call
    :func:`~offloadlab.core.util.let_signals_in` every 4096, as planning does: in a process
    that verifies in place (``reproduce``, the API) a Ctrl-C stops it there."""
    from offloadlab.core import verify
    from offloadlab.core.machine import machine_from_spec
    from offloadlab.core.workloads import build_workload
    from offloadlab.planner import plan

    mg = plan(build_workload("random:vertices=9000,gpus=2,seed=1"),
              machine_from_spec("a100x8:gpus=2"))
    calls = []
    monkeypatch.setattr(verify, "let_signals_in", lambda: calls.append(1))
    verify.verify(mg)
    writers = sum(v.loc is not None for v in mg)
    assert len(calls) == -(-len(mg) // 4096) + -(-writers // 4096)
