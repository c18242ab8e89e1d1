"""Load-generator agents (vllm_sweep load_generators / mode agent): the clock offset estimate,
the mapping of an agent's record times, the key kept out of results, and real agents in local
processes driving the client-ceiling stub (tests/benchmarks/bench_client_ceiling.py, a paced
streaming server with its own token and request counters) for a sweep run in this process."""
import json
import multiprocessing
import os
import socket
import sys
import time

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep import agents as sweep_agents
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep import vllm_sweep
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep import workers as sweep_workers
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import (
    AgentIdle, SweepError, best_offset, check_params, map_record, run_agent, run_sweep,
    stop_agents)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import Record

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))))
sys.path.insert(0, os.path.join(ROOT, "tests", "benchmarks"))

import bench_client_ceiling as stub  # noqa: E402

KEY = "agent-key-7d1e0c"


def test_imports_this_worktree():
    assert vllm_sweep.__file__.startswith(os.path.realpath(ROOT)) or \
        os.path.realpath(vllm_sweep.__file__).startswith(os.path.realpath(ROOT))


# --- the clock offset and the record mapping ------------------------------------------------
def test_offset_takes_the_round_trip_with_the_smallest_rtt():
    # agent clock = ours + 100 s; the second round trip is the tightest (2 ms)
    pings = [(10.000, 110.004, 10.010), (11.000, 111.001, 11.002), (12.0, 112.0035, 12.006)]
    got = best_offset(pings)
    assert got["offset_s"] == pytest.approx(100.0, abs=1e-9)
    assert got["rtt_ms"] == pytest.approx(2.0) and got["error_bound_ms"] == pytest.approx(1.0)
    assert got["pings"] == 3


def test_offset_error_bound_holds_for_any_reply_time_inside_the_round_trip():
    true_offset = -3.25
    for frac in (0.0, 0.1, 0.5, 0.9, 1.0):  # when inside the trip the agent read its clock
        t_send, t_recv = 5.0, 5.008
        got = best_offset([(t_send, t_send + frac * 0.008 + true_offset, t_recv)])
        assert abs(got["offset_s"] - true_offset) <= got["error_bound_ms"] / 1000.0 + 1e-12


def test_no_pings_is_an_error():
    with pytest.raises(ValueError):
        best_offset([])


def test_record_times_move_onto_our_clock_and_latencies_stay():
    rec = Record(level=4, worker=3, start=1000.0, end=1000.5, chunk_times=[1000.1, 1000.2, 1000.5],
                 chunk_tokens=None, completion_tokens=3, prompt_tokens=8, expected_tokens=3)
    tup = sweep_workers.record_tuple(rec)
    moved = Record(*map_record(tup, 990.0))
    assert moved.start == pytest.approx(10.0) and moved.end == pytest.approx(10.5)
    assert moved.chunk_times == pytest.approx([10.1, 10.2, 10.5])
    assert moved.ttft == pytest.approx(rec.ttft) and moved.e2e == pytest.approx(rec.e2e)
    assert moved.itls == pytest.approx(rec.itls) and moved.tpot == pytest.approx(rec.tpot)
    assert (moved.level, moved.worker, moved.completion_tokens) == (4, 3, 3)
    # a failed request without an end or chunks maps too
    failed = map_record((1, 0, 5.0, None, [], None, None, None, 3, "HTTP 500"), 2.0)
    assert failed[2] == 3.0 and failed[3] is None and failed[4] == []


# --- parameters ----------------------------------------------------------------------------
def _p(**kw):
    p = {"base_url": "http://127.0.0.1:9", "model": "m", "levels": [2], "input_len": 8,
         "output_len": 8, "duration_s": 1.0, "request_timeout_s": 10.0,
         "saturation_threshold": 0.1, "endpoint": "completions"}
    p.update(kw)
    return p


