"""plugins/filter/sweep.py: the compact per-level view kept in host_vars."""
from ansible_collections.vllm_ops.deploy.plugins.filter import sweep as flt
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (
    Record, summarize_level)


def level(fail=False, short=False, slo=None):
    recs = []
    for i in range(4):
        n = 7 if (short and i == 2) else 8
        recs.append(Record(level=2, start=float(i), end=i + 1.0, chunk_times=[i + 0.2, i + 1.0],
                           completion_tokens=n, prompt_tokens=4, expected_tokens=8))
    if fail:
        recs[-1].error = "timeout"
    return summarize_level(recs, 2, 0.5, 4.0, 8, slo=slo)


def test_compact_keeps_figures_and_drops_bulk():
    out = flt.vllm_sweep_compact(dict(level(), saturation_signal=None))
    assert out["concurrency"] == 2 and out["requests_ok"] == 4
    assert out["ttft_ms"] == {"mean": 200.0, "p50": 200.0, "p90": 200.0, "p99": 200.0}
    assert out["flags"] == []
    assert "errors" not in out and "output_length" not in out and "goodput" not in out
    assert "saturation_signal" not in out


def test_compact_flags_and_saturation_signal():
    s = level(fail=True, short=True, slo={"ttft_ms": 100})
    s["client"] = {"client_limited": True}
    s["server_check"] = {"match": False}
    s["saturation_signal"] = "errors at concurrency 2: 1 failed requests"
    out = flt.vllm_sweep_compact(s)
    assert out["flags"] == ["errors", "length-miss", "client-limited", "slo-broken",
                            "server-count-diff"]
    assert out["saturation_signal"].startswith("errors at concurrency 2")
    assert out["goodput"]["request_s"] == 0.0  # TTFT 200 ms > SLO 100 ms
    assert flt.FilterModule().filters()["vllm_sweep_compact"] is flt.vllm_sweep_compact


def test_slos_problem_names_the_variable_and_passes_good_slos():
    problem = flt.FilterModule().filters()["slos_problem"]
    assert problem({}, "vllm_tune_also_slos") == ""
    assert problem({"mlperf-server:llama2-70b": {"ttft_ms": 2000, "tpot_ms": 200}},
                   "vllm_tune_also_slos") == ""
    assert problem({"s": {"tpot_ms": -1}}, "vllm_tune_also_slos") == \
        "vllm_tune_also_slos.s.tpot_ms must be a number > 0, got -1"
    assert problem(["s"], "vllm_tune_also_slos").startswith(
        "vllm_tune_also_slos must be a mapping of a name to its SLO")
