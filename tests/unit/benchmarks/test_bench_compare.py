"""tests/benchmarks/bench_sweep_vs_vllm.py: the comparison's pure logic and its worker protocol.

Expected numbers are worked out by hand in the comments. The worker tests start real
processes (this interpreter running the script as a worker) but no vLLM server.
"""
import importlib.util
import io
import json
import os
import sys
import time

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (
    Record, summarize_level)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "tests", "benchmarks", "bench_sweep_vs_vllm.py")
_spec = importlib.util.spec_from_file_location("bench_sweep_vs_vllm", SCRIPT)
bc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bc)

_spec2 = importlib.util.spec_from_file_location(
    "bench_vocab", os.path.join(ROOT, "tests", "gpu", "bench_vocab.py"))
bv = importlib.util.module_from_spec(_spec2)
_spec2.loader.exec_module(bv)


# --- job ordering and vllm bench's prompt count -------------------------------------------
def test_job_order_alternates_which_tool_goes_first():
    assert bc.job_order(1) == [("ours", "vllm")]
    assert bc.job_order(4) == [("ours", "vllm"), ("vllm", "ours"),
                               ("ours", "vllm"), ("vllm", "ours")]
    assert bc.job_order(0) == []


def test_num_prompts_follows_our_window_rounded_up_to_whole_waves():
    # our window completed 37 requests at C=4: max(32, 37) = 37 -> 40 (10 waves of 4)
    assert bc.choose_num_prompts(4, {"requests_in_window": 37}) == 40
    # C=3, 100 requests: 102 = 34 waves of 3
    assert bc.choose_num_prompts(3, {"requests_in_window": 100}) == 102
    # fewer than 8 C: 8 C
    assert bc.choose_num_prompts(16, {"requests_in_window": 50}) == 128
    # no previous run: 8 C
    assert bc.choose_num_prompts(4, None) == 32
    # no window count: estimate from the request rate, 12.4 req/s * 8 s = 99.2 -> 99 -> 100
    assert bc.choose_num_prompts(4, {"requests_in_window": 0, "request_s": 12.4},
                                 duration_s=8) == 100
    # already a multiple of C
    assert bc.choose_num_prompts(1, {"requests_in_window": 57}) == 57


# --- statistics ---------------------------------------------------------------------------
def test_median_spread_ratio():
    assert bc.median([3.0, 1.0, 2.0]) == 2.0
    assert bc.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert bc.median([None, 5.0]) == 5.0
    assert bc.median([]) is None
    assert bc.spread([100.0, 125.0, 110.0]) == pytest.approx(1.25)
    assert bc.spread([7.0]) == 1.0
    assert bc.spread([0.0, 3.0]) is None
    assert bc.spread([]) is None
    assert bc.ratio(3.0, 4.0) == 0.75
    assert bc.ratio(3.0, 0) is None
    assert bc.ratio(None, 4.0) is None


def test_cpu_per_1k_tokens_and_server_delta():
    assert bc.cpu_ms_per_1k(0.5, 4000) == pytest.approx(125.0)  # 500 ms / 4
    assert bc.cpu_ms_per_1k(0.5, 0) is None
    assert bc.server_delta({"output_tokens": 1000.0}, {"output_tokens": 5096.0}) == 4096
    assert bc.server_delta(None, {"output_tokens": 5096.0}) is None
    assert bc.server_delta({"output_tokens": None}, {"output_tokens": 1.0}) is None


# --- per-run records ----------------------------------------------------------------------
def _sweep_result(conc=2, n=5, dur=1.0, ttft=0.1, tokens=11):
    """run_sweep's shape for one level: C workers, n requests each of ``dur`` s."""
    recs = []
    for w in range(conc):
        for i in range(n):
            s = i * dur
            recs.append(Record(level=conc, worker=w, start=s, end=s + dur,
                               chunk_times=[s + ttft, s + dur], chunk_tokens=[1, tokens - 1],
                               completion_tokens=tokens, prompt_tokens=5,
                               expected_tokens=tokens))
    lv = summarize_level(recs, conc, 1.0, 4.0, tokens)
    lv["client"] = {"client_limited": True, "cpu_s_level": 0.2,
                    "client_limited_reasons": ["event-loop lag p99 12.0 ms > 10.0 ms"]}
    lv["server_check"] = {"client_output_tokens": conc * n * tokens}
    lv["aborted"] = None
    return {"levels": [lv], "parameters": {"seed": 42}}


