"""The adversarial corpus of issue 42 ("a user's first hour"): malformed and huge files,
specifications, machine files, options and signals thrown at the command line.  Every case
ends with exactly one line on stderr and exit status 2 (or a documented success: 0), no
traceback, and no file left behind.

Most cases run in-process through ``main(argv)``.  The cases that could run away (huge
specifications, devices, FIFOs, huge files) run as subprocesses under an address-space
limit (:data:`LIMIT`), so that a regression fails fast instead of filling the machine, and
each one's peak RSS (``os.wait4``) must stay under 1 GiB.  The signal cases are
subprocesses sent SIGTERM or SIGINT once the command has started writing its output."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from offloadlab.core import formats
from offloadlab.core.machine import PRESETS
from offloadlab.core.spec import apply_options, parse_spec
from offloadlab.core.workloads import build_workload, estimated_vertices, workload_options
from offloadlab.lab.cli import main

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
LIMIT = 3 * 2**29                   # 1.5 GiB of address space for the runaway cases
PEAK = 2**30                        # what a refusal may peak at
SMALL = "matmul-chain:layers=2"
MACHINE = "disco-example"


# -- the contract -------------------------------------------------------------------------
def check_refusal(code: int, err: str, out_dir: Path, before: set[str],
                  expect: int = 2) -> None:
    """Exit ``expect``; with 2, one ``offloadlab: error:`` line on stderr; never a
    traceback; nothing left in ``out_dir`` but what was there (``before``)."""
    assert code == expect, (code, err)
    assert "Traceback" not in err and "Exception" not in err, err
    if expect == 2:
        assert err.startswith("offloadlab: error: ") and err.count("\n") == 1, err
        assert err.strip() != "offloadlab: error:", err
    left = {p.name for p in out_dir.iterdir()} - before
    assert not left, left


@pytest.fixture
def inputs(tmp_path) -> Path:
    """A directory with a valid TaskGraph (tg.json), MemGraph (mg.json) and machine file
    (m.json) for the cases to damage."""
    formats.to_json(build_workload(SMALL), tmp_path / "tg.json")
    assert main(["-q", "plan", "--taskgraph", str(tmp_path / "tg.json"), "--machine", MACHINE,
                 "--out", str(tmp_path / "mg.json")]) == 0
    (tmp_path / "m.json").write_text(PRESETS[MACHINE].to_json())
    return tmp_path


def run_in_process(capsys, tmp_path: Path, argv: list[str], expect: int = 2) -> str:
    """Run ``argv`` (``{d}`` is ``tmp_path``) in ``tmp_path``; check the contract; stderr."""
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    before = {p.name for p in tmp_path.iterdir()}
    capsys.readouterr()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main(argv)
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    if expect == 0:
        err = ""                        # a success may show progress lines; none are errors
    check_refusal(code, err, tmp_path, before | ({"o.json"} if expect == 0 else set()), expect)
    return err


# -- specifications and options (in-process) ----------------------------------------------
WORKLOAD_SPECS = [
    "", ":", " ", "random:", "random:=3", "random:vertices", "random:vertices=",
    "random:vertices=x", "random:vertices=-1", "random:vertices=0", "random:vertices=1.5",
    "random:vertices=nan", "random:vertices=inf", "random:vertices=1e400",
    "random:nope=1", "random:vertices=1,vertices=2", "nope", "nope:layers=1",
    "matmul-chain:gpus=0", "matmul-chain:hidden=7", "matmul-chain:layers=-5",
    "matmul-chain:batch=0", "matmul-chain:dtype_bytes=0", "tp-matmul:n=0",
    "model:name=nope", "model:mode=nope", "model:gpus=4", "llama-prefill:model=nope",
    "llama-prefill:gpus=3", "llama-prefill:dtype=int8", "llama-prefill:seq=0",
    "llama-generate:gen=0", "llama-generate:gen=-2", "llama-generate:model=nope",
    "llama-lora-train:optimizer=nope", "training-chain:uF=a", "training-chain:uF=0.1;0.1",
    "training-chain:csv_path=no-such.csv", "training-chain:iterations=0",
    "gpt2-train:depth=0", "bert-train:iterations=-1", "random:min_bytes=0",
    "random:input_fraction=2", "random:max_bytes=1,min_bytes=2", "random:gpus=0",
]
VALID = {"random:"}
"""Specs among the odd ones that are documented successes (an empty option list)."""
MACHINE_SPECS = [
    "", ":", "nope", "p100x4:gpus=0", "p100x4:gpus=-1", "p100x4:gpus=1.5",
    "p100x4:gpu_memory=0", "p100x4:gpu_memory=1XB", "p100x4:duplex=2",
    "p100x4:h2d_bandwidth=nan", "p100x4:h2d_bandwidth=-1", "p100x4:streams=0",
    "p100x4:colour=red", "v100:kernel_latency=inf", "v100:gpu_flops=0",
    "p100x4:gpus=1,gpus=2", "no-such-machine.json",
]
PLANNER_SPECS = ["", "nope", "buildmemgraph:nope=1", "buildmemgraph:victim=nope",
                 "levelwise:victim=", "buildmemgraph:reserve=nan"]


@pytest.mark.parametrize("spec", WORKLOAD_SPECS)
def test_bad_workload_specs(capsys, tmp_path, spec):
    run_in_process(capsys, tmp_path, ["-q", "plan", "--workload", spec, "--machine", MACHINE,
                                      "--out", "o.json"], expect=0 if spec in VALID else 2)


@pytest.mark.parametrize("command", [
    ["plan", "--out", "o.json"], ["compare"], ["run"], ["validate"],
    ["ablate", "determinism"], ["ablate", "parts"], ["sweep", "--workers", "0"]])
def test_an_empty_workload_in_every_command(capsys, tmp_path, command):
    err = run_in_process(capsys, tmp_path, [*command, "--workload", "", "--machine", MACHINE])
    assert "empty name" in err


@pytest.mark.parametrize("spec", MACHINE_SPECS)
def test_bad_machine_specs(capsys, tmp_path, spec):
    run_in_process(capsys, tmp_path, ["plan", "--workload", SMALL, "--machine", spec,
                                      "--out", "o.json"])


@pytest.mark.parametrize("spec", PLANNER_SPECS)
def test_bad_planner_specs(capsys, tmp_path, spec):
    run_in_process(capsys, tmp_path, ["plan", "--workload", SMALL, "--machine", MACHINE,
                                      "--planner", spec, "--out", "o.json"])


OPTIONS = [
    ["simulate", "{d}/mg.json", "--seed", "-1", "--noise", "0.1"],
    ["simulate", "{d}/mg.json", "--seed", "x"],
    ["simulate", "{d}/mg.json", "--noise", "-1"],
    ["simulate", "{d}/mg.json", "--noise", "nan"],
    ["simulate", "{d}/mg.json", "--noise", "inf"],
    ["simulate", "{d}/mg.json", "--noise", "1e308"],
    ["simulate", "{d}/mg.json", "--noise", "10.5"],
    ["simulate", "{d}/mg.json", "--streams", "0"],
    ["simulate", "{d}/mg.json", "--streams", "-1"],
    ["simulate", "{d}/mg.json", "--streams", "x"],
    ["simulate", "{d}/mg.json", "--policy", "nope"],
    ["simulate", "{d}/mg.json", "--gantt", "g.txt"],
    ["simulate", "{d}/mg.json", "--gantt", "no-such-dir/g.png"],
    ["simulate", "{d}/mg.json", "--chrome", "{d}"],
    ["simulate", "{d}/mg.json", "--chrome", "{d}/mg.json"],
    ["simulate", "{d}/mg.json", "--machine", "v100:gpus=1"],
    ["run", "{d}/mg.json", "--seed", "-1"],
    ["run", "{d}/mg.json", "--watchdog", "0"],
    ["run", "{d}/mg.json", "--watchdog", "inf"],
    ["run", "{d}/mg.json", "--backend", "nope"],
    ["run", "{d}/mg.json", "--planner", "levelwise"],
    ["run", "--workload", SMALL],
    ["demo", "--layers", "0"],
    ["demo", "--out", "{d}/mg.json"],
    ["validate", "--workload", SMALL, "--machine", MACHINE, "--runs", "0"],
    ["ablate", "determinism", "--workload", SMALL, "--machine", MACHINE, "--seeds", "0"],
    ["ablate", "determinism", "--workload", SMALL, "--machine", MACHINE, "--noise", "a,b"],
    ["ablate", "determinism", "--workload", SMALL, "--machine", MACHINE, "--noise", "-1"],
    ["ablate", "determinism", "--workload", SMALL, "--machine", MACHINE, "--noise", "0,1e308"],
    ["ablate", "parts", "--workload", SMALL, "--machine", MACHINE, "--plot", "p.png"],
    ["compare", "--workload", SMALL, "--machine", MACHINE, "--out", "t.txt"],
    ["compare", "--workload", SMALL, "--machine", MACHINE, "--plot", "p.csv"],
    ["compare", "--workload", SMALL, "--machine", "disco-example:gpu_memory=1MB"],
    ["sweep", "--workload", SMALL, "--machine", MACHINE, "--grid", "bad"],
    ["sweep", "--workload", SMALL, "--machine", MACHINE, "--grid", "workload.layers="],
    ["sweep", "--workload", SMALL, "--machine", MACHINE, "--grid", "workload.layers=1,1"],
    ["sweep", "--workload", SMALL, "--machine", MACHINE, "--workers", "-1"],
    ["sweep", "--workload", SMALL, "--machine", MACHINE, "--grid", "machine.gpus=0",
     "--workers", "0"],
    ["reproduce", "beaumont-table1", "--time-limit", "-1"],
    ["reproduce", "nope"],
    ["calibrate", "--out", "c.json", "--machine", "nope"],
    ["import-torch", "nope", "--input", "0,3", "--out", "t.json"],
    ["nope"],
    [],
    ["plan", "--workload", SMALL, "--taskgraph", "{d}/tg.json", "--machine", MACHINE,
     "--out", "o.json"],
    ["plan", "--workload", SMALL, "--machine", MACHINE, "--out", ""],
    ["plan", "--workload", SMALL, "--machine", MACHINE],
    ["list", "nope"],
]


@pytest.mark.parametrize("argv", OPTIONS, ids=lambda a: " ".join(a)[:60])
def test_bad_options(capsys, inputs, argv):
    run_in_process(capsys, inputs, argv)


def test_compare_fails_when_every_planner_fails(capsys, tmp_path):
    err = run_in_process(capsys, tmp_path, ["compare", "--workload", SMALL, "--machine",
                                            "disco-example:gpu_memory=1MB", "--planner",
                                            "levelwise", "--planner", "buildmemgraph",
                                            "--out", "t.csv", "--json"])
    assert "every planner failed: levelwise: " in err and "; buildmemgraph: " in err


def test_out_of_memory_is_one_line_naming_the_phase(capsys, tmp_path, monkeypatch):
    from offloadlab.core import workloads

    def exhausted(vertices: int = 100):
        raise MemoryError()
    monkeypatch.setitem(workloads.WORKLOADS, "random", exhausted)
    err = run_in_process(capsys, tmp_path, ["plan", "--workload", "random:vertices=5",
                                            "--machine", MACHINE, "--out", "o.json"])
    assert "out of memory while building random:vertices=5" in err


# -- machine files (in-process) ------------------------------------------------------------
FULL = PRESETS[MACHINE].to_dict()
MACHINE_FILES = {
    "no gpus": json.dumps({k: v for k, v in FULL.items() if k != "gpus"}),
    "no gpu_memory": json.dumps({k: v for k, v in FULL.items() if k != "gpu_memory"}),
    "neither": json.dumps({"name": "mine", "gpu_flops": 1e12}),
    "empty object": "{}",
    "a list": "[]",
    "a list of one": json.dumps([FULL]),
    "null": "null",
    "text": "not json",
    "empty": "",
    "blank": " \n\t ",
    "zeros": "\0" * 4096,
    "truncated": json.dumps(FULL)[:40],
    "gpus as text": json.dumps({**FULL, "gpus": "two"}),
    "gpus 0": json.dumps({**FULL, "gpus": 0}),
    "gpu_memory negative": json.dumps({**FULL, "gpu_memory": -1}),
    "NaN": json.dumps({**FULL, "gpu_flops": float("nan")}),
    "duplex 2": json.dumps({**FULL, "duplex": 2}),
    "unknown field": json.dumps({**FULL, "colour": "red"}),
    "op_rates": json.dumps({**FULL, "op_rates": [["add", -1, 1]]}),
    "utf-16": json.dumps(FULL).encode("utf-16").decode("latin-1"),
    "parquet magic": "PAR1" + "\0" * 64,
}


@pytest.mark.parametrize("case", MACHINE_FILES)
def test_bad_machine_files(capsys, tmp_path, case):
    path = tmp_path / "m.json"
    path.write_bytes(MACHINE_FILES[case].encode("latin-1"))
    err = run_in_process(capsys, tmp_path, ["plan", "--workload", SMALL, "--machine", str(path),
                                            "--out", "o.json"])
    assert "m.json" in err
    if case.startswith(("no ", "neither")):
        assert "a machine file must state gpus and gpu_memory" in err


@pytest.mark.parametrize("machine", [
    json.dumps({"gpus": 2, "gpu_memory": 80 * 2**20}),
    json.dumps({**FULL, "name": "mine"})])
def test_a_machine_file_that_states_its_gpus_is_read(capsys, tmp_path, machine):
    """Documented success: gpus and gpu_memory are all a machine file must state."""
    (tmp_path / "m.json").write_text(machine)
    run_in_process(capsys, tmp_path, ["-q", "plan", "--workload", SMALL, "--machine",
                                      f"{tmp_path}/m.json", "--out", "o.json"], expect=0)


# -- graph files (in-process) --------------------------------------------------------------
def _valid(d: Path, name: str) -> bytes:
    return (d / name).read_bytes()


GRAPH_FILES = {
    "empty": lambda d, v: b"",
    "blank": lambda d, v: b" \n" * 100,
    "null": lambda d, v: b"null",
    "a number": lambda d, v: b"3",
    "a string": lambda d, v: b'"graph"',
    "a list": lambda d, v: b"[]",
    "a list of objects": lambda d, v: b"[{}, {}]",
    "an empty object": lambda d, v: b"{}",
    "zeros": lambda d, v: b"\0" * 65536,
    "random bytes": lambda d, v: bytes(range(256)) * 16,
    "parquet magic only": lambda d, v: b"PAR1" + b"\0" * 100,
    "utf-8 BOM": lambda d, v: b"\xef\xbb\xbf" + v,
    "utf-16": lambda d, v: v.decode().encode("utf-16"),
    "truncated": lambda d, v: v[: len(v) // 2],
    "trailing garbage": lambda d, v: v + b"garbage",
    "nested 100k deep": lambda d, v: b"[" * 100_000 + b"]" * 100_000,
    "a 5000-digit integer": lambda d, v: b'{"nodes": [], "edges": [], "graph": {"x": ' +
                                         b"9" * 5000 + b"}}",
    "NaN bytes": lambda d, v: v.replace(b'"bytes":', b'"bytes":NaN,"x":', 1),
    "invalid utf-8": lambda d, v: v[:20] + b"\xff\xfe" + v[20:],
}


@pytest.mark.parametrize("case", GRAPH_FILES)
@pytest.mark.parametrize("command", ["simulate", "plan", "run"])
def test_bad_graph_files(capsys, inputs, case, command):
    kind = "tg.json" if command == "plan" else "mg.json"
    bad = inputs / f"bad-{kind}"
    bad.write_bytes(GRAPH_FILES[case](inputs, _valid(inputs, kind)))
    argv = {"simulate": ["simulate", str(bad), "--chrome", "c.json"],
            "plan": ["plan", "--taskgraph", str(bad), "--machine", MACHINE, "--out", "o.json"],
            "run": ["run", str(bad), "--no-rate-limit"]}[command]
    err = run_in_process(capsys, inputs, argv)
    assert "bad-" in err


@pytest.mark.parametrize("name", ["missing.json", "a-directory", "mg.parquet"])
def test_graph_paths_that_are_not_files(capsys, inputs, name):
    (inputs / "a-directory").mkdir()
    (inputs / "mg.parquet").write_bytes(_valid(inputs, "mg.json"))   # JSON named .parquet
    run_in_process(capsys, inputs, ["simulate", str(inputs / name)])


# -- runaways (subprocesses under an address-space limit) -----------------------------------
def run_limited(argv: list[str], cwd: Path, timeout: float = 120, limit: int = LIMIT
                ) -> tuple[int, str, int]:
    """``python -m offloadlab ARGV`` in ``cwd`` under ``limit`` bytes of address space:
    (status, stderr, peak RSS in bytes, from ``os.wait4``)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "offloadlab", *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS,
                                                                  (limit, limit)))
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    err = b""
    os.set_blocking(proc.stderr.fileno(), False)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        err += proc.stderr.read() or b""
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"{argv} ran for more than {timeout} s")
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)   # reaped here, not by Popen
    err += proc.stderr.read() or b""
    proc.stderr.close()
    return proc.returncode, err.decode(errors="replace"), usage.ru_maxrss * 1024


