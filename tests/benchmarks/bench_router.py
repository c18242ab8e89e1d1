"""vLLM's router against direct access to one vLLM instance, side by side in one run: for each
concurrency C, the same sweep level (the collection's sweep client, closed loop, exact lengths)
runs straight at the instance and through a vllm-router in front of that one instance,
alternately (direct, router, direct, router, ... per repeat), and the ratios router / direct
of output tok/s and TTFT p50 are printed with the added TTFT in milliseconds.

    python tests/benchmarks/bench_router.py --router-bin VENV/bin/vllm-router \\
        --worker-url http://127.0.0.1:26410 --model tiny-llama --api-key KEY \\
        --levels 1,2,4,8,16,32,64 --duration-s 8 --repeats 2 [--json-out out.json]

The router is started here (loopback port --router-port, policy round_robin, its one worker)
and stopped at the end. Run it with a python that has aiohttp. Not a timed test: it prints
what it measured, nothing passes or fails on a number.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))


def wait_health(url, timeout_s=120):
    end = time.time() + timeout_s
    while time.time() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("no /health 200 from %s in %d s" % (url, timeout_s))


def level(run_sweep, url, args, c):
    params = {"base_url": url, "model": args.model, "levels": [c],
              "input_len": args.input_len, "output_len": args.output_len,
              "duration_s": args.duration_s, "request_timeout_s": 300,
              "saturation_threshold": 0.1, "stop_on_saturation": False,
              "endpoint": "completions", "api_key": args.api_key or None}
    lv = run_sweep(params)["levels"][0]
    return {"output_tok_s": lv["output_tok_s"], "ttft_p50_ms": lv["ttft_ms"]["p50"],
            "requests_ok": lv.get("requests_ok"), "requests_failed": lv.get("requests_failed"),
            "flags": lv.get("flags") or []}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router-bin", required=True)
    ap.add_argument("--worker-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default=os.environ.get("VD_BENCH_API_KEY", ""))
    ap.add_argument("--router-port", type=int, default=26490)
    ap.add_argument("--levels", default="1,2,4,8,16,32,64")
    ap.add_argument("--duration-s", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import run_sweep

    router_url = "http://127.0.0.1:%d" % args.router_port
    proc = subprocess.Popen([args.router_bin, "--host", "127.0.0.1", "--port", str(args.router_port),
                             "--worker-urls", args.worker_url, "--policy", "round_robin",
                             "--prometheus-host", "127.0.0.1",
                             "--prometheus-port", str(args.router_port + 1),
                             "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_health(router_url)
        wait_health(args.worker_url)
        for c in [int(x) for x in args.levels.split(",")]:
            runs = {"direct": [], "router": []}
            for _rep in range(args.repeats):
                for name, url in (("direct", args.worker_url), ("router", router_url)):
                    runs[name].append(level(run_sweep, url, args, c))
            med = dict((name, dict((k, statistics.median(r[k] for r in rs))
                                   for k in ("output_tok_s", "ttft_p50_ms")))
                       for name, rs in runs.items())
            failed = sum((r["requests_failed"] or 0) for rs in runs.values() for r in rs)
            row = {"concurrency": c, "direct": med["direct"], "router": med["router"],
                   "tok_s_ratio": med["router"]["output_tok_s"] / med["direct"]["output_tok_s"],
                   "ttft_p50_ratio": med["router"]["ttft_p50_ms"] / med["direct"]["ttft_p50_ms"],
                   "ttft_p50_added_ms": med["router"]["ttft_p50_ms"] - med["direct"]["ttft_p50_ms"],
                   "requests_failed": failed,
                   "flags": sorted(set(f for rs in runs.values() for r in rs for f in r["flags"])),
                   "runs": runs}
            rows.append(row)
            print("C=%-3d direct %8.1f tok/s TTFT p50 %8.2f ms | router %8.1f tok/s TTFT p50 "
                  "%8.2f ms | tok/s x%.3f, TTFT x%.3f (%+.2f ms), failed %d %s"
                  % (c, med["direct"]["output_tok_s"], med["direct"]["ttft_p50_ms"],
                     med["router"]["output_tok_s"], med["router"]["ttft_p50_ms"],
                     row["tok_s_ratio"], row["ttft_p50_ratio"], row["ttft_p50_added_ms"],
                     failed, ",".join(row["flags"])), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