def test_ours_record_from_a_level_summary():
    # window (1, 4]: requests ending at 2, 3, 4 for each of 2 workers = 6 requests, 66 tokens
    # over 3 s = 22 tok/s; TTFT 100 ms; TPOT (1.0 - 0.1) / 10 = 90 ms; 110 tokens in all
    rec = bc.ours_record(_sweep_result(), 0.55, 6.0, {"output_tokens": 10.0},
                         {"output_tokens": 120.0}, "steady_state")
    assert rec["ok"] is True and rec["definition"] == "steady_state"
    assert rec["output_tok_s"] == pytest.approx(22.0)
    assert rec["ttft_p50_ms"] == pytest.approx(100.0)
    assert rec["tpot_p50_ms"] == pytest.approx(90.0)
    assert rec["client_tokens"] == 110 and rec["server_tokens"] == 110
    assert rec["requests_in_window"] == 6
    assert rec["cpu_ms_per_1k"] == pytest.approx(5000.0)  # 550 ms / 0.11
    assert rec["client_limited"] is True
    assert rec["client_limited_reasons"] == ["event-loop lag p99 12.0 ms > 10.0 ms"]
    assert rec["seed"] == 42


def test_ours_record_whole_run_uses_vllm_bench_serves_definition():
    # all 10 requests of 2 workers: 0..5 s, 110 tokens / 5 s = 22 tok/s as well here, but the
    # figures come from the whole_run block; TTFT median 100 ms; latency to the last chunk
    res = _sweep_result()
    run = res["levels"][0]["whole_run"]
    rec = bc.ours_record(res, 0.55, 6.0, definition="whole_run")
    assert rec["definition"] == "whole_run"
    assert rec["output_tok_s"] == run["output_tok_s"] == rec["whole_run_output_tok_s"]
    assert rec["ttft_p50_ms"] == run["ttft_ms"]["median"] == pytest.approx(100.0)
    assert rec["tpot_p50_ms"] == run["tpot_ms"]["median"]
    assert rec["window_output_tok_s"] == pytest.approx(22.0)
    assert rec["requests_total"] == res["levels"][0]["requests_total"]
    # vllm bench then gets as many prompts as we sent in all
    assert bc.choose_num_prompts(2, {"requests_total": 11, "requests_in_window": 6},
                                 definition="whole_run") == 16
    assert bc.choose_num_prompts(2, {"requests_total": 21, "requests_in_window": 6},
                                 definition="whole_run") == 22
    assert bc.choose_num_prompts(2, {"requests_total": 21, "requests_in_window": 17}) == 18


def test_ours_record_without_metrics_uses_client_tokens_and_flags_an_abort():
    res = _sweep_result()
    res["levels"][0]["aborted"] = "aborted: 10 of 12 requests failed"
    rec = bc.ours_record(res, 0.11, 1.0)
    assert rec["server_tokens"] is None
    assert rec["cpu_ms_per_1k"] == pytest.approx(1000.0)  # 110 ms / 0.110
    assert rec["ok"] is False and rec["error"].startswith("aborted")


def test_vllm_record_from_its_saved_result():
    res = {"completed": 40, "failed": 0, "total_output_tokens": 5120,
           "output_throughput": 1024.0, "median_ttft_ms": 12.5, "median_tpot_ms": 2.0,
           "duration": 5.0}
    rec = bc.vllm_record(res, 2.56, 7.0, {"output_tokens": 0.0}, {"output_tokens": 5120.0}, 40)
    assert rec["ok"] is True and rec["error"] is None
    assert (rec["output_tok_s"], rec["ttft_p50_ms"], rec["tpot_p50_ms"]) == (1024.0, 12.5, 2.0)
    assert rec["cpu_ms_per_1k"] == pytest.approx(500.0)  # 2560 ms / 5.12
    assert rec["num_prompts"] == 40
    bad = bc.vllm_record(dict(res, failed=3), 1.0, 1.0)
    assert bad["ok"] is False and bad["error"] == "3 requests failed"