def _fifo(d: Path) -> str:
    os.mkfifo(d / "fifo.json")
    return str(d / "fifo.json")


def _sparse(d: Path, name: str, head: bytes, size: int) -> str:
    """A file of ``size`` bytes beginning with ``head``, the rest a hole (no disk used)."""
    with open(d / name, "wb") as f:
        f.write(head)
        f.truncate(size)
    return str(d / name)


def _stored_machine(d: Path, **fields) -> str:
    data = json.loads((d / "mg.json").read_text())
    data["graph"]["machine"].update(fields)
    (d / "big-mg.json").write_text(json.dumps(data))
    return str(d / "big-mg.json")


RUNAWAYS = {
    "simulate --streams 1e9": lambda d: ["simulate", f"{d}/mg.json", "--streams", "1000000000"],
    "run --streams 1e9": lambda d: ["run", f"{d}/mg.json", "--streams", "1000000000"],
    "p100x4:gpus=1e9": lambda d: ["plan", "--workload", SMALL, "--machine", "p100x4:gpus=1e9",
                                  "--out", "o.json"],
    "p100x4:streams=1e10": lambda d: ["plan", "--workload", SMALL, "--machine",
                                      "p100x4:streams=1e10", "--out", "o.json"],
    "simulate --machine gpus=1e9": lambda d: ["simulate", f"{d}/mg.json", "--machine",
                                              "disco-example:gpus=1e9"],
    "stored machine gpus=1e9": lambda d: ["simulate", _stored_machine(d, gpus=10**9)],
    "stored machine streams=1e10": lambda d: ["simulate", _stored_machine(d, streams=10**10)],
    "machine file gpus=1e9": lambda d: ["plan", "--workload", SMALL, "--machine",
                                        _machine_file(d, gpus=10**9), "--out", "o.json"],
    "matmul-chain:layers=1e9": lambda d: ["plan", "--workload", "matmul-chain:layers=1e9",
                                          "--machine", MACHINE, "--out", "o.json"],
    "matmul-chain:gpus=1e6": lambda d: ["plan", "--workload", "matmul-chain:gpus=1e6,hidden=1e6",
                                        "--machine", MACHINE, "--out", "o.json"],
    "random:vertices=1e12": lambda d: ["plan", "--workload", "random:vertices=1e12",
                                       "--machine", MACHINE, "--out", "o.json"],
    "random:vertices=1e9": lambda d: ["compare", "--workload", "random:vertices=1e9",
                                      "--machine", MACHINE],
    "gpt2-train:depth=1e9": lambda d: ["plan", "--workload", "gpt2-train:depth=1e9",
                                       "--machine", "v100", "--out", "o.json"],
    "bert-train:iterations=1e9": lambda d: ["plan", "--workload", "bert-train:iterations=1e9",
                                            "--machine", "v100", "--out", "o.json"],
    "training-chain:iterations=1e10": lambda d: ["plan", "--workload",
                                                 "training-chain:iterations=1e10",
                                                 "--machine", "v100", "--out", "o.json"],
    "llama-prefill:seq=1e7,block=1": lambda d: ["plan", "--workload",
                                                "llama-prefill:seq=1e7,block=1",
                                                "--machine", "a100x8", "--out", "o.json"],
    "llama-lora-train:batch=1e6": lambda d: ["plan", "--workload",
                                             "llama-lora-train:batch=1e6",
                                             "--machine", "a100x8", "--out", "o.json"],
    "sweep workload.vertices=1e12": lambda d: ["sweep", "--workload", "random", "--machine",
                                               MACHINE, "--grid", "workload.vertices=10,1e12",
                                               "--workers", "0", "--store", "s.sqlite"],
    "reproduce --only gpt2-1000000000x16": lambda d: [
        "reproduce", "beaumont-table1", "--only", "gpt2-1000000000x16", "--json"],
    "reproduce --only 7b-100000000": lambda d: ["reproduce", "turnip-prefill", "--only",
                                                "7b-100000000", "--json"],
    "ablate --seeds 1e9": lambda d: ["ablate", "determinism", "--workload", SMALL, "--machine",
                                     MACHINE, "--seeds", "1000000000"],
    "reproduce --seeds 1e9": lambda d: ["reproduce", "turnip-determinism", "--seeds",
                                        "1000000000"],
    "estimate --points 1e9": lambda d: ["estimate", "--workload", SMALL, "--machine", MACHINE,
                                        "--points", "1000000000"],
    "simulate /dev/zero": lambda d: ["simulate", "/dev/zero"],
    "simulate /dev/urandom": lambda d: ["simulate", "/dev/urandom"],
    "run /dev/zero": lambda d: ["run", "/dev/zero"],
    "plan --taskgraph /dev/zero": lambda d: ["plan", "--taskgraph", "/dev/zero", "--machine",
                                             MACHINE, "--out", "o.json"],
    "sweep --taskgraph /dev/zero": lambda d: ["sweep", "--taskgraph", "/dev/zero", "--machine",
                                              MACHINE, "--workers", "0", "--store", "s.sqlite"],
    "--machine /dev/zero": lambda d: ["plan", "--workload", SMALL, "--machine", "/dev/zero",
                                      "--out", "o.json"],
    "training-chain:csv_path=/dev/zero": lambda d: [
        "plan", "--workload", "training-chain:csv_path=/dev/zero", "--machine", "v100",
        "--out", "o.json"],
    "simulate a FIFO": lambda d: ["simulate", _fifo(d)],
    "plan --taskgraph a FIFO": lambda d: ["plan", "--taskgraph", _fifo(d), "--machine",
                                          MACHINE, "--out", "o.json"],
    "2 GB of zeros": lambda d: ["simulate", _sparse(d, "zeros.json", b"", 2 * 10**9)],
    "2 GB of zeros named .parquet": lambda d: ["simulate",
                                               _sparse(d, "zeros.parquet", b"", 2 * 10**9)],
    "2 GB of blanks": lambda d: ["simulate", _sparse(d, "blank.json", b" " * 70000,
                                                     2 * 10**9)],
    "100 GB beginning with {": lambda d: ["simulate", _sparse(d, "huge.json", b"{", 10**11)],
    "100 GB beginning with the toolkit's header": lambda d: [
        "plan", "--taskgraph", _sparse(d, "huge-tg.json", b'{"directed":true', 10**11),
        "--machine", MACHINE, "--out", "o.json"],
    "100 GB of Parquet": lambda d: ["simulate", _sparse(d, "huge.parquet", b"PAR1", 10**11)],
    "100 GB machine file": lambda d: ["plan", "--workload", SMALL, "--machine",
                                    _sparse(d, "huge-m.json", b"{", 10**11), "--out",
                                    "o.json"],
}


