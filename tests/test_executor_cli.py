"""``offloadlab run``, ``calibrate`` and ``validate``: outputs, exit codes and bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_cli import _program, fails, run

from offloadlab.core import formats
from offloadlab.core.machine import Machine, machine_from_spec

pytestmark = pytest.mark.slow

WORKLOAD = "matmul-chain:layers=3,batch=64,hidden=256"
MACHINE = "disco-example:gpu_memory=400KB,h2d_bandwidth=1e9,d2h_bandwidth=1e9,host_bus_bandwidth=0"


def test_run_json_checks_the_outputs(capsys, tmp_path):
    code, out, err = run(capsys, "run", "--workload", WORKLOAD, "--machine", MACHINE, "--check",
                         "--json", "--policy", "random", "--seed", "3", "--poison",
                         "--gantt", tmp_path / "g.png", "--chrome", tmp_path / "t.json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["correct"] is True
    assert summary["backend"] == "numpy" and summary["policy"] == "random"
    assert summary["vertices"] > 0 and summary["makespan"] > 0
    assert (tmp_path / "g.png").stat().st_size > 0
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert all(e["args"]["source"] == "measured" for e in events if e["ph"] == "X")


def test_run_a_memgraph_file_with_its_stored_machine(capsys, tmp_path):
    path = tmp_path / "mg.json"
    assert run(capsys, "plan", "--workload", WORKLOAD, "--machine", MACHINE, "--out", path)[0] == 0
    code, out, err = run(capsys, "run", path, "--check")
    assert code == 0, err
    assert "outputs: equal to the reference" in out and "measured makespan" in out


def test_run_check_fails_with_exit_1_naming_the_output(capsys, monkeypatch):
    """An executor whose ``add`` kernel is broken (the reference's is not)."""
    from offloadlab.executor import kernels, workspace

    def zeros(xp, out, args, scratch):
        out.fill(0)

    monkeypatch.setattr(workspace, "kernel", lambda op, vertex: kernels.Kernel(zeros) if op == "add"
                        else kernels.kernel(op, vertex))
    code, out, err = run(capsys, "run", "--workload", "tp-matmul:n=64", "--machine",
                         "p100x4:gpus=3", "--check")
    assert code == 1
    assert "check failed: output '8' differs from the reference in 4096 of 4096" in err


@pytest.mark.parametrize("argv,message", [
    (["run", "--workload", WORKLOAD], "--machine is required"),
    (["run", "absent.json"], "cannot read MemGraph JSON file"),
    (["run", "--workload", WORKLOAD, "--machine", "nope.json"], "cannot read machine file"),
    (["run", "--workload", WORKLOAD, "--machine", MACHINE, "--backend", "cupy"], "cupy"),
])
def test_run_user_errors(capsys, argv, message):
    assert message in fails(capsys, *argv)


@pytest.mark.parametrize("argv", [
    ["run", "--workload", WORKLOAD, "--machine", MACHINE, "--gantt", "{missing}/g.png"],
    ["run", "--workload", WORKLOAD, "--machine", MACHINE, "--chrome", "{missing}/t.json"],
    ["validate", "--workload", WORKLOAD, "--machine", MACHINE, "--plot", "{missing}/v.png"],
    ["validate", "--workload", WORKLOAD, "--machine", MACHINE, "--table", "{missing}/v.csv"],
])
def test_outputs_in_a_missing_directory_fail_before_running(capsys, tmp_path, argv):
    argv = [a.format(missing=tmp_path / "absent") for a in argv]
    assert "does not exist" in fails(capsys, *argv)
    assert not (tmp_path / "absent").exists()


def test_run_rejects_files_that_are_not_utf8_and_nan_machines(capsys, tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b"{\xff\xfebad")
    assert "not UTF-8 text" in fails(capsys, "run", path)
    assert "not UTF-8 text" in fails(capsys, "run", "--taskgraph", path, "--machine", "v100")
    assert "option h2d_bandwidth: cannot read 'nan'" in fails(
        capsys, "run", "--workload", WORKLOAD, "--machine", "disco-example:h2d_bandwidth=nan")


def test_run_rejects_bad_options(capsys):
    for bad in (["--watchdog", "nan"], ["--watchdog", "0"], ["--policy", "bogus"],
                ["--streams", "0"]):
        code, out, err = run(capsys, "run", "--workload", WORKLOAD, "--machine", MACHINE, *bad)
        assert code == 2 and err.startswith("offloadlab: error: ") and "--help')" in err


def test_calibrate_writes_a_machine_others_read(capsys, tmp_path):
    out = tmp_path / "m.json"
    code, text, err = run(capsys, "calibrate", "--quick", "--machine",
                          "p100x4:gpus=2,h2d_bandwidth=2e9,d2h_bandwidth=2e9,duplex=0.5",
                          "--out", out)
    assert code == 0, err
    m = machine_from_spec(str(out))
    assert m.name == "p100x4-calibrated-numpy" and m.gpus == 2 and m.engine == "fifo"
    assert "  GPU engine fifo\n" in text
    # copies are paced to the base machine's links: calibration finds them again (a
    # least-squares line through noisy copies: within 4x, which a machine at a load of 12-15
    # on 2 cores still gives; 0.57e9 to 3e9 were seen there; a unit's error is 1000x)
    assert 0.5e9 < m.h2d_bandwidth < 8e9 and 0.5e9 < m.d2h_bandwidth < 8e9
    # both directions at once, under a load of 7 one copy's thread waited: 0.17 was seen
    assert 0.1 < m.duplex < 0.7
    assert {op for op, *_ in m.op_rates} >= {"add", "mix", "softmax"}
    # NumPy multiplies float16 without BLAS: slower than float32, not the P100's 2x
    assert 0 < m.gpu_half_flops < m.gpu_flops
    assert (m.host_bus_bandwidth, m.gpus_per_bus) == (12e9, 2)     # the base's, not measured
    assert (tmp_path / "m.csv").read_text().startswith("what,op,size,bytes,read,flops,seconds")
    overridden = machine_from_spec(f"{out}:gpu_memory=1MiB")
    assert overridden.gpu_memory == 2**20 and overridden.gpu_flops == m.gpu_flops
    assert Machine.from_dict(json.loads(out.read_text())) == m


def test_a_copy_line_that_does_not_rise_gives_the_mean_rate():
    """Noise can tilt the least-squares line of fast copies downwards; its inverse slope was
    then written as a negative bandwidth, which the calibrated machine file then refused."""
    from offloadlab.executor.calibrate import _line
    rising = pd.DataFrame({"bytes": [1e6, 4e6, 16e6], "seconds": [2e-3 + b / 1e9
                                                                 for b in (1e6, 4e6, 16e6)]})
    assert _line(rising) == (pytest.approx(1e9), pytest.approx(2e-3))
    falling = pd.DataFrame({"bytes": [1e6, 4e6, 16e6], "seconds": [3e-4, 2e-4, 1e-4]})
    assert _line(falling) == (pytest.approx(21e6 / 6e-4), 0.0)


def test_calibrate_to_a_missing_directory_measures_nothing(capsys, tmp_path):
    err = fails(capsys, "calibrate", "--quick", "--out", tmp_path / "absent" / "m.json")
    assert "does not exist" in err


@pytest.mark.parametrize("text,message", [("{", "not a JSON Machine"),
                                          ('{"gpus": "two"}', "gpus must be a positive integer"),
                                          ('{"gpus": 2, "bogus": 1}', "unknown field(s): bogus"),
                                          ('{"gpu_flops": NaN}',
                                           "gpu_flops must be a number > 0, not NaN"),
                                          ("[1, 2]", "expected a JSON object"),
                                          ('{"op_rates": [["add", -1, 1]]}', "op_rates")])
def test_malformed_machine_files(capsys, tmp_path, text, message):
    path = tmp_path / "m.json"
    path.write_text(text)
    err = fails(capsys, "run", "--workload", WORKLOAD, "--machine", path)
    assert message in err and str(path) in err or message in err


def test_validate_reports_components_and_plots(capsys, tmp_path):
    code, out, err = run(capsys, "validate", "--workload", WORKLOAD, "--machine", MACHINE,
                         "--runs", "2", "--json", "--plot", tmp_path / "v.png",
                         "--table", tmp_path / "v.csv")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["planner"] for r in rows] == ["levelwise", "buildmemgraph"]
    for r in rows:
        assert r["correct"] and len(r["measured_makespans"]) == 2
        assert r["error"] == pytest.approx((r["sim_makespan"] - r["measured_makespan"])
                                           / r["measured_makespan"])
        names = {c["component"] for c in r["components"]}
        assert {"makespan", "busy gpu0", "idle gpu0", "mean compute", "mean load"} <= names
    assert (tmp_path / "v.png").stat().st_size > 0
    assert "planner,component,simulated,measured,error" in (tmp_path / "v.csv").read_text()