# --- aggregation over reps ----------------------------------------------------------------
def _run(tool, rep, tok_s, ttft, tpot, cpu, tokens=1000, server=1000, limited=False,
         ok=True):
    return {"tool": tool, "rep": rep, "ok": ok, "output_tok_s": tok_s, "ttft_p50_ms": ttft,
            "tpot_p50_ms": tpot, "cpu_ms_per_1k": cpu, "cpu_ms_per_1k_net": cpu / 2.0,
            "client_tokens": tokens, "server_tokens": server, "client_limited": limited,
            "client_limited_reasons": ["event-loop lag"] if limited else []}


def _three_reps():
    return [
        _run("ours", 1, 100.0, 10.0, 2.0, 40.0), _run("vllm", 1, 105.0, 11.0, 2.0, 200.0),
        _run("vllm", 2, 118.0, 10.0, 2.0, 180.0), _run("ours", 2, 120.0, 9.5, 2.0, 50.0,
                                                       limited=True),
        _run("ours", 3, 110.0, 10.5, 2.0, 45.0), _run("vllm", 3, 100.0, 10.5, 2.0, 220.0),
    ]


def test_aggregate_level_medians_ratios_spreads_and_paired():
    a = bc.aggregate_level(_three_reps())
    assert a["pairs"] == 3 and a["runs"] == {"ours": 3, "vllm": 3}
    tok = "output_tok_s"
    assert a["ours"][tok]["median"] == 110.0 and a["vllm"][tok]["median"] == 105.0
    assert a["ratio"][tok] == pytest.approx(110.0 / 105.0)            # 1.0476
    assert a["ours"][tok]["spread"] == pytest.approx(1.2)             # 120 / 100
    assert a["vllm"][tok]["spread"] == pytest.approx(1.18)            # 118 / 100
    # per rep: 100/105 = 0.952, 120/118 = 1.017, 110/100 = 1.100 -> median 1.017
    assert a["paired_ratio"][tok] == pytest.approx(120.0 / 118.0)
    # TTFT: ours 10.0, 9.5, 10.5 -> 10.0; vllm 11.0, 10.0, 10.5 -> 10.5
    # per rep 10/11 = 0.909, 9.5/10 = 0.95, 10.5/10.5 = 1.0 -> 0.95
    assert a["ratio"]["ttft_p50_ms"] == pytest.approx(10.0 / 10.5)
    assert a["paired_ratio"]["ttft_p50_ms"] == pytest.approx(0.95)
    # CPU: ours 45, vllm 200 -> 0.225
    assert a["ratio"]["cpu_ms_per_1k"] == pytest.approx(0.225)
    assert a["ratio"]["cpu_ms_per_1k_net"] == pytest.approx(0.225)
    assert a["tokens"]["ours"] == {"client": 3000, "server": 3000, "match": True,
                                   "diffs": [0, 0, 0]}
    assert a["client_limited"] == [{"rep": 2, "reasons": ["event-loop lag"]}]


def test_aggregate_level_leaves_out_failed_runs_and_half_pairs():
    runs = _three_reps()[:4] + [_run("ours", 3, 130.0, 8.0, 2.0, 45.0)]  # budget cut rep 3
    runs[1] = dict(runs[1], ok=False, error="boom")  # vllm rep 1 failed
    a = bc.aggregate_level(runs)
    assert a["failed_runs"] == 1
    assert a["pairs"] == 1                                   # only rep 2 has both
    assert a["ours"]["output_tok_s"]["median"] == 120.0      # 100, 120, 130
    assert a["vllm"]["output_tok_s"]["median"] == 118.0
    assert a["paired_ratio"]["output_tok_s"] == pytest.approx(120.0 / 118.0)
    assert a["paired_ratio"]["output_tok_s_values"] == [pytest.approx(120.0 / 118.0)]


def test_aggregate_level_token_mismatch():
    runs = _three_reps()
    runs[1] = dict(runs[1], client_tokens=1000, server_tokens=1032)  # one request more
    a = bc.aggregate_level(runs)
    assert a["tokens"]["vllm"]["match"] is False
    assert a["tokens"]["vllm"]["diffs"] == [-32, 0, 0]
    assert a["tokens"]["vllm"]["server"] == 3032
    runs[0] = dict(runs[0], server_tokens=None)  # metrics unreadable once: not decidable
    assert bc.aggregate_level(runs)["tokens"]["ours"]["match"] is None


