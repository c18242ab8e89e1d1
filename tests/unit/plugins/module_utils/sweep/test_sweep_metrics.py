"""Hand-checked cases for plugins/module_utils/sweep/metrics.py."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (
    Record, describe, format_table, headline, knee, output_length_check, percentile,
    saturation_check, summarize_level)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.prometheus import (
    metric_sum, parse_prometheus, server_counters, server_cross_check)


def rec(start, end, ct=10, pt=5, chunks=None, tokens=None, error=None, expected=10):
    if chunks is None and error is None:
        chunks = [start + (end - start) / 2.0, end]
    return Record(level=1, start=start, end=end, chunk_times=chunks, chunk_tokens=tokens,
                  completion_tokens=None if error else ct, prompt_tokens=None if error else pt,
                  expected_tokens=expected, error=error)


# --- percentiles -----------------------------------------------------------------------------

def test_percentile_linear_interpolation():
    xs = [4, 1, 3, 2]  # sorted: 1 2 3 4
    assert percentile(xs, 50) == pytest.approx(2.5)   # h = 1.5
    assert percentile(xs, 90) == pytest.approx(3.7)   # h = 2.7 -> 3 + 0.7 * 1
    assert percentile(xs, 99) == pytest.approx(3.97)  # h = 2.97
    assert percentile(xs, 0) == 1
    assert percentile(xs, 100) == 4
    assert percentile([15, 20, 35, 40, 50], 40) == pytest.approx(29.0)  # h = 1.6: 20 + .6*15
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1, 2], 101)
    with pytest.raises(ValueError):
        percentile([1, 2], 99.5)


def test_percentiles_are_numpys_linear_method():
    """statistics.quantiles(method='inclusive') is numpy's default: checked against numpy
    (the tools venv has it) on random data."""
    import random

    import numpy
    rng = random.Random(7)
    for n in (2, 3, 10, 101, 1000):
        xs = [rng.expovariate(1.0) for _unused in range(n)]
        for p in (1, 25, 50, 90, 99, 100, 0):
            assert percentile(xs, p) == pytest.approx(float(numpy.percentile(xs, p)), rel=1e-12)
        d = describe(xs, scale=1.0, digits=12)
        assert d["p99"] == pytest.approx(float(numpy.percentile(xs, 99)), rel=1e-9)


def test_describe_scales_to_ms():
    d = describe([0.001, 0.002, 0.003, 0.004])
    assert d == {"count": 4, "mean": 2.5, "p50": 2.5, "p90": 3.7, "p99": 3.97, "max": 4.0}
    assert describe([])["p50"] is None


# --- per-request metrics --------------------------------------------------------------------

def test_ttft_tpot_itl_of_a_known_request():
    r = Record(start=10.0, chunk_times=[10.1, 10.15, 10.25], chunk_tokens=[1, 2, 1], end=10.3,
               completion_tokens=4, prompt_tokens=8)
    assert r.ttft == pytest.approx(0.1)
    assert r.e2e == pytest.approx(0.3)
    assert r.tpot == pytest.approx((0.3 - 0.1) / 3)  # (E2E - TTFT) / (N - 1)
    assert r.itls == pytest.approx([0.05, 0.1])
    d = r.to_dict(t0=10.0)
    assert d["ttft_ms"] == pytest.approx(100.0) and d["tpot_ms"] == pytest.approx(66.667)
    assert d["chunk_times_s"] == pytest.approx([0.1, 0.15, 0.25])


def test_tpot_undefined_for_one_token_or_failure():
    assert Record(start=0, chunk_times=[0.1], end=0.1, completion_tokens=1).tpot is None
    assert Record(start=0, chunk_times=[0.1], end=0.2, completion_tokens=5,
                  error="HTTP 500").tpot is None


# --- window clipping --------------------------------------------------------------------------

def window_records():
    return [
        rec(0.0, 1.0),   # A: warm-up, ends exactly at w0 -> not in the window
        rec(0.5, 1.5),   # B: ends in window, started before -> rates yes, latencies no
        rec(1.0, 2.0),   # C: starts at w0, ends inside -> both
        rec(1.5, 3.0),   # D: ends exactly at w1 -> both
        rec(2.0, 3.5),   # E: drain -> neither
        rec(2.1, 2.2, error="HTTP 500: boom"),  # F: failed inside the window
    ]


def test_window_clipping_rates_and_latencies():
    s = summarize_level(window_records(), concurrency=2, w0=1.0, w1=3.0, expected_tokens=10)
    assert s["window_s"] == 2.0
    assert s["requests_in_window"] == 3            # B, C, D
    assert s["requests_measured"] == 2             # C, D
    assert s["output_tokens_in_window"] == 30
    assert s["output_tok_s"] == 15.0               # 30 tokens / 2 s
    assert s["total_tok_s"] == 22.5                # (30 + 3 * 5) / 2 s
    assert s["request_s"] == 1.5
    # overlaps with [1, 3]: A 0, B .5, C 1, D 1.5, E 1, F .1 -> 4.1 / 2
    assert s["achieved_concurrency"] == pytest.approx(2.05)
    # latencies from C (e2e 1.0, ttft .5) and D (e2e 1.5, ttft .75) only
    assert s["e2e_ms"]["count"] == 2
    assert s["e2e_ms"]["mean"] == pytest.approx(1250.0)
    assert s["ttft_ms"]["max"] == pytest.approx(750.0)
    assert s["requests_failed"] == 1 and s["failed_in_window"] == 1
    assert s["errors"] == {"HTTP 500: boom": 1}
    assert s["goodput"] is None and s["slo"] == {"met": None, "breaks": []}


def test_window_must_have_positive_length():
    with pytest.raises(ValueError):
        summarize_level(window_records(), 2, 3.0, 3.0, 10)


def test_goodput_and_slo_verdict():
    records = [rec(0.0, 1.0, chunks=[0.1, 1.0]),   # ttft 100 ms
               rec(0.0, 1.0, chunks=[0.3, 1.0]),   # ttft 300 ms
               rec(0.0, 1.0, chunks=[0.2, 1.0])]   # ttft 200 ms
    s = summarize_level(records, 3, -0.5, 1.5, 10, slo={"ttft_ms": 250, "tpot_ms": None})
    assert s["goodput"]["request_s"] == 1.0       # 2 of 3 requests meet 250 ms, over 2 s
    assert s["goodput"]["output_tok_s"] == 10.0
    assert s["goodput"]["fraction"] == pytest.approx(0.6667)
    # p99 of (100, 200, 300) = 298 ms > 250 -> broken
    assert s["slo"]["met"] is False
    assert "ttft_ms p99 298.000 > SLO 250.000" in s["slo"]["breaks"][0]
    ok = summarize_level(records, 3, -0.5, 1.5, 10, slo={"ttft_ms": 300})
    assert ok["slo"] == {"met": True, "breaks": []}


# --- exact output length --------------------------------------------------------------------

def test_output_length_check_marks_past_one_percent():
    good = [rec(0, 1, ct=64, expected=64) for _unused in range(99)]
    one_miss = good + [rec(0, 1, ct=63, expected=64)]
    chk = output_length_check(one_miss, 64)
    assert (chk["checked"], chk["mismatched"], chk["fraction"], chk["marked"]) == (
        100, 1, 0.01, False)                       # exactly 1 % is not "more than 1 %"
    two = output_length_check(one_miss + [rec(0, 1, ct=65, expected=64)], 64)
    assert two["mismatched"] == 2 and two["marked"] is True
    # failed requests are counted as failures, not as length misses
    assert output_length_check(good + [rec(0, 1, error="x")], 64)["mismatched"] == 0


# --- saturation and knee ----------------------------------------------------------------------

def lvl(c, tput, ttft_p50, failed=0, slo_met=None):
    return {"concurrency": c, "output_tok_s": tput, "ttft_ms": {"p50": ttft_p50},
            "requests_failed": failed, "slo": {"met": slo_met, "breaks": ["x"]},
            "output_length": {"marked": False}, "client": {"client_limited": False}}


def test_saturation_rule_on_a_doubling():
    prev = lvl(8, 1000.0, 50.0)
    assert "saturated at concurrency 16" in saturation_check(prev, lvl(16, 1050.0, 80.0), 0.1)
    assert saturation_check(prev, lvl(16, 1200.0, 80.0), 0.1) is None   # +20 % > 10 %
    assert saturation_check(prev, lvl(16, 1050.0, 40.0), 0.1) is None   # TTFT did not grow
    assert saturation_check(None, lvl(1, 100.0, 5.0), 0.1) is None


def test_saturation_threshold_scales_with_log2_of_the_step():
    prev = lvl(8, 1000.0, 50.0)
    # 8 -> 32 is two doublings: needs +20 %
    assert saturation_check(prev, lvl(32, 1150.0, 90.0), 0.1) is not None
    assert saturation_check(prev, lvl(32, 1250.0, 90.0), 0.1) is None


def test_saturation_on_errors_and_slo_break():
    prev = lvl(8, 1000.0, 50.0)
    assert saturation_check(prev, lvl(16, 3000.0, 60.0, failed=2), 0.1).startswith(
        "errors at concurrency 16: 2 failed")
    assert saturation_check(prev, lvl(16, 3000.0, 60.0, slo_met=False), 0.1).startswith(
        "SLO broken at concurrency 16")


def test_knee_and_headline():
    levels = [lvl(1, 100.0, 5, slo_met=True), lvl(2, 190.0, 6, slo_met=True),
              lvl(4, 350.0, 9, slo_met=False), lvl(8, 400.0, 20, failed=1, slo_met=False)]
    k = knee(levels)
    assert k == {"max_throughput_level": 4, "max_output_tok_s": 350.0,
                 "highest_level_meeting_slo": 2}
    h = headline(levels)
    assert h["single_stream_tok_s"] == 100.0 and h["peak_level"] == 4
    assert h["levels_with_errors"] == [8]
    assert headline([lvl(2, 190.0, 6)])["single_stream_tok_s"] is None


# --- Prometheus text format and the server cross-check ----------------------------------------

PROM = '''# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 1234.0
vllm:generation_tokens_total{engine="1",model_name="tiny"} 1.5e3
vllm:generation_tokens_created{engine="0",model_name="tiny"} 1.7959762884e+09
vllm:prompt_tokens_total{engine="0",model_name="we\\"ird}, name"} 640
vllm:prompt_tokens_by_source_total{engine="0",source="local_cache_hit"} 999
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0 1700000000000
'''


# Both parsers: prometheus_client's (the vLLM venv's python, and the tools venv, which pins the
# same version) and the fallback a load generator without it uses.
PARSERS = [pytest.param(True, id="prometheus_client"), pytest.param(False, id="builtin")]


def test_the_library_parser_is_the_default_where_installed():
    import prometheus_client.parser  # noqa: F401  (requirements/tools.txt pins it)
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep import prometheus
    assert prometheus.PROMETHEUS_PARSER == "prometheus_client"
    assert parse_prometheus(PROM) == parse_prometheus(PROM, library=True)


def test_the_fallback_is_taken_without_the_library(monkeypatch):
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep import prometheus
    monkeypatch.setattr(prometheus, "text_string_to_metric_families", None)
    assert server_counters(PROM) == {"output_tokens": 2734.0, "prompt_tokens": 640.0}
    with pytest.raises(ValueError, match="not importable"):
        parse_prometheus(PROM, library=True)


@pytest.mark.parametrize("library", PARSERS)
def test_parse_prometheus_with_labels(library):
    samples = parse_prometheus(PROM, library=library)
    assert len(samples) == 6
    name, labels, value = samples[3]
    assert name == "vllm:prompt_tokens_total"
    assert labels == {"engine": "0", "model_name": 'we"ird}, name'}
    assert value == 640.0
    assert samples[5] == ("vllm:num_requests_running", {"engine": "0", "model_name": "tiny"}, 3.0)


@pytest.mark.parametrize("library", PARSERS)
def test_metric_sum_across_label_sets(library):
    samples = parse_prometheus(PROM, library=library)
    assert metric_sum(samples, "vllm:generation_tokens_total") == 2734.0
    assert metric_sum(samples, "vllm:prompt_tokens_total") == 640.0
    assert metric_sum(PROM, "vllm:generation_tokens_total") == 2734.0
    assert metric_sum(PROM, "vllm:generation_tokens_total", {"engine": "1"}) == 1500.0
    assert metric_sum(PROM, "vllm:no_such_metric") is None
    assert server_counters(PROM) == {"output_tokens": 2734.0, "prompt_tokens": 640.0}


@pytest.mark.parametrize("library", PARSERS)
def test_parse_prometheus_rejects_garbage(library):
    with pytest.raises(ValueError):
        parse_prometheus('vllm:x{engine="0" 1', library=library)
    with pytest.raises(ValueError):
        parse_prometheus("vllm:x{engine=\"0\"}", library=library)


def test_server_cross_check_deltas():
    records = [rec(0, 1, ct=64, pt=32), rec(0, 1, ct=64, pt=32), rec(0, 1, error="x")]
    before = {"output_tokens": 1000.0, "prompt_tokens": 500.0}
    same = server_cross_check(before, {"output_tokens": 1128.0, "prompt_tokens": 564.0},
                              records)
    assert same["match"] is True and same["output_diff"] == 0
    off = server_cross_check(before, {"output_tokens": 1130.0, "prompt_tokens": 564.0},
                             records)
    assert off["match"] is False
    assert (off["client_output_tokens"], off["server_output_tokens"], off["output_diff"]) == (
        128, 130, -2)
    assert server_cross_check(None, None, records)["match"] is None


def test_format_table_flags_levels():
    s = summarize_level(window_records(), 2, 1.0, 3.0, 10)
    lines = format_table([s])
    assert lines[1].split()[:3] == ["2", "5", "1"]
    assert lines[1].rstrip().endswith("errors")


# --- parameter checks (sweep_client.check_params is pure; aiohttp not needed) -----------------

def good_params(**kw):
    p = dict(base_url="http://x", model="m", levels=[1, 2, 4], input_len=128, output_len=128,
             duration_s=20.0, min_requests=None, warmup_requests=None, endpoint="completions",
             request_timeout_s=600.0, slo_ttft_ms=None, slo_tpot_ms=None, slo_e2e_ms=None,
             saturation_threshold=0.1, stop_on_saturation=True, vocab_size=None)
    p.update(kw)
    return p


@pytest.mark.parametrize("kw, message", [
    (dict(levels=[1, 0, -4]), "levels must be positive integers, got [0, -4]"),
    (dict(levels=[]), "levels must list at least one concurrency"),
    (dict(levels=[2, 2]), "levels must not repeat a concurrency: [2, 2]"),
    (dict(input_len=0), "input_len must be a positive integer, got 0"),
    (dict(output_len=-5), "output_len must be a positive integer, got -5"),
    (dict(duration_s=0), "duration_s must be > 0, got 0"),
    (dict(min_requests=0), "min_requests must be >= 1, got 0"),
    (dict(slo_ttft_ms=-1.0), "slo_ttft_ms must be > 0 when given, got -1.0"),
    (dict(saturation_threshold=-0.1), "saturation_threshold must be >= 0, got -0.1"),
    (dict(min_lifetimes=0), "min_lifetimes must be > 0 when given, got 0"),
])
def test_check_params_names_the_variable(kw, message):
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (
        SweepError, check_params)
    with pytest.raises(SweepError) as e:
        check_params(good_params(**kw))
    assert message in str(e.value)


def test_check_params_accepts_defaults():
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (
        check_params, default_min_requests)
    check_params(good_params())
    assert default_min_requests(1) == 8 and default_min_requests(16) == 32


# --- both definitions: the window and the whole run as vllm bench serve computes it ----------

def test_whole_run_is_vllm_bench_serves_definition():
    """All requests, duration from the first send to the last completion (a failed request's
    end included), latency to the last token chunk, TPOT over it, numpy's statistics."""
    import numpy as np
    records = [
        rec(0.0, 1.05, ct=10, pt=5, chunks=[0.1 * i for i in range(1, 11)]),   # warm-up
        rec(0.5, 2.0, ct=10, pt=5, chunks=[0.6 + 0.1 * i for i in range(10)]),
        rec(1.0, 3.5, ct=10, pt=5, chunks=[1.5 + 0.2 * i for i in range(10)]),  # drain
        rec(1.2, 4.0, error="HTTP 500: boom"),
    ]
    w = summarize_level(records, 2, 1.05, 2.0, 10)
    assert w["definition"] == "steady_state"
    run = w["whole_run"]
    assert run["definition"].startswith("whole_run")
    assert run["duration_s"] == pytest.approx(4.0)
    assert run["completed"] == 3 and run["failed"] == 1 and run["total_output_tokens"] == 30
    assert run["output_tok_s"] == pytest.approx(30 / 4.0)
    assert run["total_tok_s"] == pytest.approx(45 / 4.0)
    assert run["request_s"] == pytest.approx(3 / 4.0, abs=1e-4)
    ttfts = [0.1, 0.1, 0.5]
    lat = [r.chunk_times[-1] - r.start for r in records[:3]]
    tpots = [(a - b) / 9 for a, b in zip(lat, ttfts)]
    itls = [g for r in records[:3] for g in r.itls]
    for key, xs in (("ttft_ms", ttfts), ("e2el_ms", lat), ("tpot_ms", tpots), ("itl_ms", itls)):
        got = run[key]
        arr = np.array(xs) * 1000
        assert got["count"] == len(xs)
        assert got["mean"] == pytest.approx(np.mean(arr), abs=1e-3), key
        assert got["median"] == pytest.approx(np.median(arr), abs=1e-3), key
        assert got["std"] == pytest.approx(np.std(arr), abs=1e-3), key
        for p in (50, 90, 99):
            assert got["p%d" % p] == pytest.approx(np.percentile(arr, p), abs=1e-3), key
    # the window figure differs: only the request that completed inside (1.05, 2.0]
    assert w["output_tok_s"] == pytest.approx(10 / 0.95, abs=1e-3)