def _machine_file(d: Path, **fields) -> str:
    (d / "big-m.json").write_text(json.dumps({**FULL, **fields}))
    return str(d / "big-m.json")


@pytest.fixture(scope="module")
def runaways(tmp_path_factory) -> dict[str, tuple[int, str, int, set[str], set[str]]]:
    """Every runaway case, run two at a time: (status, stderr, peak RSS, files before,
    files after)."""
    base = tmp_path_factory.mktemp("runaways")
    formats.to_json(build_workload(SMALL), base / "tg.json")
    assert main(["-q", "plan", "--taskgraph", str(base / "tg.json"), "--machine", MACHINE,
                 "--out", str(base / "mg.json")]) == 0

    def one(case: str):
        d = base / case.replace("/", "_").replace(" ", "_")
        d.mkdir()
        for name in ("tg.json", "mg.json"):
            (d / name).write_bytes((base / name).read_bytes())
        argv = RUNAWAYS[case](d)
        before = {p.name for p in d.iterdir()}
        code, err, peak = run_limited(argv, d)
        return code, err, peak, before, {p.name for p in d.iterdir()}
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(RUNAWAYS, pool.map(one, RUNAWAYS)))


@pytest.mark.parametrize("case", RUNAWAYS)
def test_runaways_are_refused_in_bounded_memory(runaways, case):
    code, err, peak, before, after = runaways[case]
    assert code == 2, (code, err)
    assert "Traceback" not in err and err.startswith("offloadlab: error: "), err
    assert err.count("\n") == 1, err
    assert after == before, after - before
    assert peak < PEAK, f"{case}: peak RSS {peak / 2**20:.0f} MiB"