# --- verdicts -----------------------------------------------------------------------------
def _agg(paired_tok, paired_ttft, cpu_ratio, spreads=(1.0, 1.0)):
    agg = {"ratio": {"output_tok_s": paired_tok, "ttft_p50_ms": paired_ttft,
                     "cpu_ms_per_1k": cpu_ratio, "cpu_ms_per_1k_net": None},
           "paired_ratio": {"output_tok_s": paired_tok, "ttft_p50_ms": paired_ttft,
                            "cpu_ms_per_1k": cpu_ratio}}
    for t, s in zip(bc.TOOLS, spreads):
        agg[t] = {"output_tok_s": {"spread": s}, "ttft_p50_ms": {"spread": 1.0}}
    return agg


def test_verdicts_pass_fail_and_boundaries():
    v = bc.verdicts(_agg(1.02, 0.96, 0.3))
    assert v["tok_s"]["pass"] is True
    assert v["ttft_p50"]["pass"] is False
    assert v["cpu"]["pass"] is True
    # exactly 3 % off and exactly half: pass (0.97 is not exactly 1 - 0.03 in binary)
    v = bc.verdicts(_agg(0.97, 1.03, 0.5))
    assert v["tok_s"]["pass"] is True and v["ttft_p50"]["pass"] is True
    assert v["cpu"]["pass"] is True
    v = bc.verdicts(_agg(0.969, 1.031, 0.501))
    assert (v["tok_s"]["pass"], v["ttft_p50"]["pass"], v["cpu"]["pass"]) == (
        False, False, False)
    v = bc.verdicts(_agg(None, None, None))
    assert (v["tok_s"]["pass"], v["ttft_p50"]["pass"], v["cpu"]["pass"]) == (None, None, None)


def test_verdicts_mark_noise_larger_than_the_tolerance():
    v = bc.verdicts(_agg(1.0, 1.0, 0.3, spreads=(1.25, 1.01)))
    assert v["tok_s"]["pass"] is True and v["tok_s"]["noisy"] is True
    assert v["tok_s"]["spread_ours"] == 1.25
    assert v["ttft_p50"]["noisy"] is False


def test_verdicts_use_the_paired_ratio():
    agg = _agg(1.0, 1.0, 0.3)
    agg["ratio"]["output_tok_s"] = 1.10  # medians from drifting runs
    v = bc.verdicts(agg)
    assert v["tok_s"]["pass"] is True and v["tok_s"]["ratio_of_medians"] == 1.10


# --- time budget --------------------------------------------------------------------------
def test_estimate_pair_and_budget():
    assert bc.estimate_pair_s([], None, 8.0) == 2 * (12.0 + 10.0)     # 44 s before any pair
    assert bc.estimate_pair_s([], 30.0, 8.0) == 37.5                  # 1.25 x the last pair
    assert bc.estimate_pair_s([], 10.0, 8.0) == 36.0                  # at least 2 * 8 + 20
    assert bc.estimate_pair_s([21.0, 25.0], 30.0, 8.0) == 25.0        # slowest at this level
    assert bc.pair_fits(None, 1e9) is True
    assert bc.pair_fits(60.0, 40.0, reserve_s=20.0) is True
    assert bc.pair_fits(59.9, 40.0, reserve_s=20.0) is False


# --- report ---------------------------------------------------------------------------------
def test_format_report_prints_tables_and_verdicts_for_a_partial_run():
    report = {"args": {"input_len": 32, "output_len": 32, "duration_s": 6.0, "reps": 3},
              "workers": {"ours": {"ready": {"startup_cpu_s": 0.3, "startup_wall_s": 0.5},
                                   "warmup": {"cpu_s": 0.05}, "fixed": {"cpu_s": 0.01}}},
              "levels": [{"concurrency": 4, "runs": [dict(r, concurrency=4)
                                                     for r in _three_reps()]},
                         {"concurrency": 8, "runs": [dict(_run("ours", 1, 200.0, 20.0, 2.0,
                                                               30.0), concurrency=8)]}],
              "stopped": "time budget: 30 s left"}
    text = "\n".join(bc.format_report(report))
    assert "C=4    output tok/s  within 3 %: PASS  paired 1.017" in text
    assert "C=4    TTFT p50      within 3 %: FAIL  paired 0.950" in text
    assert "[noisy: spread ours 1.200, vllm 1.180]" in text
    assert "C=4    client CPU    <= 0.5 x vllm: PASS  0.225" in text
    assert "client-limited in rep 2" in text
    assert "C=4    ours client-limited in rep 2: event-loop lag" in text
    assert "C=8    output tok/s  within 3 %: n/a" in text   # no vllm run at that level
    assert "STOPPED EARLY: time budget: 30 s left" in text
    assert report["levels"][0]["verdicts"]["tok_s"]["pass"] is True


