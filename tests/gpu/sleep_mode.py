"""vLLM's sleep mode on a GPU, measured as the upgrade gate would use it (run ON the GPU
machine with the deployed vLLM venv's python, the deployed unit stopped first):

1. server A starts with ``--enable-sleep-mode`` (and VLLM_SERVER_DEV_MODE=1, which the
   pinned vLLM may need for the endpoints; checked in its source and printed), an API key;
   greedy reference outputs; a sweep;
2. ``POST /sleep?level=1`` without the key (is the control endpoint protected?), then with
   it, timed; GPU memory before and asleep; what a client gets from a sleeping server;
3. server B (the candidate: the same command line without sleep mode) starts while A
   sleeps; if it cannot get its memory, the error line and a second try at the utilization
   that fits; B is swept (sleep mode off vs on, side by side) and its outputs compared;
4. B stops; ``POST /wake_up`` timed, then the first completion; outputs compared with the
   reference; A swept again.

Prints a summary and writes everything to --json-out. Nothing here is product code.

    /opt/vllm-deploy/current/bin/python tests/gpu/sleep_mode.py --model-dir DIR \
        --extra-args "--load-format dummy --max-model-len 4096" --json-out $OUT/sleep.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))
NVSMI = "/usr/local/nvidia/bin/nvidia-smi"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, there",
           "In 1969, the first person to walk on the moon"]


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def http(method, url, key=None, body=None, timeout=30.0):
    """(status, parsed JSON or text, seconds)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read().decode(errors="replace"), e.code
    except (urllib.error.URLError, OSError) as e:
        return None, str(e), time.monotonic() - t0
    try:
        return status, json.loads(raw), time.monotonic() - t0
    except ValueError:
        return status, raw[:300], time.monotonic() - t0


