"""The autotuner's logic: SLO classes, budget, candidates admitted by the capacity planner with
the refusals and their reasons, the successive-halving search, noise-aware ranking and the
correctness comparison. Measurements here are the sweep's level summaries in their real shape."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import search as t

MIB, GB = 1024 ** 2, 1000 ** 3
RTX_PRO_6000 = 97887 * MIB
MINIMAX_M25 = {
    "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2",
    "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 62,
    "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
    "num_local_experts": 256, "num_experts_per_tok": 8, "max_position_embeddings": 196608,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}


def test_mlperf_classes_by_size_and_custom():
    s = t.resolve_slo("mlperf-interactive", params_b=8)
    assert (s["ttft_ms"], s["tpot_ms"], s["class"]) == (500.0, 30.0, "mlperf-interactive:llama3.1-8b")
    assert t.resolve_slo("mlperf-server", params_b=70)["tpot_ms"] == 200.0
    assert t.resolve_slo("mlperf-server", params_b=229, moe=True)["class"] == "mlperf-server:deepseek-r1"
    assert t.resolve_slo("mlperf-interactive:llama3.1-405b")["ttft_ms"] == 4500.0
    assert t.resolve_slo("mlperf-server", params_b=8, tpot_ms=50)["tpot_ms"] == 50.0
    assert t.resolve_slo(None, ttft_ms=300) == {"class": "custom", "ttft_ms": 300,
                                                "tpot_ms": None, "source": "custom values"}
    assert t.scale_slo(s, 100)["tpot_ms"] == 3000.0


@pytest.mark.parametrize("kw, msg", [
    ({"slo_class": "mlperf-offline"}, "not one of custom"),
    ({"slo_class": "mlperf-server:gpt2"}, "MLPerf model 'gpt2'"),
    ({}, "give slo_class"),
    ({"ttft_ms": -1}, "slo ttft_ms must be a positive"),
])
def test_bad_slo_is_refused_naming_it(kw, msg):
    with pytest.raises(t.TuneError, match=msg):
        t.resolve_slo(**kw)


def test_budget():
    assert t.check_budget(minutes=5) == {"minutes": 5, "candidates": None}
    for kw in ({}, {"minutes": 0}, {"candidates": 0}, {"candidates": 1.5}):
        with pytest.raises(t.TuneError, match="budget"):
            t.check_budget(**kw)


def test_knobs_checked_and_rendered():
    with pytest.raises(t.TuneError, match="knob 'max_num_seqs' is not one of"):
        t.check_knobs({"max_num_seqs": [1]})
    with pytest.raises(t.TuneError, match="value '8' is not int"):
        t.check_knobs({"max-num-seqs": ["8"]})
    assert t.knob_args({"max-num-seqs": 8, "cudagraph-mode": "PIECEWISE", "kv-cache-dtype": None}) == [
        "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}', "--max-num-seqs", "8"]


def test_minimax_on_8_gpus_pure_tp8_refused_with_the_planners_reason():
    lays = t.enumerate_layouts(8, tensor_parallel=[4, 8], has_experts=True,
                               nccl_profiles=["latency", "throughput"])
    admitted, refused = t.admit(lays, MINIMAX_M25, 230 * GB, RTX_PRO_6000, max_model_len=65536)
    ids = {t.layout_id(a) for a in admitted}
    # two TP4 vs one TP8+EP on 8 GPUs, each with both NCCL profiles
    assert {"2xtp4-nccl:latency", "tp8+ep-nccl:throughput", "tp4+ep-nccl:latency"} <= ids
    tp8 = [r for r in refused if r["id"].startswith("tp8-nccl")]
    assert len(tp8) == 2
    assert "1536 / tensor_parallel 8 = 192 is not a multiple of the FP8 weight block 128" in tp8[0]["reasons"][0]
    assert not any(a["tensor_parallel"] * a["instances"] > 8 for a in admitted)


def test_cpu_host_varies_instances_and_is_admitted_unplanned():
    admitted, refused = t.admit(t.enumerate_layouts(0))
    assert [a["instances"] for a in admitted] == [1, 2] and refused == []
    assert "CPU host" in admitted[0]["plan_note"]


def test_candidates_default_first_budget_round_robin_and_pinned():
    admitted, _refused = t.admit(t.enumerate_layouts(0))
    knobs = {"max-num-seqs": [None, 4, 16], "max-num-batched-tokens": [None, 512]}
    kept, dropped = t.build_candidates(admitted, knobs)
    assert len(kept) == 12 and dropped == [] and kept[0]["default"] and kept[0]["id"] == "tp1"
    kept, dropped = t.build_candidates(admitted, knobs, max_candidates=3,
                                       pinned=["tp1 max-num-seqs=16"])
    assert [c["id"] for c in kept] == ["tp1", "tp1 max-num-seqs=16", "2xtp1"]
    assert len(dropped) == 9
    # defaults not among the allowed values: the default candidate is added anyway
    kept, _dropped = t.build_candidates(admitted, {"max-num-seqs": [4]})
    assert kept[0]["id"] == "tp1" and kept[0]["knobs"] == {"max-num-seqs": None}


def test_halving_schedule():
    assert t.halving_rounds(8, 3) == [(8, 3.0), (4, 6.0), (2, 12.0)]
    assert t.halving_rounds(2, 3) == [(2, 3.0)]
    assert t.halving_rounds(5, 2, max_rounds=2) == [(5, 2.0), (3, 4.0)]


def _level(c, good, met=True, ttft=10.0, tpot=5.0):
    return {"concurrency": c, "output_tok_s": good * 1.1, "total_tok_s": good * 2,
            "requests_failed": 0, "requests_in_window": 10,
            "ttft_ms": {"p50": ttft, "p99": ttft}, "tpot_ms": {"p50": tpot, "p99": tpot},
            "goodput": {"output_tok_s": good, "request_s": good / 32.0},
            "slo": {"met": met, "breaks": [] if met else ["tpot_ms p99 9 > SLO 8"]}}


def test_score_uses_only_levels_meeting_the_slo():
    s = t.score([_level(1, 10), _level(2, 18), _level(4, 40, met=False)], gpus=2)
    assert s == {"goodput_tok_s": 18, "goodput_level": 2, "highest_level_meeting_slo": 2,
                 "goodput_tok_s_per_gpu": 9.0}


def test_two_instances_are_combined_level_by_level():
    a = [_level(1, 10), _level(2, 18)]
    b = [_level(1, 9, ttft=30), _level(2, 17, met=False)]
    lv = t.combine_instances([a, b])
    assert [x["concurrency"] for x in lv] == [2, 4]
    assert lv[0]["goodput"]["output_tok_s"] == 19 and lv[0]["ttft_ms"]["p99"] == 30
    assert lv[1]["slo"]["met"] is False


def test_compare_verdicts():
    assert t.compare(130, 100, 0.1)["verdict"] == "better"
    assert t.compare(105, 100, 0.1)["verdict"] == "tie"
    assert t.compare(80, 100, 0.1)["verdict"] == "worse"
    assert t.spread([90, 110]) == pytest.approx(0.2)


def _outs(*seqs):
    return {"outputs": [{"token_ids": list(q), "top1_logprobs": [-0.1] * len(q)} for q in seqs]}


def test_gate_uses_the_shared_correctness_comparison():
    ref = _outs([1, 2, 3, 4], [5, 6])
    same = t.gate(ref, _outs([1, 2, 3, 4], [5, 6]), "tp1")
    assert same["passed"] and same["token_match_rate"] == 1.0 and same["reference"] == "tp1"
    bad = t.gate(ref, _outs([1, 9, 9, 9], [7, 7]), "tp1", {"min_token_match_rate": 0.9})
    assert not bad["passed"] and bad["token_match_rate"] < 0.9
    assert any("token_match_rate" in f for f in bad["failures"])
    assert "per_prompt" not in bad


def test_decide_uses_request_log_intervals():
    a = {"goodput_tok_s": 130.0, "noise": None,
         "_m": {"value": 130.0, "ci_low": 126.0, "ci_high": 134.0, "confidence": 0.95}}
    b = {"goodput_tok_s": 100.0, "noise": None,
         "_m": {"value": 100.0, "ci_low": 97.0, "ci_high": 103.0, "confidence": 0.95}}
    v = t.decide(a, b)
    assert v["verdict"] == "better" and v["method"] == "sweep_compare"
    wide = dict(b, _m={"value": 100.0, "ci_low": 60.0, "ci_high": 140.0, "confidence": 0.95})
    assert t.decide(a, wide)["verdict"] == "tie"
    # a spread over rounds covering the ratio makes it a tie even with tight intervals
    assert t.decide(dict(a, noise=0.4), b)["verdict"] == "tie"


class FakeHost:
    """Goodput per candidate id as a function of the window (a rate: stable), with a per-call
    wobble, and outputs that are wrong for the 'broken' candidate."""

    def __init__(self, rates, broken=(), wobble=0.02):
        self.rates, self.broken, self.wobble, self.calls = rates, set(broken), wobble, []

    def measure(self, cand, window, levels):
        self.calls.append((cand["id"], window, list(levels)))
        r = self.rates[cand["id"]] * (1 + self.wobble * (len(self.calls) % 2))
        lvs = [_level(c * cand["layout"]["instances"], r * min(c, 4) / 4.0, met=c <= 4)
               for c in levels]
        tokens = [9, 9, 9] if cand["id"] in self.broken else [1, 2, 3]
        return {"levels": lvs, "elapsed_s": window * len(levels), "correctness": _outs(tokens)}


def _search(rates, broken=(), **kw):
    admitted, _refused = t.admit(t.enumerate_layouts(0))
    cands, _dropped = t.build_candidates(admitted, {"max-num-seqs": [None, 2, 8]})
    host = FakeHost(rates, broken)
    ref = _outs([1, 2, 3])
    s = t.Search(cands, host.measure, [1, 2, 4, 8, 16], base_window_s=2, budget=kw.get("budget"),
                 clock=kw.get("clock"), gate=lambda c, out: t.gate(ref, out, "tp1"))
    return s, s.run(), host


RATES = {"tp1": 100, "tp1 max-num-seqs=2": 60, "tp1 max-num-seqs=8": 150,
         "2xtp1": 90, "2xtp1 max-num-seqs=2": 50, "2xtp1 max-num-seqs=8": 155}


def test_search_halves_and_measures_leaders_longer_with_fewer_levels():
    s, results, host = _search(RATES)
    windows = [w for _c, w, _l in host.calls]
    # 6 -> 3 leaders -> 2 leaders, and the default (tp1) goes on into every round
    assert windows.count(2.0) == 6 and windows.count(4.0) == 3 and windows.count(8.0) == 3
    assert {c for c, w, _l in host.calls if w == 8.0} == {"tp1 max-num-seqs=8", "2xtp1 max-num-seqs=8", "tp1"}
    # each round starts with the candidate still serving from the round before (no restart)
    ids = [c for c, _w, _l in host.calls]
    assert ids[6] == ids[5] or ids[5] not in ids[6:9]
    assert ids[9] == ids[8] or ids[8] not in ids[9:]
    # early stop: later rounds sweep only up to twice the per-instance level where goodput peaked
    assert all(max(lv) <= 8 for _c, w, lv in host.calls if w > 2)
    table, decision = t.rank(results)
    # the two leaders are 155 and 150 with a 2 % wobble: whichever the last windows favour,
    # a tie goes to the single instance (cheaper)
    assert decision["winner"] in ("tp1 max-num-seqs=8", "2xtp1 max-num-seqs=8")
    if decision["tie"]:
        assert decision["winner"] == "tp1 max-num-seqs=8"
        assert decision["tied_with"] == ["2xtp1 max-num-seqs=8"]
    assert table[0]["rank"] == 1 and table[0]["id"] == decision["winner"]
    vs = t.versus_default(table)
    # the default was measured in the last round too: the ratio is at the same window
    assert vs["verdict"] == "better" and vs["ratio"] == pytest.approx(1.55, rel=0.05)


def test_the_default_dropped_by_halving_is_measured_again_at_the_leaders_window():
    rates = dict(RATES, tp1=20)  # the default would leave after round 1
    _s, _results, host = _search(rates)
    tp1_windows = [w for c, w, _l in host.calls if c == "tp1"]
    assert tp1_windows == [2.0, 4.0, 8.0]
    # the last candidate of a round, when it goes on, is the first of the next: no restart
    ids = [c for c, _w, _l in host.calls]
    r2 = ids[6:10]
    assert len(r2) == 4 and (ids[5] not in r2 or r2[0] == ids[5])


def test_a_fast_candidate_with_wrong_outputs_is_disqualified():
    rates = dict(RATES, **{"2xtp1 max-num-seqs=2": 500})
    s, results, host = _search(rates, broken=["2xtp1 max-num-seqs=2"])
    table, decision = t.rank(results)
    bad = [r for r in table if r["id"] == "2xtp1 max-num-seqs=2"][0]
    assert bad["rank"] is None and bad["disqualified"].startswith("correctness (reference tp1): token_match_rate 0 below")
    assert decision["winner"] != bad["id"]
    assert not [c for c, w, _l in host.calls if c == bad["id"] and w > 2.0]  # never re-measured


def test_clear_winner_and_default_best():
    rates = dict(RATES, **{"tp1 max-num-seqs=8": 300})
    _s, results, _h = _search(rates)
    _table, decision = t.rank(results)
    assert not decision["tie"] and decision["winner"] == "tp1 max-num-seqs=8"
    rates = {k: (100 if k == "tp1" else 50) for k in RATES}
    _s, results, _h = _search(rates)
    table, decision = t.rank(results)
    assert decision["winner"] == "tp1"
    assert t.versus_default(table)["verdict"] == "the default is already best"


def test_minutes_budget_stops_the_search():
    now = [0.0]

    def clock():
        now[0] += 20.0
        return now[0]
    s, results, host = _search(RATES, budget={"minutes": 1}, clock=clock)
    assert len(host.calls) == 2 and "budget of 1 min reached" in s.log[-1]
    # the four never served are listed with the reason, not left out of the report
    served = {c[0] for c in host.calls}
    assert set(results) == served
    unserved = {n["id"]: n["reason"] for n in s.not_measured}
    assert set(unserved) == set(RATES) - served and len(unserved) == 4
    assert set(unserved.values()) == {"not measured (minutes budget of 1 reached)"}


def test_a_budget_that_measured_only_the_default_says_nothing_was_compared():
    """The budget ran out after vLLM's defaults: the default wins by default, and the verdict
    must not claim it beat anything."""
    now = [0.0]

    def clock():
        now[0] += 50.0
        return now[0]
    s, results, host = _search(RATES, budget={"minutes": 1}, clock=clock)
    assert len(host.calls) == 1 and set(results) == {"tp1"}
    table, decision = t.rank(results)
    assert decision["winner"] == "tp1"
    vs = t.versus_default(table)
    assert vs["verdict"].startswith("nothing to compare: no other candidate was measured")
    assert vs["winner"] == vs["default"] == "tp1"


def _grid_on_a_clock(minutes, serve_times):
    """A bracketed grid over the six CPU candidates with a minutes budget, on a clock that each
    measurement moves by its seconds: ``serve_times(k)`` gives the k-th (0-based) measurement's
    (serve_s or None, measure_s). Returns (the candidates served in order, the search)."""
    now = [0.0]

    class Host(FakeHost):
        def measure(self, cand, window, levels):
            serve, measure = serve_times(len(self.calls))
            out = FakeHost.measure(self, cand, window, levels)
            out["elapsed_s"] = (serve or 0.0) + measure
            if serve is not None:
                out.update(serve_s=serve, measure_s=measure)
            now[0] += out["elapsed_s"]
            return out

    admitted, _refused = t.admit(t.enumerate_layouts(0))
    cands, _dropped = t.build_candidates(admitted, {"max-num-seqs": [None, 2, 8]})
    host = Host(RATES, wobble=0.0)
    s = t.Search(cands, host.measure, [1, 2], base_window_s=2, max_rounds=1,
                 budget={"minutes": minutes}, clock=lambda: now[0], bracket=True)
    s.run()
    return [c for c, _w, _l in host.calls], s


def test_a_grid_stopped_by_its_minutes_still_measures_the_default_again():
    """Each serve takes 100 s on the host's clock and the budget is 5 minutes: without the
    default's 100 s kept back, the grid would serve two candidates after the default and
    find no time left for the bracket; with it, it serves one, then the default again."""
    ids, s = _grid_on_a_clock(5, lambda k: (None, 100.0))
    assert ids[0] == "tp1" and ids[-1] == "tp1" and len(ids) == 3, ids
    assert s.drift is not None and s.drift["ratio"] == pytest.approx(1.0)
    assert any("100 s kept for measuring the default again" in line for line in s.log), s.log
    assert len(s.not_measured) == 4


def test_the_bracket_keeps_back_a_restart_not_the_default_s_cold_start():
    """The default's first serve is a cold start (400 s to serve, 30 s to measure); every
    restart after it takes 70 s to serve and 30 s to measure. With 15 minutes, keeping the
    default's whole 430 s back would stop the grid after one other candidate (530 + 430 >= 900);
    once a restart was seen, the reserve is 30 + 70 s and the grid serves four, then the
    default again."""
    ids, s = _grid_on_a_clock(15, lambda k: (400.0 if k == 0 else 70.0, 30.0))
    # 430 (default) + 4 x 100 = 830; a fifth would start at 830 with 100 s kept: 930 >= 900
    assert ids[0] == "tp1" and ids[-1] == "tp1" and len(ids) == 6, ids
    assert any("100 s kept for measuring the default again" in line for line in s.log), s.log
    assert s.drift is not None and len(s.not_measured) == 1
    rounds = s.results["tp1"]["rounds"]
    assert rounds[0]["serve_s"] == 400.0 and rounds[0]["measure_s"] == 30.0


def test_references_between_candidates_see_a_drift_that_goes_up_and_back_down():
    """The host's speed goes up by 40 % in the middle of the run and back: the default measures
    100 first and 100 last, so the bracket alone sees no drift and a candidate at 125 (tight
    interval) would beat the default. Measured again after every 3 candidates, the default
    shows 140 in between; the spread of its measurements is every candidate's least noise,
    and 125 is a tie."""
    admitted, _refused = t.admit(t.enumerate_layouts(0))
    cands, _dropped = t.build_candidates(admitted, {"max-num-seqs": [None, 2, 8]})
    default_rates = [100.0, 140.0, 100.0]
    others = {"2xtp1": 90.0, "tp1 max-num-seqs=2": 60.0, "2xtp1 max-num-seqs=2": 50.0,
              "tp1 max-num-seqs=8": 125.0, "2xtp1 max-num-seqs=8": 80.0}
    calls = []

    def measure(cand, window, levels):
        calls.append(cand["id"])
        rate = default_rates.pop(0) if cand.get("default") else others[cand["id"]]
        lv = dict(_level(1, rate, met=True))
        lv["precision"] = {"output_tok_s": {"value": rate, "ci_low": rate - 1, "ci_high": rate + 1,
                                            "se": 0.5}}
        return {"levels": [lv], "elapsed_s": 10.0}

    def run(every):
        del calls[:]
        default_rates[:] = [100.0, 140.0, 100.0] if every else [100.0, 100.0]
        s = t.Search(cands, measure, [1], base_window_s=2, max_rounds=1, bracket=True,
                     reference_every=every)
        table, decision = t.rank(s.run(), noise_floor=s.drift["spread"])
        return s, calls[:], decision

    s, served, decision = run(0)
    assert served.count("tp1") == 2 and decision["winner"] == "tp1 max-num-seqs=8"
    assert not decision["tie"] and s.drift["references"] == [{"at_s": None, "after": 5,
                                                              "goodput_tok_s": 100.0}]
    s, served, decision = run(3)
    # the default first, again after three of the other five, and last
    assert served[0] == "tp1" and served[-1] == "tp1" and served.count("tp1") == 3, served
    assert served[4] == "tp1"
    assert [r["goodput_tok_s"] for r in s.drift["references"]] == [140.0, 100.0]
    assert s.drift["spread"] == pytest.approx(40 / 113.333, abs=1e-3)
    assert decision["tie"] and decision["winner"] == "tp1"
    assert any("the default again (after 3 candidates)" in line for line in s.log), s.log


def test_a_search_within_its_minutes_lists_nothing_unmeasured():
    s, results, host = _search(RATES, budget={"minutes": 60}, clock=lambda: 0.0)
    assert set(results) == set(RATES) and s.not_measured == []


def test_write_back_document_says_what_the_gate_compares():
    _s, results, _h = _search(RATES)
    table, decision = t.rank(results)
    doc = t.tune_document("h", {"class": "custom"}, {"candidates": 6}, [], [], table, decision,
                          t.versus_default(table), {"runs": "x"}, dummy_weights=True)
    assert doc["winner"]["id"] == decision["winner"] and not doc["applied"]
    assert "compares layouts with each other only" in doc["correctness_note"]


CPU_TINY_ARGS = ["--dtype", "float32", "--kv-cache-memory-bytes", "134217728"]


def test_service_instances_two_cpu_instances_and_profile_flag_replaced():
    prof = {"args": CPU_TINY_ARGS, "gpu": {"required": False}}
    cand = {"layout": {"tensor_parallel": 1, "expert_parallel": False, "data_parallel": 1,
                       "instances": 2, "nccl_profile": None},
            "knobs": {"max-num-seqs": 4, "kv-cache-memory-bytes": 67108864, "max-num-batched-tokens": None}}
    a, b = t.service_instances(cand, prof, 8240, host="127.0.0.1")
    assert (a["name"], a["port"], b["name"], b["port"]) == ("main", 8240, "tune-2", 8241)
    assert a["extra_args"] == ["--max-num-seqs", "4"]
    # the profile sets --kv-cache-memory-bytes: replaced there, not added twice
    assert a["profile_overrides"]["args"] == ["--dtype", "float32", "--kv-cache-memory-bytes", "67108864"]
    assert "cuda_visible_devices" not in a and a["host"] == "127.0.0.1"


def test_service_instances_split_gpus_and_set_parallel():
    prof = {"args": [], "gpu": {"required": True}}
    cand = {"layout": {"tensor_parallel": 4, "expert_parallel": False, "data_parallel": 1,
                       "instances": 2, "nccl_profile": None}, "knobs": {"kv-cache-dtype": "fp8"}}
    a, b = t.service_instances(cand, prof, 8000)
    assert a["cuda_visible_devices"] == "0,1,2,3" and b["cuda_visible_devices"] == "4,5,6,7"
    assert a["profile_overrides"]["parallel"] == {"tensor": 4, "data": 1, "expert_parallel": False}
    assert a["profile_overrides"]["kv_cache_dtype"] == "fp8" and a["extra_args"] == []


def test_grid_minutes():
    assert t.grid_minutes(6, [1, 2, 4, 8], 12, 60) == pytest.approx(6 * (60 + 48) / 60.0)


def test_service_instances_keep_the_hosts_own_overrides_and_extra_args():
    prof = {"args": [], "gpu": {"required": True}}
    cand = {"layout": {"tensor_parallel": 1, "expert_parallel": False, "data_parallel": 1,
                       "instances": 1, "nccl_profile": None}, "knobs": {"max-num-seqs": 64}}
    (a,) = t.service_instances(cand, prof, 8000,
                               base_overrides={"max_model_len": 8192, "parallel": {"pipeline": 1}},
                               base_extra_args=["--load-format", "dummy"])
    assert a["profile_overrides"]["max_model_len"] == 8192
    assert a["profile_overrides"]["parallel"] == {"pipeline": 1, "tensor": 1, "data": 1,
                                                  "expert_parallel": False}
    assert a["extra_args"] == ["--load-format", "dummy", "--max-num-seqs", "64"]


# ---- the screen strategy: one knob changed from the default at a time, then the winners'
# combination, then successive halving among the leaders
KNOBS3 = {"max-num-seqs": [None, 2], "max-num-batched-tokens": [None, 512]}  # x instances 1, 2
MNS, MBT = "tp1 max-num-seqs=2", "tp1 max-num-batched-tokens=512"
COMBO = "2xtp1 max-num-seqs=2"
SCREEN_ORDER = ["tp1", "2xtp1", MBT, MNS]  # default, the layout knob, engine knobs by name


def _cands3(knobs=None, pinned=None):
    admitted, _refused = t.admit(t.enumerate_layouts(0))
    cands, _dropped = t.build_candidates(admitted, knobs or KNOBS3, pinned=pinned)
    return cands


def _rates3(**over):
    rates = dict((c["id"], 100.0) for c in _cands3())
    rates.update(over)
    return rates


def _screen(rates, broken=(), max_rounds=3, **kw):
    cands = _cands3(pinned=kw.get("pinned"))
    host = FakeHost(rates, broken)
    ref = _outs([1, 2, 3])
    s = t.Search(cands, host.measure, [1, 2, 4, 8, 16], base_window_s=2, max_rounds=max_rounds,
                 budget=kw.get("budget"), gate=lambda c, out: t.gate(ref, out, "tp1"),
                 strategy="screen", pinned=kw.get("pinned"))
    return s, s.run(), host


def test_strategy_auto_screens_only_when_it_serves_clearly_fewer():
    cands = _cands3()
    assert len(cands) == 8
    default, singles, count = t.screening_plan(cands)
    assert default["id"] == "tp1" and [c["id"] for c in singles] == SCREEN_ORDER[1:]
    assert count == 5  # 1 + 3 single changes + the combination, against 8
    assert t.choose_strategy("auto", cands)[0] == "screen"
    # 2 binary knobs: 4 screening serves of 4 candidates -- halving
    two = _cands3({"max-num-seqs": [None, 2]})
    assert t.screening_plan(two)[2] == 4 and t.choose_strategy("auto", two)[0] == "halving"
    # a candidate budget of 3 already serves fewer than screening would
    assert t.choose_strategy("auto", cands, budget_candidates=3)[0] == "halving"
    # 4 binary knobs (layout + 3 engine knobs): 6 of 16
    four = _cands3(dict(KNOBS3, **{"kv-cache-memory-bytes": [None, 1 << 28]}))
    assert len(four) == 16 and t.screening_plan(four)[2] == 6
    assert t.choose_strategy("grid", cands) == ("grid", "grid (asked for)")
    with pytest.raises(t.TuneError, match="strategy 'fast' is not one of auto, screen"):
        t.choose_strategy("fast", cands)


def test_screen_nothing_beats_the_default_serves_4_of_8_and_says_why_not_the_rest():
    rates = _rates3(**{MBT: 97.0, MNS: 95.0})  # 2xtp1 as fast as the default
    s, results, host = _screen(rates, max_rounds=2)
    calls = [(c, w) for c, w, _l in host.calls]
    # screening at 2 s; no winner -> no combination; leaders = the default + the best single
    # change, at 4 s, the one still serving first
    assert calls[:4] == [(c, 2.0) for c in SCREEN_ORDER]
    assert sorted(calls[4:]) == [("2xtp1", 4.0), ("tp1", 4.0)] and len(calls) == 6
    assert s.screening["winners"] == {} and s.screening["combination"] is None
    assert s.screening["leaders"] == ["tp1", "2xtp1"]
    assert len(results) == 4
    why = dict((n["id"], n["reason"]) for n in s.not_measured)
    assert why == {
        "2xtp1 max-num-batched-tokens=512": "not measured (screened out: knob layout's value "
                                            "2xtp1 did not beat the default)",
        COMBO: "not measured (screened out: knob layout's value 2xtp1 did not beat the default)",
        "2xtp1 max-num-batched-tokens=512 max-num-seqs=2": ("not measured (screened out: knob "
                                                            "layout's value 2xtp1 did not beat "
                                                            "the default)"),
        "tp1 max-num-batched-tokens=512 max-num-seqs=2": ("not measured (screened out: knob "
                                                          "max-num-batched-tokens's value 512 "
                                                          "did not beat the default)")}
    table, decision = t.rank(results)
    # tp1 and 2xtp1 went on at 4 s; the default is not beaten
    assert decision["winner"] == "tp1"
    assert t.versus_default(table)["verdict"] == "the default is already best"


def test_screen_two_winning_knobs_are_combined_and_the_combination_wins():
    rates = _rates3(**{"2xtp1": 150.0, MNS: 130.0, MBT: 101.0, COMBO: 200.0})
    s, results, host = _screen(rates)
    ids = [c for c, _w, _l in host.calls]
    windows = [w for _c, w, _l in host.calls]
    assert ids[:5] == SCREEN_ORDER + [COMBO] and windows[:5] == [2.0] * 5
    assert s.screening["winners"] == {"layout": "2xtp1", "max-num-seqs": MNS}
    assert s.screening["leaders"] == ["tp1", COMBO, "2xtp1"]
    # halving among the 3 leaders: 3 at 4 s (the combination, still serving, first), then the
    # best 2 and the default at 8 s -- 11 measurements, 5 candidates served of 8
    assert ids[5] == COMBO and sorted(ids[5:8]) == sorted(["tp1", COMBO, "2xtp1"])
    assert windows[5:8] == [4.0] * 3 and windows[8:] == [8.0] * 3 and len(ids) == 11
    assert len(results) == 5 and len(s.not_measured) == 3
    assert all("max-num-batched-tokens's value 512 did not beat" in n["reason"]
               for n in s.not_measured)
    table, decision = t.rank(results)
    assert decision["winner"] == COMBO and not decision["tie"]
    assert t.versus_default(table)["verdict"] == "better"


def test_screen_interacting_knobs_combination_loses_falls_back_to_the_best_single_change():
    # two instances and max-num-seqs=2 each win alone, but together each instance is
    # capped at 2 sequences: the combination is slower than either
    rates = _rates3(**{"2xtp1": 150.0, MNS: 130.0, COMBO: 80.0})
    s, results, host = _screen(rates)
    assert [c for c, _w, _l in host.calls][:5] == SCREEN_ORDER + [COMBO]
    assert s.screening["combination"] == COMBO
    assert s.screening["leaders"] == ["tp1", COMBO, "2xtp1"]
    combo_windows = [w for c, w, _l in host.calls if c == COMBO]
    assert combo_windows == [2.0, 4.0]  # measured in screening and round 2, then cut
    assert [w for c, w, _l in host.calls if c == "2xtp1"] == [2.0, 4.0, 8.0]
    table, decision = t.rank(results)
    assert decision["winner"] == "2xtp1" and not decision["tie"]
    assert [r["id"] for r in table][:2] == ["2xtp1", "tp1"]
    vs = t.versus_default(table)
    assert vs["verdict"] == "better" and vs["ratio"] == pytest.approx(1.5, rel=0.05)


def test_screen_budget_pinned_and_disqualified():
    broken = "tp1 max-num-seqs=2"
    rates = _rates3(**{MNS: 500.0})
    s, results, host = _screen(rates, broken=[broken], pinned=[broken],
                               budget={"candidates": 3})
    # the default, the pinned candidate (a single change here), then the screening order
    assert [c for c, _w, _l in host.calls][:3] == ["tp1", broken, "2xtp1"]
    assert set(results) == {"tp1", broken, "2xtp1"}
    table, decision = t.rank(results)
    assert [r for r in table if r["id"] == broken][0]["disqualified"].startswith("correctness")
    assert decision["winner"] != broken and broken not in s.screening["leaders"]
    why = dict((n["id"], n["reason"]) for n in s.not_measured)
    assert why[MBT] == "not measured (budget: at most 3 candidates)"
    assert "layout's value 2xtp1 did not beat the default" in why[COMBO]
    assert why["tp1 max-num-batched-tokens=512 max-num-seqs=2"] == (
        "not measured (screened out: knob max-num-seqs's value 2 was disqualified on its own: "
        "correctness gate)")


def test_grid_strategy_serves_every_candidate_once_in_order():
    cands = _cands3()
    host = FakeHost(_rates3())
    s = t.Search(cands, host.measure, [1, 2, 4, 8], base_window_s=8, max_rounds=1,
                 strategy="grid")
    s.run()
    assert [c for c, _w, _l in host.calls] == [c["id"] for c in cands]
    assert {w for _c, w, _l in host.calls} == {8.0} and len(host.calls) == 8
    assert all(lv == [1, 2, 4, 8] for _c, _w, lv in host.calls)