# --- worker protocol ----------------------------------------------------------------------
def test_serve_jobs_answers_each_job_with_its_cpu_and_wall_time():
    ticks = iter([1.0, 1.5, 10.0, 10.25])

    def handler(job):
        if job.get("bad"):
            raise ValueError("no such thing")
        return {"twice": 2 * job["x"]}
    jobs = io.StringIO(json.dumps({"id": 1, "x": 21}) + "\n\n" + json.dumps({"id": 2, "bad": 1})
                       + "\n")
    out = io.StringIO()
    cpu = iter([0.0, 0.125, 1.0, 1.5])
    bc.serve_jobs(handler, jobs, out, cpu=lambda: next(cpu), clock=lambda: next(ticks))
    a, b = [json.loads(x) for x in out.getvalue().splitlines()]
    assert a == {"id": 1, "ok": True, "result": {"twice": 42}, "cpu_s": 0.125, "wall_s": 0.5}
    assert b == {"id": 2, "ok": False, "error": "ValueError: no such thing", "cpu_s": 0.5,
                 "wall_s": 0.25}


def _worker(tmp_path, kind, *extra):
    log = open(str(tmp_path / "children.log"), "w")
    w = bc.Worker(kind, [sys.executable, SCRIPT, "--worker", kind] + list(extra), log)
    return w, log


def test_worker_process_round_trip_keeps_stdout_clean(tmp_path):
    w, log = _worker(tmp_path, "selftest")
    try:
        time.sleep(1.5)
        ready = w.wait_ready(30)
        assert ready["ready"] is True and ready["kind"] == "selftest"
        # start-up wall time ends at the worker's ready line, not when it was read
        assert ready["startup_cpu_s"] > 0 and 0 < ready["startup_wall_s"] < 1.5
        msg = w.call({"payload": [1, 2]}, 30)
        assert msg["ok"] is True and msg["result"]["echo"] == [1, 2] and msg["id"] == 1
        assert msg["result"]["pid"] == w.proc.pid
        assert msg["cpu_s"] >= 0 and msg["wall_s"] >= 0
        msg = w.call({"raise": "bad job"}, 30)
        assert msg["ok"] is False and msg["error"] == "ValueError: bad job" and msg["id"] == 2
        msg = w.call({"sleep": 0.2}, 30)          # the worker survives a failed job
        assert msg["ok"] is True and msg["wall_s"] >= 0.2
        # the sleep did not use CPU: the job's CPU is the worker's own, not wall time
        assert msg["cpu_s"] < 0.15
    finally:
        rc = w.close()
        log.close()
    assert rc == 0  # closing stdin ended it
    noise = open(str(tmp_path / "children.log")).read()
    assert noise.count("noise on stdout") == 3  # the handler's prints went to stderr


def test_worker_timeout_raises_and_close_kills_it(tmp_path):
    w, log = _worker(tmp_path, "selftest")
    try:
        w.wait_ready(30)
        t0 = time.time()
        with pytest.raises(bc.WorkerError, match="no answer within"):
            w.call({"sleep": 60}, 1.0)
        assert time.time() - t0 < 10
        assert w.proc.poll() is None  # still busy
    finally:
        w.close(grace_s=0.5)
        log.close()
    assert w.proc.returncode == -9


def test_worker_that_dies_is_reported(tmp_path):
    log = open(str(tmp_path / "children.log"), "w")
    w = bc.Worker("dead", [sys.executable, "-c", "import sys; sys.exit(3)"], log)
    try:
        with pytest.raises(bc.WorkerError, match=r"exited \(rc 3\)"):
            w.wait_ready(30)
    finally:
        w.close()
        log.close()