def test_whole_run_of_nothing_is_empty_not_an_error():
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import whole_run
    run = whole_run([])
    assert run["completed"] == 0 and run["output_tok_s"] is None
    assert run["ttft_ms"]["mean"] == 0.0  # numpy's np.mean(ttfts or 0), as vllm bench prints


def test_precision_intervals_bracket_the_window_figures():
    # a steady closed loop: one request of 10 tokens every 0.1 s, chunks evenly spread
    records = []
    for i in range(200):
        s = 0.1 * i
        records.append(rec(s, s + 1.0, ct=10, chunks=[s + 0.05 + 0.1 * k for k in range(10)]))
    w = summarize_level(records, 10, 2.0, 18.0, 10)
    tok = w["precision"]["output_tok_s"]
    assert tok["value"] == w["output_tok_s"]
    assert tok["ci_low"] <= w["output_tok_s"] <= tok["ci_high"]
    assert tok["half_width_pct"] < 1.0 and tok["n"] == 10 and "batch means" in tok["method"]
    ttft = w["precision"]["ttft_ms_p50"]
    assert ttft["value"] == w["ttft_ms"]["p50"] == pytest.approx(50.0)
    assert ttft["ci_low"] <= ttft["value"] <= ttft["ci_high"]


def test_precision_grows_with_bursty_output():
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import precision
    steady = [rec(0.1 * i, 0.1 * i + 1, ct=10, chunks=[0.1 * i + 0.05 + 0.1 * k for k in range(10)])
              for i in range(200)]
    bursty = [rec(t, t + 0.5, ct=10, chunks=[t + 0.05 * (k + 1) for k in range(10)])
              for t in [2.0 * (i // 20) + 0.001 * i for i in range(200)]]
    a = precision(steady, 2.0, 18.0, steady, 100.0)["output_tok_s"]
    b = precision(bursty, 2.0, 18.0, bursty, 100.0)["output_tok_s"]
    assert b["half_width_pct"] > 5 * a["half_width_pct"]

# --- SLO boundaries: a latency equal to its SLO meets it; above it does not ---------------------
# Exact binary fractions, so the boundary is exact: ttft 250 ms, e2e 1250 ms, 5 tokens ->
# tpot (1250 - 250) / 4 = 250 ms.


def exact_rec():
    return rec(0.0, 1.25, ct=5, chunks=[0.25, 1.25], expected=5)


@pytest.mark.parametrize("key,value", [("ttft_ms", 250.0), ("tpot_ms", 250.0), ("e2e_ms", 1250.0)])
def test_slo_boundary_each_latency(key, value):
    def level(slo):
        return summarize_level([exact_rec()], 1, 0.0, 2.0, 5, slo={key: slo})
    assert level(value)[key]["p99"] == value  # one request: p99 is its latency
    at = level(value)          # equal: met (p99 > slo, not >=) and a good request
    assert at["slo"] == {"met": True, "breaks": []}
    assert at["goodput"] == {"request_s": 0.5, "output_tok_s": 2.5, "fraction": 1.0}
    loose = level(value * 2)   # well within: met (a flipped comparison breaks it)
    assert loose["slo"]["met"] is True and loose["goodput"]["fraction"] == 1.0
    above = level(value - 0.5)  # just above the SLO: broken, and not good
    assert above["slo"]["met"] is False
    assert above["slo"]["breaks"] == ["%s p99 %.3f > SLO %.3f" % (key, value, value - 0.5)]
    assert above["goodput"] == {"request_s": 0.0, "output_tok_s": 0.0, "fraction": 0.0}
    tight = level(value / 2)   # far above: broken (a flipped comparison meets it)
    assert tight["slo"]["met"] is False and tight["goodput"]["fraction"] == 0.0


def test_goodput_needs_every_slo_and_counts_the_good_ones():
    fast = rec(0.0, 1.25, ct=5, chunks=[0.25, 1.25], expected=5)     # tpot 250, e2e 1250
    slow = rec(0.0, 1.75, ct=5, chunks=[0.25, 1.75], expected=5)     # tpot 375, e2e 1750
    both = [fast, slow]
    by_tpot = summarize_level(both, 2, 0.0, 2.0, 5, slo={"tpot_ms": 300})
    assert by_tpot["goodput"]["fraction"] == 0.5 and by_tpot["goodput"]["request_s"] == 0.5
    by_e2e = summarize_level(both, 2, 0.0, 2.0, 5, slo={"e2e_ms": 1500})
    assert by_e2e["goodput"]["fraction"] == 0.5
    # ttft of both meets, e2e of the slow one does not: it is not good
    mixed = summarize_level(both, 2, 0.0, 2.0, 5, slo={"ttft_ms": 250, "e2e_ms": 1500})
    assert mixed["goodput"]["fraction"] == 0.5 and mixed["goodput"]["output_tok_s"] == 2.5
    assert summarize_level(both, 2, 0.0, 2.0, 5, slo={"tpot_ms": 375})["goodput"]["fraction"] == 1.0
    # a request with one token has no TPOT: it cannot meet a TPOT SLO
    one = rec(0.0, 0.5, ct=1, chunks=[0.5], expected=1)
    s = summarize_level([one], 1, 0.0, 2.0, 1, slo={"tpot_ms": 1e9})
    assert s["goodput"]["fraction"] == 0.0
    assert s["slo"]["breaks"] == ["tpot_ms: no measured requests"]


def test_other_slos_judge_the_same_requests_as_the_runs_own_would():
    fast = rec(0.0, 1.25, ct=5, chunks=[0.25, 1.25], expected=5)     # tpot 250, e2e 1250
    slow = rec(0.0, 1.75, ct=5, chunks=[0.25, 1.75], expected=5)     # tpot 375, e2e 1750
    both = [fast, slow]
    others = {"tight": {"tpot_ms": 300}, "loose": {"tpot_ms": 400, "ttft_ms": 250}}
    s = summarize_level(both, 2, 0.0, 2.0, 5, slo={"e2e_ms": 1000}, also_slos=others)
    # the run's own SLO: neither request meets 1000 ms end to end
    assert s["goodput"]["fraction"] == 0.0 and s["slo"]["met"] is False
    assert sorted(s["by_slo"]) == ["loose", "tight"]
    # each other SLO is what the run's own would be if it were that SLO
    for name, other in others.items():
        alone = summarize_level(both, 2, 0.0, 2.0, 5, slo=other)
        assert s["by_slo"][name] == {"goodput": alone["goodput"], "slo": alone["slo"]}
    assert s["by_slo"]["tight"]["goodput"]["fraction"] == 0.5
    assert s["by_slo"]["tight"]["slo"]["met"] is False
    assert s["by_slo"]["loose"]["goodput"] == {"request_s": 1.0, "output_tok_s": 5.0,
                                               "fraction": 1.0}
    assert s["by_slo"]["loose"]["slo"] == {"met": True, "breaks": []}
    # without other SLOs the level has no by_slo at all
    assert "by_slo" not in summarize_level(both, 2, 0.0, 2.0, 5, slo={"e2e_ms": 1000})


@pytest.mark.parametrize("also, message", [
    ("mlperf-server", "also_slos must be a mapping of a name to its SLO"),
    ({"bad name": {"tpot_ms": 1}}, "also_slos: 'bad name' is not a name"),
    ({"s": {}}, "also_slos.s must map some of ttft_ms, tpot_ms, e2e_ms to milliseconds"),
    ({"s": {"itl_ms": 5}}, "also_slos.s must map some of ttft_ms, tpot_ms, e2e_ms"),
    ({"s": {"tpot_ms": 0}}, "also_slos.s.tpot_ms must be a number > 0, got 0"),
    ({"s": {"ttft_ms": True}}, "also_slos.s.ttft_ms must be a number > 0, got True"),
])
def test_other_slos_are_checked_naming_the_slo(also, message):
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (
        SweepError, check_params)
    with pytest.raises(SweepError) as e:
        check_params(good_params(also_slos=also))
    assert message in str(e.value)
    check_params(good_params(also_slos={"mlperf-server:llama2-70b": {"ttft_ms": 2000.0,
                                                                     "tpot_ms": 200}}))


def in_phase_loop(conc=256, cycles=10, prefill=0.6, itl=0.0225, tokens=128):
    """A closed loop whose requests all have one length: they start together, prefill together
    (no token for ``prefill`` s), decode together and end together, cycle after cycle."""
    import random
    rnd, out, t = random.Random(1), [], 0.0
    for _ in range(cycles):
        for _ in range(conc):
            first = t + prefill + rnd.uniform(0, 0.02)
            chunks = [first + itl * k for k in range(tokens)]
            out.append(Record(level=conc, start=t, end=chunks[-1], chunk_times=chunks,
                              completion_tokens=tokens, prompt_tokens=256,
                              expected_tokens=tokens))
        t = max(r.end for r in out)
    return out


def test_precision_batches_span_a_request_lifetime_when_requests_run_in_phase():
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (
        lifetime, lifetime_batches, precision, window_batches)
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats.compare import (
        batch_means_interval)
    recs = in_phase_loop()
    life = recs[0].end - recs[0].start
    w0 = life + 0.3
    w1 = w0 + 14.2  # four lifetimes and a bit
    assert lifetime(recs, w0, w1) == pytest.approx(life, rel=0.01)
    assert lifetime_batches(recs, w0, w1) == 4
    tok = precision(recs, w0, w1, recs, 9000.0)["output_tok_s"]
    assert tok["n"] == 4 and tok["half_width_pct"] < 3.0
    # ten sub-windows of 1.4 s each see a part of the cycle: their interval measures the phase
    ten = batch_means_interval(window_batches(recs, w0, w1, 10), 10)
    assert ten["half_width_pct"] > 10.0
    # the count is the window's length in lifetimes, rounded; under 1.5 there is no interval
    assert lifetime_batches(recs, w0, w0 + 6.0) == 2
    assert lifetime_batches(recs, w0, w0 + 4.5) == 1
    assert precision(recs, w0, w0 + 4.5, recs, 9000.0)["output_tok_s"] is None
