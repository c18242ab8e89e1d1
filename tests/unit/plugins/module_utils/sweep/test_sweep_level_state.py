"""The sweep's window rule (LevelState), its worker split over processes, and the per-process
client health verdict, on completions fed in order (the real client is exercised against
vLLM in tests/integration/test_sweep_real.py)."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (
    LevelState, Sampler, check_params, SweepError, split_workers)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import Record


def cfg(**kw):
    d = {"warmup": 2, "min_requests": 4, "duration": 5.0, "precision_pct": None,
         "max_duration": None}
    d.update(kw)
    return d


def rec(start, end, tokens=10, ttft=0.1, error=None):
    chunks = [] if error else [start + ttft + (end - start - ttft) * k / 9.0 for k in range(10)]
    return Record(level=1, start=start, end=end, chunk_times=chunks,
                  completion_tokens=None if error else tokens, prompt_tokens=4,
                  expected_tokens=tokens, error=error)


def test_split_workers_spreads_evenly():
    assert split_workers(10, 3) == [4, 3, 3]
    assert split_workers(2, 4) == [1, 1, 0, 0]
    assert split_workers(7, 1) == [7]
    assert sum(split_workers(257, 8)) == 257


def test_window_opens_after_warmup_and_closes_on_duration_and_count():
    st = LevelState(1, cfg(), 0.0)
    t = 0.0
    while not st.stop:
        st.feed(rec(t, t + 1.0))
        t += 1.0
    # w0 = end of the 2nd request (2.0); closes at the first end >= 7.0 with 4 measured
    assert st.w0 == 2.0 and st.w1 == 7.0 and st.stopped_by == "duration"
    assert st.window(0.0) == (2.0, 7.0)
    st2 = LevelState(1, cfg(min_requests=8), 0.0)
    t = 0.0
    while not st2.stop:
        st2.feed(rec(t, t + 1.0))
        t += 1.0
    assert st2.w1 == 10.0  # the count, not the duration, closed it


def test_precision_target_extends_the_window_until_met_or_capped():
    # noisy TTFTs: alternating 50 and 150 ms; the TTFT median interval needs many requests
    def run(target, cap):
        st = LevelState(1, cfg(precision_pct=target, max_duration=cap), 0.0)
        t, i = 0.0, 0
        while not st.stop:
            st.feed(rec(t, t + 0.5, ttft=0.05 if i % 2 else 0.15))
            t += 0.5
            i += 1
        return st
    loose = run(60.0, 100.0)
    assert loose.stopped_by == "precision_pct" and loose.w1 - loose.w0 < 20
    capped = run(0.01, 30.0)
    assert capped.stopped_by == "max_duration_s" and capped.w1 - capped.w0 == pytest.approx(30.0)
    assert capped.last_precision["output_tok_s"]["half_width_pct"] is not None
    default_cap = run(0.01, None)  # 10 x duration
    assert default_cap.w1 - default_cap.w0 == pytest.approx(50.0)


def test_min_lifetimes_keeps_the_window_open_for_that_many_request_lifetimes():
    # requests of 4 s, one ending every 0.5 s (8 in flight): a 5 s window holds about one
    # lifetime; five lifetimes need 20 s
    def run(lives, cap=None):
        st = LevelState(8, cfg(min_requests=1, min_lifetimes=lives, max_duration=cap), 0.0)
        t = 4.0
        while not st.stop:
            st.feed(rec(t - 4.0, t))
            t += 0.5
        return st
    plain = LevelState(8, cfg(min_requests=1), 0.0)
    t = 4.0
    while not plain.stop:
        plain.feed(rec(t - 4.0, t))
        t += 0.5
    assert plain.stopped_by == "duration" and plain.w1 - plain.w0 == pytest.approx(5.0)
    five = run(5)
    assert five.stopped_by == "min_lifetimes" and five.w1 - five.w0 == pytest.approx(20.0)
    one = run(1)  # one lifetime fits the 5 s window: the duration closes it
    assert one.stopped_by == "duration" and one.w1 - one.w0 == pytest.approx(5.0)
    capped = run(5, 12.0)
    assert capped.stopped_by == "max_duration_s" and capped.w1 - capped.w0 == pytest.approx(12.0)


def test_a_level_where_most_requests_fail_is_aborted():
    st = LevelState(2, cfg(), 0.0)
    for i in range(12):
        st.feed(rec(0.1 * i, 0.1 * i + 0.05, error="HTTP 500: boom"))
        if st.stop:
            break
    assert st.aborted == "aborted: 10 of 10 requests failed" and st.stopped_by == "aborted"
    w0, w1 = st.window(0.0)
    # failed requests count for the warm-up too: the window ran from the 2nd end to the abort
    assert w0 == pytest.approx(0.15) and w1 == pytest.approx(0.95)


def test_client_health_per_process():
    calm = Sampler.from_samples([(t * 0.01, 0.0005, t * 0.001) for t in range(1000)])
    h = calm.health(1.0, 9.0, 0, 4)
    assert h["client_limited"] is False and h["cpu_util_window"] == pytest.approx(0.1, abs=0.01)
    busy = Sampler.from_samples([(t * 0.01, 0.02 if t % 10 == 0 else 0.0, t * 0.009)
                                 for t in range(1000)])
    h = busy.health(1.0, 9.0, 3, 4)
    assert h["client_limited"] is True and h["process"] == 3
    assert any("loop lag" in r for r in h["client_limited_reasons"])
    assert any("client CPU 90%" in r for r in h["client_limited_reasons"])


@pytest.mark.parametrize("extra,needle", [
    ({"processes": 0}, "processes"), ({"precision_pct": 0}, "precision_pct"),
    ({"precision_pct": 5, "max_duration_s": 1}, "max_duration_s"),
    ({"min_lifetimes": -1}, "min_lifetimes"),
])
def test_new_parameters_are_checked(extra, needle):
    p = {"levels": [1], "input_len": 8, "output_len": 8, "duration_s": 5,
         "request_timeout_s": 10, "saturation_threshold": 0.1, "endpoint": "completions"}
    p.update(extra)
    with pytest.raises(SweepError) as e:
        check_params(p)
    assert needle in str(e.value)


def test_repeats_add_their_figures_and_intervals_across_runs():
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (
        repeats_summary)
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats.compare import (
        compare_levels)
    runs = [{"output_tok_s": v, "ttft_ms": {"p50": t}, "requests_failed": 0,
             "whole_run": {"output_tok_s": v * 0.9, "ttft_ms": {"median": t}},
             "client": {"client_limited": False}}
            for v, t in ((100.0, 10.0), (102.0, 10.5), (98.0, 9.5))]
    out = repeats_summary(runs)
    assert out["repeats"]["output_tok_s"] == [100.0, 102.0, 98.0]
    iv = out["precision_repeats"]["output_tok_s"]
    assert iv["value"] == 100.0 and iv["n"] == 3 and iv["df"] == 2
    assert iv["ci_low"] < 100.0 < iv["ci_high"]
    assert out["precision_repeats"]["whole_run_output_tok_s"]["value"] == pytest.approx(90.0)
    # a level with repeats is compared by its repeats
    a = dict(runs[0], concurrency=1, **out)
    faster = dict(a, repeats=dict(out["repeats"], output_tok_s=[120.0, 121.0, 119.0]))
    res = compare_levels([faster], [a])
    row = [r for r in res["rows"] if r["metric"] == "output_tok_s"][0]
    assert row["verdict"] == "better" and row["df"] is not None