def test_running_out_of_memory_is_one_line_naming_the_phase(tmp_path):
    """A graph the RAM would hold but the process's limit (256 MiB of address space) does
    not: the command runs out of memory building it and says so in one line (or, where the
    machine has less than the 4 GB it needs, refuses it before building)."""
    code, err, peak = run_limited(["plan", "--workload", "random:vertices=2e6", "--machine",
                                   MACHINE, "--out", "o.json"], tmp_path, limit=2**28)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("offloadlab: error: out of memory while building random:vertices=2e6"
                          ) or "would need about" in err, err
    assert list(tmp_path.iterdir()) == [] and peak < PEAK


def test_the_runaways_peak_memory(runaways, record_property):
    """The largest peak RSS among the runaway cases (reported; each is checked above)."""
    peaks = {case: r[2] for case, r in runaways.items()}
    worst = max(peaks, key=peaks.__getitem__)
    record_property("peak_rss_mib", peaks[worst] / 2**20)
    print(f"largest peak RSS of {len(peaks)} runaway cases: {worst}, "
          f"{peaks[worst] / 2**20:.0f} MiB")
    assert peaks[worst] < PEAK



# -- a full disk (subprocesses with a file-size limit) ----------------------------------------
def _full_disk(argv: list[str], cwd: Path, **popen) -> subprocess.CompletedProcess:
    """``python -m offloadlab ARGV`` whose files cannot grow past 1 KiB (RLIMIT_FSIZE): a
    write fails as on a full disk, with an error naming no file."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "offloadlab", "-q", *argv], cwd=cwd, env=env,
                          stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                (1024, 1024)), **popen)


@pytest.mark.parametrize("argv,out", [
    (["plan", "--workload", "matmul-chain:layers=4", "--machine", MACHINE, "--out"], "mg.json"),
    (["compare", "--workload", SMALL, "--machine", MACHINE, "--out"], "t.parquet"),
    (["compare", "--workload", SMALL, "--machine", MACHINE, "--plot"], "p.png"),
    (["simulate", "{d}/mg.json", "--chrome"], "c.json"),
    (["demo", "--layers", "2", "--out"], "demo/gantt.png")])
def test_a_full_disk_names_the_output(inputs, argv, out):
    """One line naming the file that could not be written; nothing left."""
    before = {p.name for p in inputs.iterdir()}
    argv = [a.replace("{d}", str(inputs)) for a in argv] + [out.partition("/")[0]]
    done = _full_disk(argv, inputs, stdout=subprocess.DEVNULL)
    check_refusal(done.returncode, done.stderr, inputs, before)
    assert done.stderr.startswith(f"offloadlab: error: {out}: ") and "File too large" in \
        done.stderr, done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_stdout_on_a_full_disk_is_named(tmp_path, unbuffered):
    """``compare --json > FILE`` on a full disk: its output, more than stdout's buffer, fails
    while the command prints it; the line says it was stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": unbuffered}
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "offloadlab", "compare", "--workload", SMALL,
                               "--machine", MACHINE, "--json"], cwd=tmp_path, env=env,
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    check_refusal(done.returncode, done.stderr, tmp_path, set())
    assert done.stderr == "offloadlab: error: stdout: No space left on device\n"


