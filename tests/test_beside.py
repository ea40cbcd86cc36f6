"""Verification beside the work that follows it (offloadlab.lab.beside): the verdict is the one
verifying first gives, whatever the block does, and no child process outlives the block."""

from __future__ import annotations

import os

import pytest

from offloadlab.core import formats
from offloadlab.core.errors import VerificationError
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.memgraph import Loc
from offloadlab.core.workloads import build_workload
from offloadlab.lab import beside
from offloadlab.lab.cli import main
from offloadlab.planner import plan


@pytest.fixture
def forking(monkeypatch):
    """Every graph is verified in a child; count the children."""
    monkeypatch.setattr(beside, "BESIDE_AT", 0)
    started = []
    start = beside._Child.start.__func__

    def counted(cls, *args):
        child = start(cls, *args)
        started.append(child.pid)
        return child
    monkeypatch.setattr(beside._Child, "start", classmethod(counted))
    return started


def planned():
    graph = build_workload("matmul-chain:layers=3")
    machine = machine_from_spec("disco-example")
    return plan(graph, machine), graph, machine


def broken():
    """A MemGraph that breaks rule 4 (a location past the GPU's capacity)."""
    mg, graph, machine = planned()
    v = next(v for v in mg if v.loc is not None)
    v.loc = Loc(v.loc.device, machine.gpu_memory, v.loc.size)
    return mg, graph, machine


def no_children_left(pids):
    """Every child in ``pids`` has been reaped."""
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_a_correct_plan_runs_the_block_with_the_verifier_in_a_child(forking):
    ran = []
    with beside.verifying(*planned()):
        ran.append(True)
    assert ran and len(forking) == 1
    no_children_left(forking)


def test_an_incorrect_plan_raises_when_the_block_ends(forking):
    ran = []
    with pytest.raises(VerificationError, match="rule 4"):
        with beside.verifying(*broken()):
            ran.append(True)
    assert ran and len(forking) == 1
    no_children_left(forking)


def test_the_verdict_wins_over_the_blocks_error(forking):
    with pytest.raises(VerificationError, match="rule 4"):
        with beside.verifying(*broken()):
            raise RuntimeError("the simulation of an incorrect plan failed")
    with pytest.raises(RuntimeError, match="unrelated"):
        with beside.verifying(*planned()):
            raise RuntimeError("unrelated")
    no_children_left(forking)


def test_ctrl_c_in_the_block_stops_the_child(forking):
    with pytest.raises(KeyboardInterrupt):
        with beside.verifying(*planned()):
            raise KeyboardInterrupt
    assert len(forking) == 1
    no_children_left(forking)


def test_rule_2_is_checked_here_and_reported_after_the_childs_verdict(forking, monkeypatch):
    """The child checks the MemGraph's own rules, this process rule 2 after the block; a plan
    that breaks both reports the child's, as verify() does, and Ctrl-C while rule 2 is checked
    stops the child."""
    mg, graph, machine = planned()
    reader = next(v for v in mg if v.kind == "compute" and len(v.inputs) > 1)
    reader.inputs = (reader.inputs[1], reader.inputs[0])        # reads its inputs swapped
    with pytest.raises(VerificationError, match="rule 2"):
        with beside.verifying(mg, graph, machine):
            pass
    v = next(v for v in mg if v.loc is not None)
    v.loc = Loc(v.loc.device, machine.gpu_memory, v.loc.size)
    with pytest.raises(VerificationError, match="rule 4"):
        with beside.verifying(mg, graph, machine):
            pass

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(beside, "verify_against", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with beside.verifying(*planned()):
            pass

    def failing(*args):
        raise RuntimeError("rule 2 failed on its own")
    monkeypatch.setattr(beside, "verify_against", failing)
    with pytest.raises(VerificationError, match="rule 4"):    # the child's verdict first
        with beside.verifying(*broken()):
            pass
    with pytest.raises(RuntimeError, match="on its own"):
        with beside.verifying(*planned()):
            pass
    assert len(forking) == 5
    no_children_left(forking)


def test_a_child_that_ends_without_a_verdict_is_replaced_by_verifying_here(forking, monkeypatch):
    parent, verified_here = os.getpid(), []
    real = beside.verify

    def dies_in_the_child(*args):
        if os.getpid() != parent:
            raise MemoryError
        verified_here.append(True)
        real(*args)
    monkeypatch.setattr(beside, "verify", dies_in_the_child)
    with beside.verifying(*planned()):
        pass
    with pytest.raises(VerificationError, match="rule 4"):
        with beside.verifying(*broken()):
            pass
    assert len(forking) == 2 and len(verified_here) == 2
    no_children_left(forking)


@pytest.mark.parametrize("reason", ["small", "no room", "not beside"])
def test_otherwise_it_verifies_before_the_block(forking, monkeypatch, reason):
    if reason == "small":
        monkeypatch.setattr(beside, "BESIDE_AT", 10**9)
    elif reason == "no room":
        monkeypatch.setattr(beside, "_room_to_fork", lambda vertices: False)
    ran = []
    with pytest.raises(VerificationError, match="rule 4"):
        with beside.verifying(*broken(), beside=reason != "not beside"):
            ran.append(True)
    assert not ran and not forking


def test_room_to_fork_asks_for_twice_the_resident_memory(monkeypatch):
    assert not beside._room_to_fork(beside.BESIDE_AT - 1)
    if os.path.exists("/proc/meminfo"):
        assert beside._room_to_fork(beside.BESIDE_AT)      # this test process is small
        monkeypatch.setattr(os, "sysconf", lambda name: 2**40)     # 1 TiB pages
        assert not beside._room_to_fork(beside.BESIDE_AT)


def test_plan_and_simulate_commands_verify_in_a_child(forking, capsys, tmp_path):
    out = tmp_path / "mg.json"
    assert main(["plan", "--workload", "matmul-chain:layers=3", "--machine", "disco-example",
                 "--out", str(out)]) == 0
    assert main(["simulate", str(out), "--chrome", str(tmp_path / "t.json")]) == 0
    assert len(forking) == 2
    mg, _, _ = broken()
    formats.write_memgraph(mg, out)
    capsys.readouterr()
    assert main(["simulate", str(out), "--chrome", str(tmp_path / "u.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"offloadlab: error: MemGraph JSON file '{out}' is not a correct "
                          f"plan: rule 4") and err.count("\n") == 1
    assert not (tmp_path / "u.json").exists() and len(forking) == 3
    no_children_left(forking)