@pytest.mark.parametrize("kw, words", [
    ({"load_generators": [{"host": "a"}]}, "load_generators[0] must be {host"),
    ({"load_generators": [{"host": "a", "port": 0}]}, "load_generators[0]"),
    ({"load_generators": [{"host": "a", "port": 5}, {"host": "a", "port": 5}]},
     "load_generators[1] repeats a:5"),
    ({"load_generators": [{"host": "a", "port": 5}]}, "needs load_generator_authkey"),
    ({"load_generators": [{"host": "a", "port": 5}], "load_generator_authkey": KEY,
      "processes": 2}, "processes (2) applies to a sweep without load_generators"),
    ({"load_generators": [{"host": "a", "port": 5}, {"host": "b", "port": 5},
                          {"host": "c", "port": 5}], "load_generator_authkey": KEY},
     "3 agents, more than the largest level (2)"),
])
def test_bad_load_generators_name_the_variable(kw, words):
    with pytest.raises(SweepError) as e:
        check_params(_p(**kw))
    assert words in str(e.value)


# --- real agents ------------------------------------------------------------------------------
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent_main(port, key, timeout_s, out):
    try:
        out.put(("ok", run_agent("127.0.0.1", port, key, timeout_s)))
    except BaseException as e:  # noqa: BLE001 - the test reads it
        out.put(("error", "%s: %s" % (type(e).__name__, e)))


@pytest.fixture
def agents():
    ctx = multiprocessing.get_context("fork")
    made = []

    def start(n, key=KEY, timeout_s=30.0):
        lgs = []
        for _unused in range(n):
            port = free_port()
            q = ctx.Queue()
            p = ctx.Process(target=_agent_main, args=(port, key, timeout_s, q), daemon=True)
            p.start()
            made.append((p, q))
            lgs.append({"host": "127.0.0.1", "port": port})
        return lgs, made[-n:]
    yield start
    for p, _q in made:
        if p.is_alive():
            p.terminate()
        p.join(5)


@pytest.fixture(scope="module")
def paced_stub():
    url, procs = stub.start_stub(1, ttft_s=0.005, itl_s=0.002)
    yield url
    for p in procs:
        p.terminate()
        p.join(5)


def _stub_counts(url):
    import urllib.request
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.prometheus import metric_sum
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return {"requests": metric_sum(text, "stub_first_token_seconds_count"),
            "output": metric_sum(text, "vllm:generation_tokens_total")}


def test_two_agents_merge_exactly(paced_stub, agents, tmp_path):
    lgs, procs = agents(2)
    before = _stub_counts(paced_stub)
    log = str(tmp_path / "requests.jsonl")
    res = run_sweep({
        "base_url": paced_stub, "model": stub.MODEL, "levels": [2, 4], "input_len": 8,
        "output_len": 16, "duration_s": 0.5, "request_timeout_s": 30, "vocab_size": 1000,
        "saturation_threshold": 0.1, "stop_on_saturation": False, "endpoint": "completions",
        "api_key": "server-key-55", "load_generators": lgs, "load_generator_authkey": KEY},
        request_log_path=log)
    after = _stub_counts(paced_stub)
    text = json.dumps(res)
    assert KEY not in text and "server-key-55" not in text
    assert "load_generator_authkey" not in res["parameters"]
    assert res["client"]["load_generators"] == ["127.0.0.1:%d" % lg["port"] for lg in lgs]
    assert res["client"]["processes"] == 2
    rows = [json.loads(line) for line in open(log)]
    total_requests = 0
    opened = []
    for lv in res["levels"]:
        chk = lv["server_check"]
        assert chk["match"] is True, chk  # each level's tokens equal the server's delta
        assert chk["client_output_tokens"] == 16 * lv["requests_total"]
        assert lv["requests_failed"] == 0
        cl = lv["client"]
        assert cl["processes"] == 2 and cl["load_generators"] == 2
        hosts = [pp["host"] for pp in cl["per_process"]]
        assert hosts == ["load generator 127.0.0.1:%d (load_generators[%d])" % (lg["port"], i)
                         for i, lg in enumerate(lgs)]
        for pp in cl["per_process"]:
            clock = pp["clock"]
            assert clock["pings"] == 8 and 0 <= clock["error_bound_ms"] < 50
            # same machine, same monotonic clock: the estimate is within its bound of 0
            assert abs(clock["offset_s"]) * 1000.0 <= clock["error_bound_ms"] + 1e-6
        opened.append(cl["connections_opened"])
        assert cl["cpu_s_level"] > sum(pp["cpu_s_window"] for pp in cl["per_process"]) * 0.5
        total_requests += lv["requests_total"]
        # the workers of the level are split over both agents and each is seen
        assert {r["worker"] for r in rows if r["level"] == lv["concurrency"]} == \
            set(range(lv["concurrency"]))
    # summed over the agents: keep-alive connections carry over to the next level
    assert opened[0] >= 2 and sum(opened) >= 4
    # every request the server answered is in the results exactly once
    assert after["requests"] - before["requests"] == total_requests == len(rows)
    assert after["output"] - before["output"] == 16 * total_requests
    keys = [(r["level"], r["worker"], r["start_s"]) for r in rows]
    assert len(set(keys)) == len(keys)
    for p, q in procs:
        status, info = q.get(timeout=20)
        assert status == "ok", info
        assert info["ended"] == "quit" and info["levels"] == 2 and KEY not in json.dumps(info)
        p.join(10)
        assert p.exitcode == 0