# -- the estimates are upper bounds -------------------------------------------------------
@pytest.mark.parametrize("spec", [
    "matmul-chain", "matmul-chain:layers=3,gpus=4", "tp-matmul", "random:vertices=77",
    "training-chain", "training-chain:iterations=5", "gpt2-train:depth=4", "bert-train",
    "llama-prefill:model=tiny,seq=64,block=8,batch=3,gpus=4",
    "llama-prefill:model=7b,seq=24,block=8,gpus=2",
    "llama-lora-train:model=tiny,seq=64,block=16,batch=2,gpus=2",
    "llama-lora-train:model=7b,seq=16,block=8",
    "llama-generate:model=tiny,seq=24,block=8,batch=3,gen=5,gpus=2",
    "llama-generate:model=tiny,seq=5,block=2,batch=2,gen=30,gpus=4",
    "llama-generate:model=7b,seq=16,gen=2",
])
def test_vertex_estimates_bound_the_graphs_built(spec):
    name, raw = parse_spec(spec)
    estimate = estimated_vertices(name, apply_options(workload_options(name), raw, spec))
    built = len(build_workload(spec))
    assert built <= estimate <= 1.6 * built, (built, estimate)


# -- signals (subprocesses) ---------------------------------------------------------------
def _program(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "offloadlab", "-q", *argv], cwd=cwd,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs."""
    import psutil
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pids: list[int]) -> list[int]:
    import psutil
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_for(ready, timeout: float = 120,
              failure: str = "the command never reached the point to signal") -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail(failure)
        time.sleep(0.02)


BIG = "random:vertices=60000,gpus=2,host_fraction=1,min_bytes=4096,max_bytes=65536"


@pytest.mark.parametrize("sig,code,line", [(signal.SIGTERM, 143, "offloadlab: terminated"),
                                           (signal.SIGINT, 130, "offloadlab: interrupted")])
def test_a_signal_while_writing_leaves_nothing(tmp_path, sig, code, line, ctrl_c):
    """Signalled once its temporary output file exists (the write has started)."""
    proc = _program(["plan", "--workload", BIG, "--machine", "p100x4:gpus=2,gpu_memory=64MiB",
                     "--out", "mg.json"], tmp_path)
    _wait_for(lambda: any(p.name.startswith(".mg.json.") for p in tmp_path.iterdir())
              or proc.poll() is not None)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the command finished before the signal")
    assert proc.returncode == code and err == line + "\n", (proc.returncode, err)
    _nothing_half_written(tmp_path, "mg.json")


@pytest.fixture(scope="module")
def big_memgraph(tmp_path_factory) -> Path:
    """A MemGraph of :data:`BIG`, which takes seconds to read, simulate or run."""
    d = tmp_path_factory.mktemp("big")
    formats.to_json(build_workload(BIG), d / "tg.json")
    assert main(["-q", "plan", "--taskgraph", str(d / "tg.json"), "--machine",
                 "p100x4:gpus=2,gpu_memory=64MiB", "--out", str(d / "mg.json")]) == 0
    return d / "mg.json"


def _nothing_half_written(directory: Path, output: str) -> None:
    """No temporary file in ``directory``, and nothing but ``output``, which a signal after
    its rename into place (a complete file) may leave."""
    assert {p.name for p in directory.iterdir()} <= {output}


def _reading(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open."""
    import psutil
    try:
        return any(f.path == str(path) for f in psutil.Process(pid).open_files())
    except psutil.Error:
        return False


