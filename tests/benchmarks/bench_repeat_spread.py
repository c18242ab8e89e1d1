"""Repeat spread of one sweep level: run the same level N times in a row against a running
server and print each repeat's output tok/s (window and whole run), TTFT p50, the interval the
level states, the TCP connections the client opened and its GC pauses, then the spread
(max / min) of each figure over the repeats.

Used to find where the sweep's own repeat spread at concurrency 1 comes from (window edges,
connection reuse, GC, prompts). --collections selects which checkout's client runs (e.g. an
older branch's ``collections`` directory), so two clients can be compared on one server:

    python tests/benchmarks/bench_repeat_spread.py --base-url http://127.0.0.1:8000 \\
        --model tiny --concurrency 1 --repeats 5 --duration-s 5 [--collections DIR] \\
        [--param gc_during_level=true] [--json-out out.json]

Run it with a python that has aiohttp (the vLLM venv's).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spread(xs):
    xs = [x for x in xs if x]
    return max(xs) / min(xs) if xs else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("--collections", default=os.path.join(ROOT, "collections"))
    ap.add_argument("--param", action="append", default=[],
                    help="extra sweep parameter KEY=JSON_VALUE (repeatable)")
    ap.add_argument("--label", default="")
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.collections))
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import run_sweep
    extra = {}
    for kv in args.param:
        k, _sep, v = kv.partition("=")
        extra[k] = json.loads(v)
    rows = []
    for i in range(args.repeats):
        params = {"base_url": args.base_url, "model": args.model,
                  "levels": [args.concurrency], "input_len": args.input_len,
                  "output_len": args.output_len, "duration_s": args.duration_s,
                  "request_timeout_s": 120, "saturation_threshold": 0.1,
                  "stop_on_saturation": False, "endpoint": "completions",
                  "vocab_size": args.vocab_size}
        params.update(extra)
        lv = run_sweep(params)["levels"][0]
        run = lv.get("whole_run") or {}
        cl = lv.get("client") or {}
        prec = (lv.get("precision") or {}).get("output_tok_s") or {}
        row = {"repeat": i + 1, "output_tok_s": lv["output_tok_s"],
               "whole_run_tok_s": run.get("output_tok_s"),
               "ttft_p50_ms": lv["ttft_ms"]["p50"],
               "whole_run_ttft_median_ms": (run.get("ttft_ms") or {}).get("median"),
               "tpot_p50_ms": lv["tpot_ms"]["p50"],
               "ci_pct": prec.get("half_width_pct"), "window_s": lv["window_s"],
               "requests": lv["requests_total"],
               "connections_opened": cl.get("connections_opened"),
               "gc": cl.get("gc"), "lag_p99_ms": (cl.get("loop_lag_ms") or {}).get("p99"),
               "tokens_match": (lv.get("server_check") or {}).get("match")}
        rows.append(row)
        print("%s rep %d: %.1f tok/s window (+-%s%%), %s tok/s whole run, TTFT p50 %.2f ms, "
              "TPOT p50 %.2f ms, %d requests, %s connections, gc %s, lag p99 %s ms"
              % (args.label, i + 1, row["output_tok_s"],
                 "-" if row["ci_pct"] is None else "%.1f" % row["ci_pct"],
                 row["whole_run_tok_s"], row["ttft_p50_ms"], row["tpot_p50_ms"],
                 row["requests"], row["connections_opened"],
                 (row["gc"] or {}).get("collections"), row["lag_p99_ms"]), flush=True)
    summary = dict((k, spread([r[k] for r in rows])) for k in (
        "output_tok_s", "whole_run_tok_s", "ttft_p50_ms", "whole_run_ttft_median_ms",
        "tpot_p50_ms"))
    print("%s spread (max/min over %d repeats): %s" % (args.label, len(rows), ", ".join(
        "%s %.3f" % (k, v) for k, v in summary.items() if v)))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "spread": summary}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