def test_wrong_key_is_an_authentication_error_naming_the_agent(paced_stub, agents):
    lgs, procs = agents(1, timeout_s=2.0)
    with pytest.raises(SweepError) as e:
        run_sweep({"base_url": paced_stub, "model": stub.MODEL, "levels": [1], "input_len": 8,
                   "output_len": 4, "duration_s": 0.2, "request_timeout_s": 10,
                   "vocab_size": 1000, "saturation_threshold": 0.1, "endpoint": "completions",
                   "load_generators": lgs, "load_generator_authkey": "not-the-key"})
    msg = str(e.value)
    assert "load generator 127.0.0.1:%d (load_generators[0])" % lgs[0]["port"] in msg
    assert "authentication failed" in msg and "not-the-key" not in msg
    # the agent itself keeps waiting for the right key, then gives up (agent_timeout_s)
    status, info = procs[0][1].get(timeout=20)
    assert status == "error" and "agent_timeout_s" in info and "1 connection(s) failed" in info


def test_unreachable_agent_names_host_and_port(paced_stub, monkeypatch):
    monkeypatch.setattr(sweep_agents, "AGENT_CONNECT_S", 1.0)
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(SweepError) as e:
        sweep_agents.AgentPool(vllm_sweep.Sweep({
            "base_url": paced_stub, "model": stub.MODEL, "levels": [1], "input_len": 8,
            "output_len": 4, "duration_s": 0.2, "request_timeout_s": 10, "vocab_size": 1000,
            "saturation_threshold": 0.1, "endpoint": "completions"}),
            [{"host": "127.0.0.1", "port": port}], KEY, connect_s=1.0)
    assert "cannot reach load generator 127.0.0.1:%d (load_generators[0]) within 1 s" % port \
        in str(e.value)
    assert time.monotonic() - t0 < 10


def test_agent_dying_mid_level_is_a_clear_error(paced_stub, agents):
    lgs, procs = agents(2)
    killer = {}

    import threading

    def kill_soon():
        time.sleep(1.0)
        procs[1][0].kill()
        killer["done"] = True
    threading.Thread(target=kill_soon, daemon=True).start()
    with pytest.raises(SweepError) as e:
        run_sweep({"base_url": paced_stub, "model": stub.MODEL, "levels": [2], "input_len": 8,
                   "output_len": 16, "duration_s": 30, "request_timeout_s": 10,
                   "vocab_size": 1000, "saturation_threshold": 0.1, "endpoint": "completions",
                   "load_generators": lgs, "load_generator_authkey": KEY})
    assert killer.get("done")
    msg = str(e.value)
    assert "load generator 127.0.0.1:%d (load_generators[1]) ended during concurrency 2" \
        % lgs[1]["port"] in msg, msg
    # the survivor saw the sweep go away and ended by itself
    status, info = procs[0][1].get(timeout=30)
    assert status == "ok" and info["ended"].startswith(("quit", "disconnect")), info