@pytest.mark.parametrize("delay", [0.0, 1.5])
@pytest.mark.parametrize("argv", [
    ["simulate", "{mg}", "--chrome", "c.json"],
    ["run", "{mg}", "--no-rate-limit", "--chrome", "c.json"],
], ids=["simulate", "run"])
def test_sigterm_while_working_is_one_line_and_143(big_memgraph, tmp_path, argv, delay):
    """Signalled as it reads its MemGraph, and later (simulating, or running on the
    executor's threads)."""
    mg, out = big_memgraph, tmp_path
    proc = _program([a.replace("{mg}", str(mg)) for a in argv], out)
    _wait_for(lambda: _reading(proc.pid, mg) or proc.poll() is not None)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the command finished before the signal")
    assert proc.returncode == 143 and err == "offloadlab: terminated\n", err
    _nothing_half_written(out, "c.json")


@pytest.mark.parametrize("delay", [0.0, 4.0])
def test_sigterm_stops_a_sweep_and_its_workers(tmp_path, delay):
    """As its dask workers start (0 s after they exist) and while they run: one line, 143,
    no worker left, no table written (the store keeps what finished)."""
    pytest.importorskip("dask.distributed")
    proc = _program(["sweep", "--workload", "random:vertices=20000,host_fraction=1,"
                     "min_bytes=4096,max_bytes=65536", "--machine", "p100x4:gpu_memory=64MiB",
                     "--grid", "workload.seed=0,1,2,3,4,5,6,7,8,9,10,11", "--workers", "2",
                     "--out", "t.csv", "--store", "s.sqlite"], tmp_path)
    _wait_for(lambda: len(_children(proc.pid)) >= 2 or proc.poll() is not None)
    time.sleep(delay)
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the sweep finished before the signal")
    assert proc.returncode == 143 and err == "offloadlab: terminated\n", err
    time.sleep(1)
    assert _alive(workers) == []
    assert {p.name for p in tmp_path.iterdir()} <= {"s.sqlite"}


