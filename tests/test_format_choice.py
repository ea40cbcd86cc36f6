"""Which format a MemGraph file is written in (formats.write_memgraph, ``plan --out``; issue
46): the suffix ``.json`` or ``.parquet`` is obeyed; any other name gets Parquet from
``formats.PARQUET_VERTICES`` vertices on, JSON below; every command that reads a MemGraph
tells them apart by their first bytes; ``plan --out X.json`` of a large MemGraph notes on
stderr what Parquet would save, unless ``-q``.  The threshold is lowered here, as the
benchmark's 165k vertices would take seconds."""

from __future__ import annotations

import re
import sys

import pytest
from test_malformed import run_cli

from offloadlab.core import formats
from offloadlab.core.formats import nodelink
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.planner import plan

WORKLOAD = "matmul-chain:layers=3"
MACHINE = "disco-example"


@pytest.fixture(scope="module")
def mg():
    return plan(build_workload(WORKLOAD), machine_from_spec(MACHINE))


def is_parquet(path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == nodelink.PARQUET_MAGIC


@pytest.mark.parametrize("name", ["mg", "mg.bin", "plans/mg.memgraph"])
def test_a_name_without_either_suffix_gets_the_format_of_its_size(mg, name, tmp_path,
                                                                  monkeypatch):
    (tmp_path / "plans").mkdir()
    path = tmp_path / name
    monkeypatch.setattr(formats, "PARQUET_VERTICES", len(mg) + 1)
    assert formats.write_memgraph(mg, path) == "json" and not is_parquet(path)
    monkeypatch.setattr(formats, "PARQUET_VERTICES", len(mg))
    assert formats.write_memgraph(mg, path) == "parquet" and is_parquet(path)
    assert formats.to_json(formats.read_memgraph(path)) == formats.to_json(mg)


@pytest.mark.parametrize("name,fmt", [("mg.json", "json"), ("MG.JSON", "json"),
                                      ("mg.parquet", "parquet"), ("mg.Parquet", "parquet")])
@pytest.mark.parametrize("threshold", [1, 10**9])
def test_an_explicit_suffix_is_obeyed_at_any_size(mg, name, fmt, threshold, tmp_path,
                                                  monkeypatch):
    monkeypatch.setattr(formats, "PARQUET_VERTICES", threshold)
    assert formats.write_memgraph(mg, tmp_path / name) == fmt
    assert is_parquet(tmp_path / name) == (fmt == "parquet")


def test_without_pyarrow_the_toolkit_chooses_json(mg, tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "PARQUET_VERTICES", 1)
    assert formats.memgraph_suffix(len(mg)) == ".parquet"
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert formats.memgraph_suffix(len(mg)) == ".json"
    assert formats.write_memgraph(mg, tmp_path / "mg") == "json"


def plan_to(capsys, out, *extra: str) -> tuple[str, str]:
    code, stdout, err = run_cli(capsys, ["plan", "--workload", WORKLOAD, "--machine", MACHINE,
                                         "--out", str(out), *extra])
    assert code == 0, err
    return stdout, err


def test_plan_says_which_format_it_chose(capsys, mg, tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "PARQUET_VERTICES", len(mg))
    out, _ = plan_to(capsys, tmp_path / "big")
    assert out.startswith(f"wrote {tmp_path / 'big'} as Parquet: {len(mg)} vertices")
    assert is_parquet(tmp_path / "big")
    monkeypatch.setattr(formats, "PARQUET_VERTICES", len(mg) + 1)
    out, _ = plan_to(capsys, tmp_path / "small")
    assert out.startswith(f"wrote {tmp_path / 'small'} as node-link JSON: {len(mg)} vertices")
    out, _ = plan_to(capsys, tmp_path / "mg.parquet")
    assert out.startswith(f"wrote {tmp_path / 'mg.parquet'}: {len(mg)} vertices")


def test_plan_notes_what_parquet_would_save_for_a_large_json_file(capsys, mg, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setattr(formats, "PARQUET_VERTICES", len(mg))
    out, err = plan_to(capsys, tmp_path / "mg.json")
    assert not is_parquet(tmp_path / "mg.json")
    size = (tmp_path / "mg.json").stat().st_size
    times = size / (formats.PARQUET_BYTES_PER_VERTEX * len(mg))
    assert err == (f"offloadlab: note: {tmp_path / 'mg.json'} holds {len(mg)} vertices; as "
                   f"Parquet (--out {tmp_path / 'mg.parquet'}) it would be about {times:.0f} "
                   f"times smaller and faster to read\n")
    assert out.startswith(f"wrote {tmp_path / 'mg.json'}: ")
    assert plan_to(capsys, tmp_path / "q.json", "-q")[1] == ""
    for name in ("mg.parquet", "mg"):                  # nothing to say: it is Parquet
        assert plan_to(capsys, tmp_path / name)[1] == ""
    monkeypatch.setattr(formats, "PARQUET_VERTICES", len(mg) + 1)
    assert plan_to(capsys, tmp_path / "small.json")[1] == ""


def test_every_command_that_reads_a_memgraph_reads_one_of_either_format(capsys, mg, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setattr(formats, "PARQUET_VERTICES", len(mg))
    assert formats.write_memgraph(mg, tmp_path / "a") == "parquet"
    formats.write_memgraph(mg, tmp_path / "b.json")
    for argv in (["simulate", "a"], ["simulate", "b.json"], ["run", "a"], ["diff", "a", "b.json"],
                 ["diff", "b.json", "a"]):
        code, out, err = run_cli(capsys, [argv[0], *(str(tmp_path / x) for x in argv[1:])])
        assert code == 0, (argv, err)
        assert not re.search(r"error|Traceback", err), (argv, err)
