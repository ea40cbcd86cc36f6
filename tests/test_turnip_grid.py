"""Issue 19, TURNIP's LLaMA grids in simulation (Sec. 8): the prefill grid (Figs. 10-12) and
the LoRA training grid (Fig. 13) through their shared runner: points parsed or refused in one
error, the table's columns, OOM rows, the paper's seconds beside ours, and the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest

from offloadlab.core.errors import SpecError
from offloadlab.lab.cli import main
from offloadlab.lab.turnip_grid import Point, evaluate, parse_points, run
from offloadlab.lab.turnip_lora import LORA, PAPER_65B
from offloadlab.lab.turnip_prefill import PREFILL

TINY = "tiny-64x2@p100x4,tiny-128@p100x4"    # tiny has 4 heads: 4 GPUs, not 8


def test_points_parse_with_and_without_batch_and_server():
    assert parse_points(LORA, "7b-1024,65b-1024x8@a100x8") == [
        Point("7b", 1024, "p100x4"), Point("7b", 1024, "a100x8"),
        Point("65b", 1024, "a100x8", 8)]
    assert str(Point("65b", 1024, "a100x8", 8)) == "65b-1024x8@a100x8"
    assert str(Point("7b", 2048, "p100x4")) == "7b-2048@p100x4"
    # Fig. 12: one sequence, 1K-32K; Figs. 10-11: batch 8 at 1K-16K and 16 at 1K-8K
    assert len(PREFILL.grid) == 2 * 2 * (6 + 5 + 4)
    assert {p.batch for p in PREFILL.grid} == {1, 8, 16}
    assert max(p.seq for p in PREFILL.grid if p.batch == 8) == 16384
    assert max(p.seq for p in PREFILL.grid if p.batch == 16) == 8192
    assert len(LORA.grid) == 2 * 4 * 3 + 2 and PAPER_65B in LORA.grid
    assert set(LORA.paper) <= set(LORA.grid) and not LORA.paper_oom & set(LORA.paper)


@pytest.mark.parametrize("bad", ["8b-1024", "7b-0", "7b-1k", "7b-1024@h100", "7b-1024x0",
                                 "7b-1024x", "7b-1024xb", "7b"])
def test_a_bad_point_is_one_error(bad):
    with pytest.raises(SpecError, match=f"bad point '{bad}': expected MODEL-SEQ"):
        parse_points(LORA, bad)


def test_a_point_the_server_cannot_split_is_the_builders_error():
    with pytest.raises(SpecError, match="llama-lora-train: tiny has heads 4, not divisible by "
                                        r"gpus \(8\)"):
        parse_points(LORA, "tiny-64@a100x8")


def test_reproduce_turnip_lora_writes_the_table_and_a_plot(tmp_path, capsys):
    code = main(["reproduce", "turnip-lora", "--only", TINY, "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "buildmemgraph" in out and "levelwise" in out
    assert "58.5 s" in out                     # the paper's 65B number, printed as a note
    assert sorted(p.name for p in tmp_path.iterdir()) == ["turnip-lora.csv", "turnip-lora.png"]
    table = pd.read_csv(tmp_path / "turnip-lora.csv")
    assert list(table.columns) == [
        "workload", "model", "seq", "batch", "machine", "planner", "policy", "step", "status",
        "host_peak", "taskgraph", "memgraph", "offloads", "loads", "build_s", "plan_s",
        "verify_s", "simulate_s", "paper", "paper_outcome", "ratio", "version"]
    assert set(table["workload"]) == {"llama-lora-train:model=tiny,seq=64,batch=2,gpus=4",
                                      "llama-lora-train:model=tiny,seq=128,batch=1,gpus=4"}
    assert set(table["policy"]) == {"dynamic"} and set(table["version"]) == {"0.1.0"}
    assert list(zip(table["seq"], table["batch"], table["planner"])) == [
        (64, 2, "buildmemgraph"), (64, 2, "levelwise"),
        (128, 1, "buildmemgraph"), (128, 1, "levelwise")]
    assert (table["status"] == "ok").all() and (table["step"] > 0).all()
    assert (table[["build_s", "plan_s", "verify_s", "simulate_s"]] > 0).all().all()
    assert table["paper"].isna().all() and table["paper_outcome"].isna().all()
    assert (table["host_peak"] > 0).all() and table["ratio"].isna().all()
    # the same tokens in two sequences: a row block each, so more vertices
    assert table["taskgraph"][0] > table["taskgraph"][2]


def test_the_json_rows_are_the_tables(capsys):
    assert main(["reproduce", "turnip-lora", "--only", "tiny-64@p100x4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [list(r) for r in rows] == [LORA.columns] * 2
    assert [r["planner"] for r in rows] == ["buildmemgraph", "levelwise"]


def test_a_point_without_a_plan_is_marked_oom():
    rows = evaluate(LORA, Point("tiny", 64, "p100x4:gpu_memory=40000", 2))
    assert [r["planner"] for r in rows] == ["buildmemgraph", "levelwise"]
    for r in rows:
        assert r["status"].startswith("OOM: vertex 'embed.b0'") and "gpu0" in r["status"]
        assert math.isnan(r["step"]) and math.isnan(r["simulate_s"]) and r["memgraph"] == 0
        assert r["plan_s"] > 0 and r["taskgraph"] > 0


def test_the_papers_seconds_go_beside_their_point_only():
    point = Point("tiny", 64, "p100x4", 2)
    failed = Point("tiny", 128, "p100x4")
    table = run(replace(LORA, paper={point: 58.5}, paper_oom=frozenset({failed})),
                [point, Point("tiny", 64, "p100x4"), failed], progress=False)
    assert list(table["paper"][:2]) == [58.5, 58.5] and table["paper"][2:].isna().all()
    assert list(table["ratio"][:2]) == [s / 58.5 for s in table["step"][:2]]
    assert table["ratio"][2:].isna().all()
    assert list(table["paper_outcome"].fillna("")) == ["ok", "ok", "", "", "OOM", "OOM"]


@pytest.mark.parametrize("args, message", [
    (["--only", "7b-1024x0"], "bad point '7b-1024x0'"),
    (["--only", "tiny-64@a100x8"], "not divisible by gpus (8)"),
])
def test_bad_options_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert main(["reproduce", "turnip-lora", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("offloadlab: error:") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_reproduce_turnip_prefill_writes_a_table_and_a_plot(tmp_path, capsys):
    code = main(["reproduce", "turnip-prefill", "--only", "7b-2048@a100x8", "--out",
                 str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "buildmemgraph" in out and "levelwise" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["turnip-prefill.csv",
                                                          "turnip-prefill.png"]
    table = pd.read_csv(tmp_path / "turnip-prefill.csv")
    assert list(table.columns) == PREFILL.columns and PREFILL.time == "ttft"
    assert list(table["planner"]) == ["buildmemgraph", "levelwise"]
    assert (table["ttft"] > 0).all() and (table["status"] == "ok").all()
    # dynamic dispatch of BuildMemGraph's plan is faster than the bulk-synchronous levels
    assert table["ttft"][0] < table["ttft"][1]