def _in_own_group(argv: list[str], cwd: Path, err: Path) -> subprocess.Popen:
    """``offloadlab ARGV`` as a shell starts a job in the foreground: in a process group of
    its own (which the test signals as a terminal does), with SIGINT's default action (a
    test runner, or a shell's background job, may ignore it); stderr to ``err``."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with err.open("w") as stderr:
        return subprocess.Popen([sys.executable, "-m", "offloadlab", *argv], cwd=cwd, env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _group(pgid: int) -> list[int]:
    """The processes (zombies aside) of process group ``pgid``."""
    import psutil
    found = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process.pid)
        except (OSError, psutil.Error):
            pass
    return found


def _worker_started(pid: int) -> bool:
    """Whether one of ``pid``'s processes is a dask worker (a multiprocessing spawn)."""
    import psutil
    for child in _children(pid):
        try:
            if "--multiprocessing-fork" in psutil.Process(child).cmdline():
                return True
        except psutil.Error:
            pass
    return False


SWEEP = ["sweep", "--workload", "random:vertices=2000,host_fraction=1,min_bytes=4096,"
         "max_bytes=65536", "--machine", "p100x4:gpu_memory=64MiB", "--grid",
         "workload.seed=0,1,2,3", "--workers", "2", "--out", "t.csv", "--store", "s.sqlite"]
RUNNING = " to run\n"          # the sweep's line once its workers are up and its points sent


