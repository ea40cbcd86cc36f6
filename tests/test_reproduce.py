"""``offloadlab reproduce``: Beaumont et al.'s Table 1 and Figure 4 from our cost model."""

import json

import pandas as pd
import pytest

import offloadlab
from offloadlab.core.machine import machine_from_spec
from offloadlab.core.workloads import build_workload
from offloadlab.lab.cli import main
from offloadlab.lab.reproduce import (
    PAPER_TABLE1,
    TABLE1,
    Setting,
    evaluate,
    parse_setting,
    setting_chain,
    setting_machine,
    shape_checks,
)
from offloadlab.planner.weight_offload import schedule_for

KEYS = ["workload", "machine", "planners", "version", "network", "depth", "batch", "sum_u", "ilp",
        "greedy", "l2l", "greedy_nodiscount"]


def test_table1_has_the_papers_fifteen_settings():
    assert len(TABLE1) == 15 and set(TABLE1) == set(PAPER_TABLE1)


def test_calibration_matches_the_papers_sum_u_per_layer_at_batch_16():
    for network, depth in (("gpt2", 74), ("bert", 144)):
        setting = Setting(network, depth, 16)
        ours = setting_chain(setting).sum_u / depth
        paper = PAPER_TABLE1[setting][0] / 1000 / depth
        assert ours == pytest.approx(paper, rel=0.02)


def _l2l_growth_per_layer(times: dict[int, float]) -> float:
    """Slope of L2L - Σu against depth between the shallowest and deepest setting (s/layer)."""
    lo, hi = min(times), max(times)
    return (times[hi] - times[lo]) / (hi - lo)


@pytest.mark.parametrize("network", ["gpt2", "bert"])
def test_weight_calibration_matches_the_papers_l2l_growth_per_layer(network):
    """The calibrated weights make one transfer take half of what the paper's L2L adds per
    layer (two exposed transfers per layer), and our L2L then grows by as much per layer."""
    rows = {s: v for s, v in PAPER_TABLE1.items() if s.network == network and s.batch == 16}
    paper = _l2l_growth_per_layer({s.depth: (v[3] - v[0]) / 1000 for s, v in rows.items()})
    weight = setting_chain(next(iter(rows))).w[0]
    assert weight / 12e9 == pytest.approx(paper / 2, rel=0.01)
    ours = {}
    for s in rows:
        chain = setting_chain(s)
        ours[s.depth] = schedule_for("l2l", chain, setting_machine(s)).iteration_time - chain.sum_u
    assert _l2l_growth_per_layer(ours) == pytest.approx(paper, rel=0.02)


def test_hyperparameter_weights_are_fp16_hidden_3072():
    chain = setting_chain(Setting("bert", 96, 16), weights="hyperparameters")
    assert chain.w[0] == (12 * 3072**2 + 13 * 3072) * 2


def test_json_rows_and_bound_below_every_strategy(capsys):
    assert main(["reproduce", "beaumont-table1", "--only", "gpt2-38x16,bert-96x32", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["network"], r["depth"], r["batch"]) for r in rows] == [("gpt2", 38, 16),
                                                                      ("bert", 96, 32)]
    for r in rows:
        assert list(r) == KEYS
        assert r["sum_u"] - 1e-9 <= r["ilp"]
        # each row says what it measured: specs that rebuild its problem, its planners
        setting = Setting(r["network"], r["depth"], r["batch"])
        assert machine_from_spec(r["machine"]) == setting_machine(setting)
        assert r["machine"].startswith("v100:gpu_memory=")
        chain = setting_chain(setting)
        graph = build_workload(r["workload"].replace(":", ":iterations=1,", 1))
        assert sum(t.bytes for t in graph if t.kind == "input") >= sum(chain.w)
        assert r["planners"] == "greedy-offload;l2l;greedy-offload-nodiscount"
        assert r["version"] == offloadlab.__version__
        for strategy in ("greedy", "l2l", "greedy_nodiscount"):
            assert r["ilp"] <= r[strategy] + 1e-9


@pytest.mark.slow
def test_writes_csv_and_plot(capsys, tmp_path):
    assert main(["reproduce", "beaumont-bandwidth", "--only", "gpt2-38x16",
                 "--weights", "hyperparameters", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "beaumont-bandwidth.csv")
    assert sorted(table["bandwidth"]) == [0.5e9, 1e9, 2e9, 4e9, 8e9, 12e9]
    assert (table["weights"] == "hyperparameters").all()
    assert (table["weight_bytes"] == (12 * 3072**2 + 13 * 3072) * 2).all()
    assert (table["ilp"] <= table["greedy"] + 1e-9).all()
    # less bandwidth never lowers the bound
    bounds = table.sort_values("bandwidth")["ilp"].tolist()
    assert all(a >= b - 1e-9 for a, b in zip(bounds, bounds[1:]))
    assert (tmp_path / "beaumont-bandwidth.png").stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().out


def test_bad_setting_exits_2(capsys, tmp_path):
    assert main(["reproduce", "beaumont-table1", "--only", "gpt3-12x1",
                 "--out", str(tmp_path)]) == 2
    assert "bad setting 'gpt3-12x1'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_parse_setting():
    assert parse_setting("bert-144x64") == Setting("bert", 144, 64)


def test_shape_checks_name_each_broken_claim():
    row = dict(network="gpt2", depth=38, batch=16, sum_u=10.0, ilp=10.0, greedy=10.2, l2l=13.0,
               greedy_nodiscount=10.3)
    assert shape_checks(pd.DataFrame([row])) == []
    bad = dict(row, ilp=10.5, greedy=11.5, l2l=10.6, greedy_nodiscount=11.0)
    failures = shape_checks(pd.DataFrame([bad]))
    assert len(failures) == 4
    assert any("differs from Σu" in f for f in failures)
    assert any("l2l is 1.0% above" in f for f in failures)
    assert any("greedy* 11.0000 s beats greedy" in f for f in failures)


def test_evaluate_one_setting_directly():
    row = evaluate(Setting("gpt2", 38, 64), time_limit=30)
    assert row["ilp_status"] == "optimal"
    assert row["ilp"] == pytest.approx(row["sum_u"], rel=1e-6)


@pytest.mark.parametrize("setting", TABLE1, ids=str)
def test_table1_shape_with_the_calibrated_weights(setting):
    """Sec. 7.1's claims on the strategies (the MILP aside): Greedy within 5% of Σu, L2L 10-50%
    above it, Greedy* never faster than Greedy."""
    chain, machine = setting_chain(setting), setting_machine(setting)
    greedy, l2l, nodiscount = (schedule_for(p, chain, machine).iteration_time
                               for p in ("greedy-offload", "l2l", "greedy-offload-nodiscount"))
    assert chain.sum_u * (1 - 1e-12) <= greedy <= 1.05 * chain.sum_u
    assert 1.10 * chain.sum_u <= l2l <= 1.50 * chain.sum_u
    assert greedy <= nodiscount * (1 + 1e-12)