def test_ours_worker_imports_sweep_client_through_the_collections_path(tmp_path):
    """The real "ours" worker: the collection's module_utils imported through the repository's
    collections path; a bad parameter comes back as the SweepError run_sweep raises."""
    w, log = _worker(tmp_path, "ours", bc.COLLECTIONS)
    try:
        assert w.wait_ready(60)["kind"] == "ours"
        msg = w.call({"params": {"base_url": "http://127.0.0.1:9", "model": "m", "levels": []}},
                     60)
    finally:
        w.close()
        log.close()
    assert msg["ok"] is False
    assert msg["error"].startswith("SweepError:")


# --- job construction and the run.sh wrapper ----------------------------------------------
def _args(**kw):
    d = dict(model="tiny", model_dir="/m", input_len=128, output_len=64, duration_s=8.0)
    d.update(kw)
    return type("A", (), d)


def test_vllm_argv_and_ours_params():
    argv = bc.vllm_argv(_args(), "http://h:1", 4, 40, 7, "/w", "f.json")
    pairs = dict(zip(argv[::1], argv[1:]))
    assert pairs["--num-prompts"] == "40" and pairs["--max-concurrency"] == "4"
    assert pairs["--random-input-len"] == "128" and pairs["--random-output-len"] == "64"
    assert pairs["--seed"] == "7" and pairs["--request-rate"] == "inf"
    assert pairs["--tokenizer"] == "/m" and pairs["--model"] == "tiny"
    assert "--ignore-eos" in argv and "--disable-tqdm" in argv and "--save-result" in argv
    p = bc.ours_params(_args(), "http://h:1", 4, 2048, 9)
    assert p["levels"] == [4] and p["vocab_size"] == 2048 and p["seed"] == 9
    assert p["stop_on_saturation"] is False and p["duration_s"] == 8.0
    assert "vocab_size" not in bc.ours_params(_args(), "http://h:1", 4, None, 9)


def test_parse_args_defaults_and_checks():
    a = bc.parse_args(["--vllm-python", "py", "--model-dir", "d", "--levels", "1,8"])
    assert a.levels == [1, 8] and a.reps == 3 and a.time_budget_s is None
    assert a.vocab_size is None
    for bad in (["--levels", "0"], ["--reps", "0"], ["--levels", "a"]):
        with pytest.raises(SystemExit):
            bc.parse_args(["--vllm-python", "py", "--model-dir", "d"] + bad)


def test_bench_vocab_forwards_the_environment():
    assert bv.forwarded(["--levels", "1"], {"GPU_CHECK_VOCAB": "2048"}) == [
        "--levels", "1", "--vocab-size", "2048", "--time-budget-s", "520"]
    assert bv.forwarded(["--vocab-size=10", "--time-budget-s", "99"],
                        {"GPU_CHECK_VOCAB": "2048", "GPU_CHECK_BENCH_TIMEOUT": "900"}) == [
        "--vocab-size=10", "--time-budget-s", "99"]
    assert bv.forwarded([], {"GPU_CHECK_BENCH_TIMEOUT": "300"}) == ["--time-budget-s", "260"]


# --- prompt formats, prompt tokens and the load shape -------------------------------------
def test_prompt_format_reaches_our_params_and_vllm_bench_saves_detail():
    assert bc.prompt_formats("both") == ["text", "token_ids"]
    assert bc.prompt_formats("token_ids") == ["token_ids"]
    assert bc.ours_params(_args(prompt_format="text"), "http://h:1", 4, 2048, 9)[
        "prompt_format"] == "text"
    assert bc.ours_params(_args(prompt_format="both"), "http://h:1", 4, 2048, 9,
                          prompt_format="token_ids")["prompt_format"] == "token_ids"
    assert bc.ours_params(_args(), "http://h:1", 4, 2048, 9)["prompt_format"] == "token_ids"
    assert "--save-detailed" in bc.vllm_argv(_args(load_shape=True), "http://h:1", 4, 40, 7,
                                             "/w", "f.json")
    assert "--save-detailed" not in bc.vllm_argv(_args(load_shape=False), "http://h:1", 4, 40,
                                                 7, "/w", "f.json")
    a = bc.parse_args(["--vllm-python", "py", "--model-dir", "d"])
    assert a.prompt_format == "text" and a.load_shape is True  # vllm bench sends text
    a = bc.parse_args(["--vllm-python", "py", "--model-dir", "d", "--prompt-format", "both",
                       "--no-load-shape"])
    assert a.prompt_format == "both" and a.load_shape is False
    with pytest.raises(SystemExit):
        bc.parse_args(["--vllm-python", "py", "--model-dir", "d", "--prompt-format", "ids"])


