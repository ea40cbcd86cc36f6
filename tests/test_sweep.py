"""offloadlab sweep (issue 18): grids, the store, resuming, dask.distributed."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import offloadlab
from offloadlab.core.errors import SpecError
from offloadlab.lab import sweep as sweeps
from offloadlab.lab.cli import main
from offloadlab.lab.sweep import Store, grid, parse_axis, sweep, tree_hash

WORKLOAD = "random:vertices=30,gpus=2"
MACHINE = "p100x4:gpus=2,gpu_memory=40MB"


def points(*axes, planners=("levelwise", "buildmemgraph"), policies=("dynamic",)):
    return grid(WORKLOAD, None, MACHINE, list(planners), list(policies), list(axes))


def test_grid_is_the_product_of_its_axes_in_order():
    ps = points("machine.h2d_bandwidth=4e9,12e9", "workload.seed=0,1,2")
    assert len(ps) == 2 * 2 * 3
    assert ps[0].planner == "levelwise" and ps[0].policy == "dynamic"
    assert ps[0].coordinates == (("machine.h2d_bandwidth", "4e9"), ("workload.seed", "0"))
    assert ps[1].workload == "random:vertices=30,gpus=2,seed=1"
    assert ps[3].machine == "p100x4:gpus=2,gpu_memory=40MB,h2d_bandwidth=12e9"
    assert [p.planner for p in points("planner=l2l;buildmemgraph:victim=lru,ahead=false")] == \
        ["l2l", "buildmemgraph:victim=lru,ahead=false"]


@pytest.mark.parametrize("axis,message", [
    ("machine.colour=1,2", "unknown option.*colour"), ("workload.nope=1", "unknown option"),
    ("machine.h2d_bandwidth=4e9,,2", "an empty value"), ("machine.h2d_bandwidth=1,1", "twice"),
    ("speed=1,2", "expected machine.FIELD"), ("machine.=1", "expected machine.FIELD"),
    ("planner=nope", "unknown planner"), ("policy=eager", "unknown"),
    ("machine.h2d_bandwidth=fast", "cannot read 'fast'")])
def test_bad_axes_are_refused_before_any_work(axis, message):
    with pytest.raises(SpecError, match=message):
        points(axis)


def test_an_axis_twice_and_workload_axes_on_a_file():
    with pytest.raises(SpecError, match="an axis given twice"):
        points("workload.seed=1", "workload.seed=2")
    with pytest.raises(SpecError, match="need --workload"):
        grid(None, "tg.json", MACHINE, ["levelwise"], ["dynamic"], ["workload.seed=1"])
    assert parse_axis("planner=a:x=1,y=2;b") == ("planner", ["a:x=1,y=2", "b"])


def figures(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns="plan_seconds")        # the only field that depends on timing


def test_an_interrupted_sweep_resumes_and_ends_with_the_same_table(tmp_path):
    ps = points("machine.h2d_bandwidth=4e9,12e9,25e9", "workload.seed=0,1")
    whole = sweep(ps, Store(tmp_path / "whole.sqlite"), workers=0)
    assert len(whole) == 12 and whole.makespan.notna().all()

    store = Store(tmp_path / "resumed.sqlite")

    def stop_after_five(done, total):
        if done == 5:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        sweep(ps, store, workers=0, progress=stop_after_five)
    lines: list[str] = []
    resumed = sweep(ps, store, workers=0, say=lines.append)
    assert lines == [f"12 points: 5 already in {store.path}, 7 to run"]
    pd.testing.assert_frame_equal(figures(resumed), figures(whole))
    again: list[str] = []
    sweep(ps, store, workers=0, say=again.append)
    assert again == [f"12 points: 12 already in {store.path}, 0 to run"]


def test_a_point_whose_parameters_change_is_run_again(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    sweep(points("workload.seed=0"), store, workers=0)
    said: list[str] = []
    sweep(points("workload.seed=0", planners=("levelwise", "buildmemgraph:victim=lru")), store,
          workers=0, say=said.append)
    assert said == [f"2 points: 1 already in {store.path}, 1 to run"]


def test_a_change_to_the_code_misses_the_store(tmp_path, monkeypatch):
    """A point's key holds the hash of the package's files, not its version number: after a
    planner changes, a rerun plans again instead of returning the old rows."""
    store = Store(tmp_path / "s.sqlite")
    ps = points("workload.seed=0,1")
    sweep(ps, store, workers=0)
    said: list[str] = []
    sweep(ps, store, workers=0, say=said.append)
    assert said == [f"4 points: 4 already in {store.path}, 0 to run"]
    monkeypatch.setattr(sweeps, "code_hash", lambda: "an edited planner")
    sweep(ps, store, workers=0, say=said.append)
    assert said[1] == f"4 points: 0 already in {store.path}, 4 to run"


def test_tree_hash_follows_every_file_but_bytecode(tmp_path):
    (tmp_path / "planner").mkdir()
    (tmp_path / "planner" / "a.py").write_text("x = 1\n")
    (tmp_path / "data.json").write_text("{}")
    first = tree_hash(tmp_path)
    (tmp_path / "planner" / "__pycache__").mkdir()
    (tmp_path / "planner" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"cache")
    assert tree_hash(tmp_path) == first
    (tmp_path / "planner" / "a.py").write_text("x = 2\n")
    assert tree_hash(tmp_path) != first
    (tmp_path / "planner" / "a.py").write_text("x = 1\n")
    (tmp_path / "planner" / "a.py").rename(tmp_path / "planner" / "b.py")
    assert tree_hash(tmp_path) != first
    assert sweeps.code_hash() == tree_hash(Path(sweeps.__file__).resolve().parents[1])


def test_each_sweep_has_a_store_of_its_own_by_default(tmp_path, monkeypatch, capsys):
    """Not one ./sweep.sqlite per folder: offloadlab-out/sweep-NAME-HASH.sqlite per sweep,
    the same one when the same sweep runs again."""
    monkeypatch.chdir(tmp_path)
    said: list[str] = []
    sweep(points("workload.seed=0"), workers=0, say=said.append)
    sweep(points("workload.seed=1"), workers=0, say=said.append)
    sweep(points("workload.seed=0"), workers=0, say=said.append)
    stores = sorted((tmp_path / "offloadlab-out").iterdir())
    assert len(stores) == 2 and all(p.name.startswith("sweep-random-") for p in stores)
    assert said[2] == f"2 points: 2 already in {said[0].split(' in ')[1].split(',')[0]}, 0 to run"
    assert main(["sweep", "--workload", WORKLOAD, "--machine", MACHINE, "--grid",
                 "workload.seed=0,1", "--workers", "0", "--quiet"]) == 0
    assert len(list((tmp_path / "offloadlab-out").iterdir())) == 3
    assert not (tmp_path / "sweep.sqlite").exists()


@pytest.mark.slow
def test_two_hundred_points_on_a_local_cluster(tmp_path):
    pytest.importorskip("dask.distributed")
    ps = points(",".join(["machine.h2d_bandwidth=" + ",".join(f"{b}e9" for b in range(1, 11))]),
                "workload.seed=" + ",".join(map(str, range(10))))
    assert len(ps) == 200
    table = sweep(ps, Store(tmp_path / "s.sqlite"), workers=2)
    ran = table.makespan.notna()
    assert len(table) == 200 and ran.sum() >= 150
    assert table.error[~ran].str.contains("has a capacity of 40000000 bytes").all()  # seed 2
    assert (table.makespan[ran] >= table.problem_bound[ran] * (1 - 1e-9)).all()
    serial = sweep(ps[:20], Store(tmp_path / "serial.sqlite"), workers=0)
    pd.testing.assert_frame_equal(figures(table.iloc[:20]), figures(serial))


def test_sweep_cli_json_and_bad_cluster(capsys, tmp_path):
    store = tmp_path / "s.sqlite"
    argv = ["sweep", "--workload", WORKLOAD, "--machine", MACHINE, "--grid",
            "workload.seed=0,1", "--store", str(store), "--workers", "0"]
    assert main([*argv, "--json", "--out", str(tmp_path / "t.csv"),
                 "--plot", str(tmp_path / "t.png")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["workload.seed"], r["planner"]) for r in rows] == [
        (0, "levelwise"), (1, "levelwise"), (0, "buildmemgraph"), (1, "buildmemgraph")]
    assert (tmp_path / "t.png").stat().st_size > 0
    assert [r["workload"] for r in rows] == [f"{WORKLOAD},seed={s}" for s in (0, 1, 0, 1)]
    assert {r["machine"] for r in rows} == {MACHINE} and {r["error"] for r in rows} == {None}
    assert main(["sweep", "--workload", WORKLOAD, "--machine", MACHINE, "--store",
                 str(tmp_path / "new.sqlite"), "--cluster", "tcp://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("offloadlab: error: --cluster tcp://127.0.0.1:9: no scheduler")
    assert main([*argv, "--grid", "machine.colour=red"]) == 2
    assert "unknown option(s) colour" in capsys.readouterr().err
    assert len(Store(store).rows([])) == 0 and store.stat().st_size > 0   # nothing lost


def test_a_sweep_whose_every_point_failed_exits_2_and_writes_no_table(capsys, tmp_path):
    """As compare does when every planner failed; the failures are kept in the store."""
    store, out = tmp_path / "s.sqlite", tmp_path / "t.csv"
    argv = ["sweep", "--workload", "matmul-chain", "--machine", "p100x4", "--store", str(store),
            "--workers", "0", "--out", str(out), "--grid"]
    assert main([*argv, "workload.layers=-1,-2"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == ("offloadlab: error: every point failed: matmul-chain: layers must be "
                   "positive, got -1 (and 1 other error(s))"), err
    assert not out.exists() and len(Store(store).rows([])) == 0
    assert main([*argv, "workload.layers=2,-2"]) == 0 and out.exists()     # one point is a result


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_sweep_rows_say_what_they_measured(tmp_path, capsys, suffix):
    """Each row of the table carries the full workload and machine specs (overrides and grid
    values included), the planner spec, the policy and the version; bytes and seconds are
    numbers (a grid value in the field's unit), and no error is an empty cell, not None."""
    out = tmp_path / f"t{suffix}"
    assert main(["sweep", "--workload", WORKLOAD, "--machine", MACHINE, "--grid",
                 "machine.gpu_memory=40MB,1GiB", "--planner", "levelwise", "--planner", "l2l",
                 "--store", str(tmp_path / "s.sqlite"), "--workers", "0", "--out", str(out)]
                ) == 0
    printed = capsys.readouterr().out
    assert "None" not in printed and "<NA>" not in printed and " MiB" in printed
    table = pd.read_csv(out, keep_default_na=False) if suffix == ".csv" else \
        pd.read_parquet(out)
    assert list(table.workload) == [WORKLOAD] * 4
    assert list(table.machine) == ["p100x4:gpus=2,gpu_memory=40MB",
                                   "p100x4:gpus=2,gpu_memory=1GiB"] * 2
    assert list(table["machine.gpu_memory"]) == [40_000_000, 2**30] * 2
    assert list(table.planner) == ["levelwise"] * 2 + ["l2l"] * 2
    assert set(table.policy) == {"dynamic"} and set(table.version) == {offloadlab.__version__}
    ok = table[table.planner == "levelwise"]
    assert list(ok.error) == ["", ""] if suffix == ".csv" else ok.error.isna().all()
    for column in ("bytes_h2d", "peak_memory", "loads"):            # integers, not 1.0e8
        assert all(str(b).isdigit() for b in ok[column]), ok[column]
    assert (ok.makespan.astype(float) > 0).all()                     # seconds, a number
    assert table[table.planner == "l2l"].error.str.contains("not a training workload").all()


def test_a_store_that_is_not_one_is_refused(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("not a database\n" * 100)
    with pytest.raises(SpecError, match="is not a sweep store"):
        Store(other)
    assert other.read_text() == "not a database\n" * 100


def test_closing_a_cluster_is_bounded():
    """A client or cluster that does not close in time is left to end with the process; the
    other is still closed, and no error replaces the one the sweep stops with."""
    closed = []

    class Stuck:
        def __init__(self, name: str, hangs: bool):
            self.name, self.hangs = name, hangs

        def close(self, timeout=None):
            closed.append((self.name, timeout))
            if self.hangs:
                raise TimeoutError(f"timed out after {timeout} s.")

    sweeps._close(Stuck("client", True), Stuck("cluster", False))
    sweeps._close(None, Stuck("cluster", True))
    limit = sweeps.CLOSE_TIMEOUT
    assert closed == [("client", limit), ("cluster", limit), ("cluster", limit)]


@pytest.mark.parametrize("address", ["nonsense", "tcp://"])
def test_a_malformed_cluster_address_is_one_line(capsys, tmp_path, address):
    """dask refuses the address with a ValueError (a traceback before)."""
    assert main(["sweep", "--workload", WORKLOAD, "--machine", MACHINE, "--store",
                 str(tmp_path / "s.sqlite"), "--cluster", address]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"offloadlab: error: --cluster {address}: not a scheduler address")
    assert err.count("\n") == 1
