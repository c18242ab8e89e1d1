"""Reports of a tuning run: ranked CSV/JSON, the InferenceX-form Pareto plot, the compare view."""
import csv
import json
import os

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import search as t
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import report as rep


def _lv(c, total, tpot, met):
    return {"concurrency": c, "total_tok_s": total, "tpot_ms": {"p50": tpot},
            "slo": {"met": met}}


def _doc():
    lay = {"tensor_parallel": 1, "expert_parallel": False, "data_parallel": 1, "instances": 1,
           "nccl_profile": None}
    res = {
        "tp1": {"candidate": {"id": "tp1", "layout": lay, "knobs": {"max-num-seqs": None},
                              "default": True},
                "rounds": [{"window_s": 2, "score": {"goodput_tok_s": 100, "goodput_tok_s_per_gpu": 100,
                                                     "goodput_level": 4, "highest_level_meeting_slo": 4}}]},
        "tp1 max-num-seqs=8": {"candidate": {"id": "tp1 max-num-seqs=8", "layout": lay,
                                             "knobs": {"max-num-seqs": 8}},
                               "rounds": [{"window_s": 2, "score": {"goodput_tok_s": 200, "goodput_tok_s_per_gpu": 200,
                                                                    "goodput_level": 8, "highest_level_meeting_slo": 8}}]},
    }
    table, decision = t.rank(res)
    return t.tune_document("h1", {"class": "custom", "tpot_ms": 50}, {"candidates": 2}, [
        {"id": "tp8", "reasons": ["1536 / tensor_parallel 8 = 192"]}], [
        {"id": "2xtp1 max-num-seqs=8", "layout": dict(lay, instances=2),
         "knobs": {"max-num-seqs": 8},
         "reason": "not measured (screened out: knob layout's value 2xtp1 did not beat the "
                   "default)"}], table, decision,
        t.versus_default(table), {})


def test_frontier():
    assert rep.frontier([(1, 10), (2, 8), (3, 9), (4, 1), (0.5, 5)]) == [(1, 10), (3, 9), (4, 1)]


def test_reports_written(tmp_path):
    doc = _doc()
    pts = rep.pareto_points({"tp1": (1, [_lv(1, 50, 20, True), _lv(4, 150, 40, True)]),
                             "tp1 max-num-seqs=8": (1, [_lv(8, 300, 60, False)])})
    assert pts[0] == ("tp1", 1, 50.0, 50.0, True)
    out = rep.write_reports(str(tmp_path), doc, pts)
    rows = list(csv.DictReader(open(out["csv"])))
    assert [r["id"] for r in rows] == ["tp1 max-num-seqs=8", "tp1", "2xtp1 max-num-seqs=8"]
    assert rows[0]["rank"] == "1" and rows[0]["not_measured"] == ""
    # a candidate the search did not serve is a row of the ranked table, with the reason
    assert rows[2]["rank"] == "" and rows[2]["gpus"] == "2" and rows[2]["knobs"] == "max-num-seqs=8"
    assert rows[2]["not_measured"].startswith("not measured (screened out: knob layout's value")
    assert rows[0]["knobs"] == "max-num-seqs=8"
    assert json.load(open(out["json"]))["winner"]["id"] == "tp1 max-num-seqs=8"
    assert os.path.getsize(out["pareto"]) > 10000
    text = open(out["compare"]).read()
    assert "--max-num-seqs 8" in text and "(vLLM defaults)" in text and "ratio tuned/default: 2.0" in text


def test_the_compare_view_has_a_line_per_other_slo():
    doc = _doc()
    doc["other_slos"] = {
        "mlperf-interactive:llama3.1-8b": {
            "ranked": [{"id": "tp1", "rank": 1, "goodput_tok_s": 90.0, "goodput_level": 2},
                       {"id": "tp1 max-num-seqs=8", "rank": 2, "goodput_tok_s": 40.0,
                        "goodput_level": 1}],
            "versus_default": {"ratio": 1.0, "verdict": "the default is already best",
                               "default": "tp1", "winner": "tp1"}},
        "other": {"ranked": [], "versus_default": None}}
    text = rep.compare_view(doc)
    assert ("under mlperf-interactive:llama3.1-8b: default 90.0 tok/s at C=2, winner tp1 90.0 "
            "tok/s at C=2; ratio 1.0, verdict: the default is already best") in text
    assert "under other: no default/winner pair (None)" in text
    assert "ratio tuned/default: 2.0" in text  # the run's own line stays first