def test_load_shape_tells_lock_step_waves_from_drifting_loops():
    c = 8
    # waves: 4 waves of 8 requests sent within 5 ms of each other, each lasting 1 s
    starts = [w * 1.0 + i * 0.0007 for w in range(4) for i in range(c)]
    ends = [s + 1.0 for s in starts]
    waves = bc.load_shape(starts, ends, [0.1] * len(starts), c)
    assert waves["wave"] == 1.0 and waves["requests"] == 32
    # in flight: 32 s of requests over 3.0049 s (first send 0, last end 3 + 7 * 0.0007 + 1)
    assert waves["in_flight_mean"] == round(32 / (4.0 + 7 * 0.0007), 3)
    # drifting: 8 loops whose sends are 125 ms apart, never 4 others within 20 ms
    drift = [i * 0.125 for i in range(32)]
    shape = bc.load_shape(drift, [s + 1.0 for s in drift], [0.05 + 0.001 * i for i in range(32)],
                          c)
    assert shape["wave"] == 0.0
    # TTFT p50/p90: linear interpolation of 50..81 ms: 65.5 and 77.9
    assert shape["ttft_p50_ms"] == 65.5 and shape["ttft_p90_ms"] == 77.9
    # exactly C/2 = 4 others within 20 ms counts (5 sends 5 ms apart), 3 others does not
    assert bc.load_shape([0, 0.005, 0.01, 0.015, 0.02], [1] * 5, [0.1] * 5, 8)["wave"] == 1.0
    assert bc.load_shape([0, 0.005, 0.01, 0.015], [1] * 4, [0.1] * 4, 8)["wave"] == 0.0
    empty = bc.load_shape([], [], [], 4)
    assert empty["requests"] == 0 and empty["wave"] is None


def test_load_shape_of_vllm_bench_detail_and_of_our_request_log(tmp_path):
    res = {"start_times": [10.0, 10.001, 11.0], "ttfts": [0.1, 0.2, 0.0],
           "latencies": [0.9, 1.0, 0.0], "itls": [[0.4, 0.4], [0.4, 0.4], []],
           "errors": ["", "", "boom"]}
    sh = bc.load_shape_of_vllm(res, 2)
    # failed request's TTFT left out; its end is its send
    assert sh["requests"] == 3 and sh["ttft_p50_ms"] == 150.0
    assert sh["wave"] == round(2 / 3.0, 4)  # the first two are within 20 ms of one other
    assert sh["span_s"] == 1.001  # 10.0 .. 11.001
    older = dict(res, latencies=None)  # a vllm bench without latencies: TTFT + the ITLs
    assert bc.load_shape_of_vllm(older, 2)["in_flight_mean"] == sh["in_flight_mean"]
    assert bc.load_shape_of_vllm({"ttfts": [0.1]}, 2) is None  # not --save-detailed
    log = tmp_path / "r.jsonl"
    log.write_text("\n".join(json.dumps(r) for r in [
        {"start_s": 0.0, "end_s": 1.0, "ttft_ms": 100.0, "error": None},
        {"start_s": 0.01, "end_s": 1.01, "ttft_ms": 300.0, "error": None},
        {"start_s": 0.5, "end_s": 0.6, "ttft_ms": None, "error": "HTTP 500"}]) + "\n")
    sh = bc.load_shape_of_log(str(log), 2)
    assert sh["requests"] == 3 and sh["ttft_p50_ms"] == 200.0
    assert sh["in_flight_mean"] == round(2.1 / 1.01, 3)