def gpu_used_mib():
    out = subprocess.run([NVSMI, "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False).stdout.split("\n")[0]
    used, total = (int(x) for x in out.split(","))
    return used, total


class Server(object):
    def __init__(self, name, python, args, port, key, env, logdir):
        self.name, self.port, self.key = name, port, key
        self.base = "http://127.0.0.1:%d" % port
        self.log_path = os.path.join(logdir, "server-%s.log" % name)
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--port", str(port),
                "--host", "127.0.0.1"] + args
        self.argv = argv
        self.t0 = time.monotonic()
        # the key travels in the environment (VLLM_API_KEY), not on the command line
        self.proc = subprocess.Popen(argv, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
                                     env=dict(os.environ, VLLM_API_KEY=key, **env),
                                     start_new_session=True)

    def wait(self, timeout):
        while time.monotonic() - self.t0 < timeout:
            if self.proc.poll() is not None:
                return None
            st, _b, _t = http("GET", self.base + "/health", timeout=5)
            if st == 200:
                return time.monotonic() - self.t0
            time.sleep(1)
        return None

    def error_line(self):
        with open(self.log_path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
        for ln in reversed(lines):
            if ("Error:" in ln or "Exception:" in ln or "Traceback" in ln) and "WARNING" not in ln:
                return ln[-400:]
        return lines[-1][-400:] if lines else ""

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)


def greedy(server, model):
    out = []
    for p in PROMPTS:
        st, body, _t = http("POST", server.base + "/v1/completions", server.key,
                            {"model": model, "prompt": p, "max_tokens": 16, "temperature": 0,
                             "ignore_eos": True}, timeout=120)
        out.append(body["choices"][0]["text"] if st == 200 else "HTTP %s" % st)
    return out


def sweep(server, model, levels, duration, tokenizer_vocab):
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import run_sweep
    p = dict(base_url=server.base, model=model, api_key=server.key, levels=levels, input_len=128,
             output_len=128, duration_s=duration, endpoint="completions", request_timeout_s=300,
             saturation_threshold=0.1, stop_on_saturation=False, seed=1,
             prompt_format="token_ids", vocab_size=tokenizer_vocab)
    return run_sweep(p)["levels"]


def headline(levels):
    return dict((lv["concurrency"], round(lv["output_tok_s"], 1)) for lv in levels)


def dev_mode_source(python):
    """Where the pinned vLLM registers /sleep, and what VLLM_SERVER_DEV_MODE opens."""
    code = ("import os, vllm; print(os.path.dirname(vllm.__file__)); print(vllm.__version__)")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False).stdout.split()
    root, version = out[0], out[1]
    hits = subprocess.run(["grep", "-rn", "--include=*.py", "-E",
                           "VLLM_SERVER_DEV_MODE|@router\\.(post|get)\\(\"/(sleep|wake_up|is_sleeping|collective_rpc|reset_prefix_cache|server_info|reset_mm_cache|scale_elastic_ep)",
                           os.path.join(root, "entrypoints")], capture_output=True, text=True,
                          check=False).stdout.splitlines()
    return {"vllm": version, "lines": [h.replace(root, "vllm") for h in hits][:40]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", default="sleep-check")
    ap.add_argument("--extra-args", default="--load-format dummy --max-model-len 4096")
    ap.add_argument("--levels", default="1,16")
    ap.add_argument("--duration-s", type=float, default=8)
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--start-timeout-s", type=float, default=420)
    ap.add_argument("--stacks-every-s", type=float, default=0,
                    help="server A's processes dump every thread's Python stack this often "
                         "(faulthandler, through a sitecustomize that reads VD_DUMP_STACKS_EVERY_S)")
    ap.add_argument("--json-out")
    a = ap.parse_args()
    levels = [int(x) for x in a.levels.split(",")]
    logdir = os.path.dirname(a.json_out) if a.json_out else "/tmp"
    res = {"source": dev_mode_source(a.python)}
    for ln in res["source"]["lines"]:
        log("source: " + ln)
    key = secrets.token_hex(16)
    base_args = ["--model", a.model_dir, "--served-model-name", a.model] + shlex.split(a.extra_args)
    dev = {"VLLM_SERVER_DEV_MODE": "1"}
    used0 = gpu_used_mib()
    res["gpu_used_idle_mib"] = used0[0]
    a_env = dict(dev, VD_DUMP_STACKS_EVERY_S=str(a.stacks_every_s)) if a.stacks_every_s else dev
    A = Server("A-sleep-mode", a.python, base_args + ["--enable-sleep-mode"], 8300, key, a_env, logdir)
    t = A.wait(a.start_timeout_s)
    if t is None:
        res["a_error"] = A.error_line()
        log("A did not start: %s" % res["a_error"])
        A.stop()
        return finish(res, a)
    res["a_start_s"] = round(t, 1)
    log("A (sleep mode) healthy after %.1f s" % t)
    ref = greedy(A, a.model)
    res["a_sweep"] = sweep(A, a.model, levels, a.duration_s, a.vocab_size)
    log("A sweep: %s" % headline(res["a_sweep"]))
    res["gpu_used_awake_mib"] = gpu_used_mib()[0]
    st, body, _t = http("POST", A.base + "/sleep?level=1")
    res["sleep_without_key_status"] = st
    log("POST /sleep without the API key: HTTP %s" % st)
    if st != 200:
        st, body, tsl = http("POST", A.base + "/sleep?level=1", key, timeout=300)
    else:
        tsl = _t
    res["sleep_status"], res["sleep_s"] = st, round(tsl, 3)
    st2, slept, _t = http("GET", A.base + "/is_sleeping", key)
    res["is_sleeping"] = slept
    time.sleep(2)
    res["gpu_used_asleep_mib"] = gpu_used_mib()[0]
    log("sleep: HTTP %s in %.3f s; is_sleeping %s; GPU used %d -> %d MiB (idle %d)"
        % (st, tsl, slept, res["gpu_used_awake_mib"], res["gpu_used_asleep_mib"], used0[0]))
    st, body, tc = http("POST", A.base + "/v1/completions", key,
                        {"model": a.model, "prompt": "hi", "max_tokens": 4}, timeout=15)
    res["completion_while_asleep"] = {"status": st, "seconds": round(tc, 2), "body": str(body)[:300]}
    log("a completion while asleep: %s after %.1f s: %s" % (st, tc, str(body)[:160]))
    B = Server("B-candidate", a.python, base_args, 8301, key, {}, logdir)
    t = B.wait(a.start_timeout_s)
    if t is None:
        res["b_error"] = B.error_line()
        log("B (candidate) did not start beside the sleeping A: %s" % res["b_error"])
        B.stop()
        used, total = gpu_used_mib()
        util = round(max(0.05, (total - used - 2048) / float(total)), 3)
        res["b_retry_utilization"] = util
        B = Server("B-candidate-retry", a.python, base_args + ["--gpu-memory-utilization", str(util)],
                   8301, key, {}, logdir)
        t = B.wait(a.start_timeout_s)
        if t is None:
            res["b_retry_error"] = B.error_line()
            log("B retry failed too: %s" % res["b_retry_error"])
            B.stop()
    if t is not None:
        res["b_start_s"] = round(t, 1)
        log("B (candidate) healthy beside the sleeping A after %.1f s" % t)
        res["b_greedy_equal"] = greedy(B, a.model) == ref
        res["b_sweep"] = sweep(B, a.model, levels, a.duration_s, a.vocab_size)
        log("B sweep: %s; greedy outputs equal to A's: %s" % (headline(res["b_sweep"]), res["b_greedy_equal"]))
        B.stop()
    res["gpu_used_after_b_mib"] = gpu_used_mib()[0]
    t0 = time.monotonic()
    st, body, tw = http("POST", A.base + "/wake_up", key, timeout=300)
    res["wake_status"], res["wake_s"] = st, round(tw, 3)
    st, body, tf = http("POST", A.base + "/v1/completions", key,
                        {"model": a.model, "prompt": "hi", "max_tokens": 4, "temperature": 0}, timeout=120)
    res["wake_to_first_completion_s"] = round(time.monotonic() - t0, 3)
    res["gpu_used_woken_mib"] = gpu_used_mib()[0]
    log("wake_up: HTTP %s in %.3f s; first completion %s, %.3f s after the wake-up call"
        % (res["wake_status"], tw, st, res["wake_to_first_completion_s"]))
    res["a_greedy_equal_after_wake"] = greedy(A, a.model) == ref
    res["a_sweep_after_wake"] = sweep(A, a.model, levels, a.duration_s, a.vocab_size)
    log("A after wake: %s; greedy outputs equal: %s" % (headline(res["a_sweep_after_wake"]),
                                                         res["a_greedy_equal_after_wake"]))
    A.stop()
    return finish(res, a)


def finish(res, a):
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats import compare as sweep_compare
    rows = []
    for name, cand, base in (("B (no sleep mode) vs A (sleep mode)", "b_sweep", "a_sweep"),
                             ("A after wake vs A before sleep", "a_sweep_after_wake", "a_sweep")):
        if res.get(cand) and res.get(base):
            for r in sweep_compare.compare_levels(res[cand], res[base])["rows"]:
                if r["metric"] == "output_tok_s":
                    rows.append("%s, C=%d: output tok/s ratio %.3f [%.3f-%.3f] %s"
                                % (name, r["concurrency"], r["ratio"], r["ratio_ci"][0],
                                   r["ratio_ci"][1], r["verdict"]))
    res["comparisons"] = rows
    for r in rows:
        log(r)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
