"""``validate`` warms up, probes the machine's noise first, reports the probe's numbers and
says plainly when the machine is too noisy for the error it reports."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_cli import run
from test_executor_cli import MACHINE, WORKLOAD

from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.lab import validate as validation
from offloadlab.lab.validate import NoiseProbe, Validation, noise_probe
from offloadlab.planner import plan


def _validation(error: float, makespans: list[float], cv: float | None) -> Validation:
    table = pd.DataFrame([{"planner": "p", "component": "makespan", "simulated": 1.0 + error,
                           "measured": 1.0, "error": error}])
    probe = None if cv is None else NoiseProbe("256x256 float32 matmul", 50, 1e-3, cv * 1e-3)
    return Validation("p", table, table, table, makespans, True, probe)


def test_the_warning_says_when_the_noise_is_not_small_against_the_error():
    assert _validation(0.30, [1.0, 1.0, 1.0], 0.02).warning is None
    noisy = _validation(0.10, [1.0, 1.0, 1.0], 0.08).warning
    assert noisy is not None and "noise probe (256x256 float32 matmul) varies by 8.0%" in noisy \
        and "+10.0%" in noisy
    # the runs' own spread counts too, with or without a probe
    spread = _validation(0.05, [1.0, 1.1, 0.9], None)
    assert spread.spread == pytest.approx(0.1)
    assert "measured makespans vary by 10.0%" in (spread.warning or "")
    row = _validation(0.10, [1.0, 1.0], 0.08).row()
    assert row["too_noisy"] and row["noise_probe"]["cv"] == pytest.approx(0.08)


def test_the_noise_probe_times_its_kernel_repeatedly():
    probe = noise_probe(machine_from_spec("p100x4:gpus=1"), "numpy", n=64, repeats=12)
    assert probe.repeats == 12 and probe.mean > 0 and probe.std >= 0 and probe.cv >= 0
    assert "64x64 float32 matmul x 12" in str(probe)
    with pytest.raises(ValueError, match="repeats >= 2"):
        noise_probe(machine_from_spec("p100x4:gpus=1"), "numpy", n=64, repeats=1)


def test_validate_memgraph_warms_up_with_one_unmeasured_run(monkeypatch):
    calls = []
    execute = validation.execute

    def counted(*args, **kwargs):
        calls.append(kwargs.get("run", "warm-up"))
        return execute(*args, **kwargs)
    monkeypatch.setattr(validation, "execute", counted)
    graph = build_workload(WORKLOAD)
    machine = machine_from_spec(MACHINE)
    r = validation.validate_memgraph(plan(graph, machine, "levelwise"), machine, graph,
                                     "levelwise", runs=2)
    assert calls == ["warm-up", 0, 1] and len(r.makespans) == 2



def test_validate_memgraph_holds_one_runs_outputs_at_a_time(monkeypatch):
    """Each run's outputs are checked as it ends and dropped: ``--runs N`` does not hold N
    runs' outputs (a runaway with a large N)."""
    import gc
    import weakref
    refs: list[weakref.ref] = []
    alive: list[int] = []
    execute = validation.execute

    def tracked(*args, **kwargs):
        result = execute(*args, **kwargs)
        refs.extend(weakref.ref(a) for a in result.outputs.values())
        gc.collect()                    # an executor's run leaves reference cycles
        alive.append(sum(r() is not None for r in refs))
        return result
    monkeypatch.setattr(validation, "execute", tracked)
    graph = build_workload(WORKLOAD)
    machine = machine_from_spec(MACHINE)
    r = validation.validate_memgraph(plan(graph, machine, "levelwise"), machine, graph,
                                     "levelwise", runs=6, rate_limit=False)
    per_run = len(refs) // 7
    assert per_run > 0 and r.correct and len(r.makespans) == 6
    assert max(alive) <= 2 * per_run, alive


def test_validate_reports_the_noise_probe_in_json_and_table(capsys):
    code, out, err = run(capsys, "validate", "--workload", WORKLOAD, "--machine", MACHINE,
                         "--runs", "2", "--json", "--planner", "levelwise")
    assert code == 0, err
    row, = json.loads(out)
    probe = row["noise_probe"]
    assert probe["kernel"] == "256x256 float32 matmul" and probe["repeats"] == 50
    assert probe["mean"] > 0 and probe["cv"] == pytest.approx(probe["std"] / probe["mean"])
    assert isinstance(row["too_noisy"], bool) and row["makespan_spread"] >= 0
    code, out, err = run(capsys, "validate", "--workload", WORKLOAD, "--machine", MACHINE,
                         "--runs", "2", "--planner", "levelwise")
    assert code == 0, err
    assert out.startswith("noise probe: 256x256 float32 matmul x 50, mean ")
    assert "coefficient of variation" in out.splitlines()[0]