def test_prompt_tokens_per_request_and_their_report_lines():
    # 3 requests of 32 output tokens plus none else: 96 output, 3 x 33 prompt tokens
    assert bc.prompt_per_request(99, 96, 32) == 33.0
    assert bc.prompt_per_request(None, 96, 32) is None
    assert bc.prompt_per_request(99, 0, 32) is None

    def run(tool, rep, per_req, own, miss=None, shape=None):
        r = dict(_run(tool, rep, 100.0, 10.0, 2.0, 40.0), prompt_per_request=per_req,
                 client_prompt_tokens=own, concurrency=4)
        if tool == "ours":
            r["prompt_mismatched"] = miss
        if shape:
            r["load_shape"] = shape
        return r
    shape = {"requests": 40, "wave": 0.95, "in_flight_mean": 3.9, "ttft_p50_ms": 12.5,
             "ttft_p90_ms": 20.0, "span_s": 4.0}
    report = {"args": {"input_len": 32, "output_len": 32, "duration_s": 4.0, "reps": 1},
              "levels": [{"concurrency": 4, "prompt_format": "text",
                          "runs": [run("ours", 1, 32.0, 1280, 0), run("vllm", 1, 32.0, 1240,
                                                                      shape=shape)]},
                         {"concurrency": 4, "prompt_format": "token_ids",
                          "runs": [run("ours", 1, 32.0, 1280, 2), run("vllm", 1, 32.0, 1240)]}],
              "workers": {}, "stopped": None}
    lines = bc.format_report(report)
    text = "\n".join(lines)
    assert "== our prompts: text; vllm bench serve: text (random dataset) ==" in text
    assert "== our prompts: token_ids; vllm bench serve: text (random dataset) ==" in text
    rows = [ln.split() for ln in lines if ln.strip().startswith("4 |") and "32.00" in ln]
    assert rows[0] == ["4", "|", "32.00", "32.00", "|", "1280", "1240", "|", "0"]
    assert rows[1][-1] == "2"
    assert [ln.split() for ln in lines if ln.strip().startswith("4    1 vllm")] == [
        ["4", "1", "vllm", "|", "40", "0.950", "3.9", "|", "12.50", "20.00"]]
    # both formats at one level: the verdicts say which is which
    assert "C=4 text output tok/s" in text and "C=4 token_ids output tok/s" in text


# --- the paced stub: a known TTFT to calibrate both tools against ---------------------------
def test_paced_stub_delays_the_first_token_and_the_calibration_subtracts_it():
    import urllib.request
    args = bc.parse_args(["--vllm-python", sys.executable, "--model-dir", ROOT,
                          "--stub-ttft-ms", "30", "--stub-itl-ms", "1", "--stub-processes", "1"])
    url, procs = bc.start_paced_stub(args)
    try:
        body = json.dumps({"model": "stub", "prompt": [1, 2, 3], "max_tokens": 4,
                           "stream": True}).encode()
        firsts = []
        for _unused in range(3):
            t0 = time.perf_counter()
            with urllib.request.urlopen(urllib.request.Request(
                    url + "/v1/completions", body, {"Content-Type": "application/json"})) as r:
                r.readline()  # the chunk-size line of the first token's event
                firsts.append((time.perf_counter() - t0) * 1000.0)
                rest = r.read()
            assert rest.count(b'"text":" tok"') == 3 and b"[DONE]" in rest  # 4 tokens in all
        assert min(firsts) >= 30.0, firsts  # paced: never before the set TTFT
        report = {"levels": [{"concurrency": 1, "prompt_format": "token_ids", "runs": [
            {"tool": "ours", "ok": True, "ttft_p50_ms": 40.0},
            {"tool": "vllm", "ok": True, "ttft_p50_ms": 45.0},
            {"tool": "vllm", "ok": False, "ttft_p50_ms": 1.0}]}]}
        cal = bc.stub_calibration(args, url, report)
    finally:
        for p in procs:
            p.terminate()
    # the stub serves each first token before the client reads it: means compare, not minima
    assert cal["requests"] == 3 and 30.0 <= cal["first_token_served_ms"] < sum(firsts) / 3
    row = cal["levels"][0]
    assert row["ours"]["bias_ms"] == pytest.approx(40.0 - cal["first_token_served_ms"])
    assert row["vllm"]["ttft_p50_ms"] == 45.0  # the failed run is left out
    lines = bc.format_stub(cal)
    assert "calibration, not vLLM" in lines[1] and lines[-1].split()[:2] == ["1", "token_ids"]


def test_stub_calibration_refuses_a_base_url():
    with pytest.raises(SystemExit):
        bc.parse_args(["--vllm-python", sys.executable, "--model-dir", ROOT,
                       "--stub-ttft-ms", "5", "--base-url", "http://127.0.0.1:1"])