@pytest.mark.parametrize("moment", ["first process", "first worker", "running"])
@pytest.mark.parametrize("sig,code,line", [(signal.SIGINT, 130, "offloadlab: interrupted"),
                                           (signal.SIGTERM, 143, "offloadlab: terminated")],
                         ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_a_sweeps_group_stops_it_as_its_cluster_starts(tmp_path, moment, sig,
                                                                   code, line):
    """A terminal's Ctrl-C (SIGINT to the whole process group, workers included) or a
    SIGTERM to the group, as the LocalCluster starts (its first process, multiprocessing's
    resource tracker; its first worker process) or once the sweep runs: one line, the
    status, no process of the group left, no table written (the store keeps what
    finished).  During start-up the sweep must stop before it reports its points; a signal
    that lands after start-up (a test process starved for seconds) retries."""
    pytest.importorskip("dask.distributed")
    ready = {"first process": lambda proc, err: bool(_children(proc.pid)),
             "first worker": lambda proc, err: _worker_started(proc.pid),
             "running": lambda proc, err: RUNNING in err.read_text()}[moment]
    for attempt in range(3):
        out = tmp_path / str(attempt)
        out.mkdir()
        err = tmp_path / f"err{attempt}"
        proc = _in_own_group(SWEEP, out, err)
        _wait_for(lambda: ready(proc, err) or proc.poll() is not None)
        os.killpg(proc.pid, sig)
        proc.wait(timeout=300)
        # its resource tracker, which warns of what was left, is the last to end
        _wait_for(lambda: not _group(proc.pid), 60, "processes of the sweep left running")
        said = err.read_text()
        if moment == "running" and proc.returncode == 0:
            pytest.skip("the sweep finished before the signal")
        if moment != "running" and RUNNING in said and proc.returncode == code:
            continue                    # signalled once start-up had ended: try again
        assert proc.returncode == code, (proc.returncode, said)
        assert {p.name for p in out.iterdir()} <= {"s.sqlite"}, said
        lines = said.splitlines()
        assert lines[-1] == line and len(lines) == (2 if moment == "running" else 1), said
        return
    pytest.fail("never signalled while the cluster started")


def test_compare_names_each_failed_planner_once(capsys, tmp_path):
    """A deployed scheme's error already starts with its name: not said twice."""
    err = run_in_process(capsys, tmp_path, ["compare", "--workload", SMALL, "--machine",
                                            "disco-example:gpu_memory=1MB", "--planner",
                                            "accelerate-offload", "--planner", "levelwise"])
    assert "accelerate-offload: accelerate-offload:" not in err
    assert "every planner failed: accelerate-offload: " in err and "; levelwise: " in err


def test_compare_lists_a_refusal_beside_plans_naming_its_planner_once(capsys):
    """compare on a generation: levelwise plans, accelerate-offload (its error starting with its
    name) and zero-offload (with an option) refuse, each in one line naming it once, as given."""
    code = main(["compare", "-q", "--workload", "llama-generate:model=tiny,seq=8,gen=2",
                 "--machine", "v100:gpu_memory=60KB", "--planner", "accelerate-offload",
                 "--planner", "levelwise", "--planner", "zero-offload:dpu=true"])
    out = capsys.readouterr().out
    assert code == 0
    refused = [line for line in out.splitlines()
               if line.startswith(("accelerate-offload", "zero-offload"))]
    assert refused[0].startswith("accelerate-offload: the deployed scheme runs out of memory")
    assert refused[1].startswith("zero-offload:dpu=true: zero-offload plans training steps")
    assert len(refused) == 2


@pytest.mark.parametrize("command", [["compare"], ["estimate"],
                                     ["-q", "sweep", "--workers", "0", "--store", "s.sqlite"]])
def test_a_problem_no_plan_can_finish_is_refused(capsys, tmp_path, command):
    """A rate so small that every duration overflows (gpu_flops=1e-300): the problem's lower
    bound is inf, refused in one line before any work (compare and estimate printed inf and
    exited 0; sweep's store refused the row with a ValueError traceback)."""
    (tmp_path / "s.sqlite").touch()     # a sweep's store is kept, as after any failed point
    err = run_in_process(capsys, tmp_path, [*command, "--workload", SMALL, "--machine",
                                            "p100x4:gpu_flops=1e-300"])
    assert "lower bound is inf s" in err and "too large for the machine's rates" in err


@pytest.mark.parametrize("field", ["bytes", "flops"])
def test_integers_beyond_the_float_range_in_a_graph_file(capsys, inputs, field):
    """``"bytes": 10**400`` (a count) and ``"flops": 10**400`` (a float): one line each, the
    value shown as 1.000e+400 (formatting it as a float raised OverflowError)."""
    text = (inputs / "mg.json").read_text()
    i = text.index(f'"{field}":') + len(f'"{field}":')
    j = min(text.index(",", i), text.index("}", i))
    (inputs / "big.json").write_text(text[:i] + "1" + "0" * 400 + text[j:])
    err = run_in_process(capsys, inputs, ["simulate", "{d}/big.json"])
    assert f"{field} must be " in err and "1.000e+400" in err