def test_agent_without_a_sweep_gives_up_and_stop_ends_a_waiting_one(agents):
    lgs, procs = agents(1, timeout_s=1.0)
    status, info = procs[0][1].get(timeout=20)
    assert status == "error" and "no sweep connected within 1.0 s (agent_timeout_s)" in info
    lgs, procs = agents(1, timeout_s=30.0)
    deadline = time.monotonic() + 10
    while True:  # until it listens
        got = stop_agents(lgs, KEY, wait_s=0.1)
        if got[0]["result"] == "stopped" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got == [{"agent": "127.0.0.1:%d" % lgs[0]["port"], "result": "stopped"}]
    status, info = procs[0][1].get(timeout=20)
    assert status == "ok" and info["ended"].startswith("quit") and info["levels"] == 0
    t0 = time.monotonic()
    assert stop_agents(lgs, KEY, wait_s=0.5)[0]["result"].startswith("not listening")
    assert time.monotonic() - t0 < 5


def test_agent_idle_is_a_sweep_error_subclass():
    assert issubclass(AgentIdle, SweepError)


def test_a_silent_agent_fails_the_level_naming_it(paced_stub, agents, monkeypatch):
    """An agent whose host stops answering without closing the connection (here: SIGSTOP)
    fails the level after SILENCE_LIMIT_S instead of hanging the sweep."""
    import signal
    import threading
    monkeypatch.setattr(sweep_workers, "SILENCE_LIMIT_S", 2.0)
    lgs, procs = agents(2)
    pid = procs[1][0].pid

    def stop_soon():
        time.sleep(1.0)
        os.kill(pid, signal.SIGSTOP)
    threading.Thread(target=stop_soon, daemon=True).start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(SweepError) as e:
            run_sweep({"base_url": paced_stub, "model": stub.MODEL, "levels": [2],
                       "input_len": 8, "output_len": 16, "duration_s": 60,
                       "request_timeout_s": 10, "vocab_size": 1000,
                       "saturation_threshold": 0.1, "endpoint": "completions",
                       "load_generators": lgs, "load_generator_authkey": KEY})
    finally:
        os.kill(pid, signal.SIGCONT)
    msg = str(e.value)
    assert ("load generator 127.0.0.1:%d (load_generators[1]) sent nothing for"
            % lgs[1]["port"]) in msg and "during concurrency 2" in msg, msg
    assert time.perf_counter() - t0 < 20


def test_long_requests_are_not_silence(paced_stub, agents, monkeypatch):
    """Requests longer than the silence limit: the agents' heartbeats keep the level alive."""
    # a heartbeat every 0.2 s (the agent is forked after this), silence limit 2 s: slack for
    # a loaded machine; each request streams for 5 s
    monkeypatch.setattr(sweep_workers, "HEARTBEAT_S", 0.2)
    monkeypatch.setattr(sweep_workers, "SILENCE_LIMIT_S", 2.0)
    lgs, _procs = agents(1)
    res = run_sweep({"base_url": paced_stub, "model": stub.MODEL, "levels": [1],
                     "input_len": 8, "output_len": 2500, "duration_s": 0.1,
                     "warmup_requests": 0, "min_requests": 1,
                     "request_timeout_s": 30, "vocab_size": 1000,
                     "saturation_threshold": 0.1, "endpoint": "completions",
                     "load_generators": lgs, "load_generator_authkey": KEY})
    lv = res["levels"][0]
    assert lv["requests_ok"] >= 1 and lv["server_check"]["match"] is True
    assert lv["timing"]["level_s"] > 4.0  # each request took > 2 x the silence limit