def test_memgraph_files_keep_shapes_for_the_executor(capsys, tmp_path):
    path = tmp_path / "mg.json"
    run(capsys, "plan", "--workload", WORKLOAD, "--machine", MACHINE, "--out", path)
    mg = formats.memgraph_from_json(path)
    assert mg["X2.0"].shape == (64, 128) and mg["X2.0"].dtype == "float32"


def test_run_as_a_program_is_interruptible_without_traceback(ctrl_c):
    import os
    import signal
    import subprocess
    import sys
    import time

    from test_cli import REPO
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # 12.8 MB of weights at 1 MB/s: the run takes over 12 s; interrupted once it runs (its
    # progress says so), it must stop well before that, in one line
    proc = subprocess.Popen([sys.executable, "-m", "offloadlab.lab.cli", "--progress", "run",
                             "--workload", "matmul-chain:layers=50,batch=64,hidden=256",
                             "--machine", "disco-example:gpu_memory=1MiB,h2d_bandwidth=1e6,"
                             "host_bus_bandwidth=0"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = ""                            # bytes as written: a bar's "\r" is not a line's end
    while "running on the numpy backend" not in err:
        char = proc.stderr.read(1).decode()
        assert char, f"the run ended before it started: {err}"
        err += char
    begun = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert time.perf_counter() - begun < 5
    err += proc.stderr.read().decode(errors="replace")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert err.split("\n")[-2] == "offloadlab: interrupted"      # a line of its own
    assert err.count("offloadlab:") == 1
    assert _program is not None
