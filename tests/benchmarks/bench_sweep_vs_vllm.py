"""Accuracy and cost benchmark: our sweep (vllm_sweep's client) against `vllm bench serve`.

Two long-lived worker processes run under the vLLM venv's python (--vllm-python), each started
once, so that neither tool pays its interpreter start and imports per run:

* "ours" imports plugins/module_utils/sweep/vllm_sweep.py (as
  ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep, through the
  repository's collections path) and runs ``run_sweep`` for one level per job;
* "vllm" imports ``vllm.benchmarks.serve`` once and calls its ``main(args)`` per job (random
  dataset, --ignore-eos, --request-rate inf, --max-concurrency C, a fresh --seed per run so
  prefix caching cannot flatter a repeat, --save-result into the work directory).

The orchestrator (this script, stdlib only) sends one JSON job per line on a worker's stdin
and reads one JSON result line from its stdout; workers log to stderr (children.log in the
work directory). Every result carries the worker's own CPU for that job
(getrusage(RUSAGE_SELF) user + sys, all threads) and its wall time; each worker's start-up
CPU (interpreter + imports) and its first, untimed warm-up job are recorded separately.

Per concurrency level the pair [ours, vllm] runs --reps times, alternating which goes first
(O V, V O, O V, ...), both at the same C and input/output lengths. `vllm bench serve` gets
max(8 C, the previous ours run's window request count) prompts, rounded up to a multiple of C
(equal-length requests then run in full waves, so its ramp-up and tail are short). The
server's /metrics (vllm:generation_tokens_total) is read before and after every run.

Definitions: by default (--definition whole_run) our figures are the level's ``whole_run``
block, computed the way `vllm bench serve` computes its own (all requests of the level, first
send to last completion, TTFT/TPOT medians), and vllm bench gets as many prompts as our
previous run sent in all (``requests_total``): the like-for-like comparison.
--definition steady_state compares our steady-state window (``output_tok_s``, ``ttft_ms.p50``)
with vllm bench's whole-run figures instead (what the sweep headline reports; not the same
definition, so ramp-up and drain show up as a difference). The report says which.

Prompts (--prompt-format, default text): `vllm bench serve`'s random dataset sends text of
input_len tokens (special tokens counted), which the server tokenizes inside every request's
time to first token; our client sends the same kind with ``prompt_format: text``, or token-id
lists with ``token_ids`` (the server tokenizes nothing), or both (``both``: at every level the
pairs of each format in turn, text first; each format is a section of the report). Per run the
report shows the prompt tokens each tool sent: the server's ``vllm:prompt_tokens_total`` delta
per request (delta x output_len / output-token delta, exact whatever extra requests the tool
sent), vllm bench's ``total_input_tokens``, and our requests whose usage.prompt_tokens was not
input_len.

Load shape (unless --no-load-shape): per run, from every request's send time, TTFT and end
(vllm bench: --save-detailed, its start_times, ttfts and latencies; ours: the module's request
log), the share of requests sent within 20 ms of at least C/2 others ("wave": lock-step waves
of equal-length requests score near 1, drifting closed loops near 0), the mean number in
flight over the run, and TTFT p50/p90. Both tools then write that per-request detail inside
their measured CPU.

Reported per level: each tool's median over reps of output tok/s, TTFT p50 and TPOT p50;
ratio of the medians (ours / vllm); each tool's spread (max / min over its reps); the paired
ratio (median over reps of ours_i / vllm_i, adjacent runs, so server drift cancels); token
totals against the server's deltas; client CPU ms per 1,000 output tokens (the worker's CPU
delta over the job / the server's output-token delta over the job), median over reps, and
its ratio; levels where ours flagged client_limited. PASS/FAIL per level: paired tok/s ratio
within 3 %, paired TTFT p50 ratio within 3 %, CPU ratio <= 0.5.

    python tests/benchmarks/bench_sweep_vs_vllm.py --vllm-python /opt/vd-dev/vllm/bin/python \\
        --model-dir /tmp/tiny --levels 1,4,16 --input-len 64 --output-len 64 --duration-s 15

Starts its own server on --port unless --base-url is given, and stops it at the end.
--time-budget-s stops starting new reps/levels when the rest of the budget would not fit the
next pair, and still prints and writes what was measured; SIGTERM (``timeout``) does the same.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

SCRIPT = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
COLLECTIONS = os.path.join(ROOT, "collections")  # the in-repo collections path

TOOLS = ("ours", "vllm")
TOLERANCE = 0.03        # tok/s and TTFT p50: |ours / vllm - 1| <= 3 %
CPU_RATIO_MAX = 0.5     # our client CPU per token at most half of vllm bench's
METRICS = ("output_tok_s", "ttft_p50_ms", "tpot_p50_ms", "cpu_ms_per_1k", "cpu_ms_per_1k_net")
BUDGET_RESERVE_S = 20.0  # kept back for stopping workers/server and printing
DEFINITIONS = ("whole_run", "steady_state")
PROMPT_FORMAT_CHOICES = ("text", "token_ids", "both")
WAVE_WINDOW_S = 0.02
DEFINITION_TEXT = {
    "whole_run": "whole_run: both tools' figures over all requests, first send to last "
                 "completion (vllm bench serve's definition)",
    "steady_state": "steady_state: our steady-state window against vllm bench's whole run "
                    "(NOT the same definition: ramp-up and drain differ)",
}


# ---------------------------------------------------------------------------------------
# pure logic (tests/unit/test_bench_compare.py)
# ---------------------------------------------------------------------------------------
def job_order(reps):
    """Order of the two tools in each rep: O V, V O, O V, ..."""
    return [("ours", "vllm") if i % 2 == 0 else ("vllm", "ours") for i in range(reps)]


def choose_num_prompts(concurrency, prev_ours=None, duration_s=None, definition="steady_state"):
    """--num-prompts for `vllm bench serve` at this concurrency.

    With the whole_run definition, as many as our previous run sent in all
    (``requests_total``: warm-up, window and drain). Otherwise as many as it completed in its
    window (``requests_in_window``), else an estimate from its request rate over
    ``duration_s``; at least 8 * C; rounded up to a multiple of C so that the last wave of
    equal-length requests is full.
    """
    n = 0
    if prev_ours:
        if definition == "whole_run" and prev_ours.get("requests_total"):
            n = int(prev_ours["requests_total"])
        elif prev_ours.get("requests_in_window"):
            n = int(prev_ours["requests_in_window"])
        elif prev_ours.get("request_s") and duration_s:
            n = int(round(prev_ours["request_s"] * duration_s))
    n = max(8 * concurrency, n)
    return -(-n // concurrency) * concurrency


def median(values):
    xs = [v for v in values if v is not None]
    return statistics.median(xs) if xs else None


def spread(values):
    """max / min over the values (None when fewer than one positive value)."""
    xs = [v for v in values if v is not None]
    if not xs or min(xs) <= 0:
        return None
    return max(xs) / min(xs)


def ratio(a, b):
    return None if a is None or not b else a / b


def cpu_ms_per_1k(cpu_s, tokens):
    return None if cpu_s is None or not tokens else cpu_s * 1e6 / tokens


def server_delta(before, after, key="output_tokens"):
    if not before or not after or before.get(key) is None or after.get(key) is None:
        return None
    return int(round(after[key] - before[key]))


def ours_record(result, cpu_s, wall_s, before=None, after=None, definition="steady_state"):
    """One run of our client, from run_sweep's result for a single level; the compared
    figures follow ``definition`` (whole_run: the level's whole_run block; steady_state: its
    window), the other definition's are kept as window_* / whole_run_*."""
    lv = result["levels"][0]
    sc = lv.get("server_check") or {}
    cl = lv.get("client") or {}
    srv = server_delta(before, after)
    client_tokens = sc.get("client_output_tokens")
    inlen = lv.get("input_length") or {}
    run = lv.get("whole_run") or {}
    window = {"output_tok_s": lv.get("output_tok_s"),
              "ttft_p50_ms": (lv.get("ttft_ms") or {}).get("p50"),
              "tpot_p50_ms": (lv.get("tpot_ms") or {}).get("p50")}
    whole = {"output_tok_s": run.get("output_tok_s"),
             "ttft_p50_ms": (run.get("ttft_ms") or {}).get("median"),
             "tpot_p50_ms": (run.get("tpot_ms") or {}).get("median")}
    used = whole if definition == "whole_run" else window
    return {
        "tool": "ours", "ok": not lv.get("aborted"), "error": lv.get("aborted"),
        "definition": definition,
        "output_tok_s": used["output_tok_s"],
        "ttft_p50_ms": used["ttft_p50_ms"],
        "tpot_p50_ms": used["tpot_p50_ms"],
        "window_output_tok_s": window["output_tok_s"],
        "window_ttft_p50_ms": window["ttft_p50_ms"],
        "whole_run_output_tok_s": whole["output_tok_s"],
        "whole_run_ttft_p50_ms": whole["ttft_p50_ms"],
        "output_tok_s_ci_pct": ((lv.get("precision") or {}).get("output_tok_s") or {}).get(
            "half_width_pct"),
        "requests_total": lv.get("requests_total"),
        "client_tokens": client_tokens, "server_tokens": srv,
        "cpu_s": cpu_s, "wall_s": wall_s,
        "cpu_ms_per_1k": cpu_ms_per_1k(cpu_s, srv if srv else client_tokens),
        "client_limited": bool(cl.get("client_limited")),
        "client_limited_reasons": cl.get("client_limited_reasons") or [],
        "client_cpu_s_level": cl.get("cpu_s_level"),
        "requests_in_window": lv.get("requests_in_window"),
        "requests_failed": lv.get("requests_failed"),
        "request_s": lv.get("request_s"), "window_s": lv.get("window_s"),
        "seed": (result.get("parameters") or {}).get("seed"),
        "event_loop": (result.get("client") or {}).get("event_loop"),
        "stream_transport": (result.get("client") or {}).get("stream_transport"),
        "prompt_format": (result.get("server") or {}).get("prompt_format"),
        "client_prompt_tokens": sc.get("client_prompt_tokens"),
        "server_prompt_tokens": server_delta(before, after, "prompt_tokens"),
        "prompt_mismatched": inlen.get("mismatched"),
    }


def vllm_record(res, cpu_s, wall_s, before=None, after=None, num_prompts=None):
    """One run of `vllm bench serve`, from its saved result JSON."""
    srv = server_delta(before, after)
    client_tokens = res.get("total_output_tokens")
    failed = res.get("failed") or 0
    return {
        "tool": "vllm", "ok": not failed and bool(res.get("completed")),
        "error": "%d requests failed" % failed if failed else None,
        "output_tok_s": res.get("output_throughput"),
        "ttft_p50_ms": res.get("median_ttft_ms"),
        "tpot_p50_ms": res.get("median_tpot_ms"),
        "client_tokens": client_tokens, "server_tokens": srv,
        "cpu_s": cpu_s, "wall_s": wall_s,
        "cpu_ms_per_1k": cpu_ms_per_1k(cpu_s, srv if srv else client_tokens),
        "num_prompts": num_prompts, "completed": res.get("completed"),
        "duration_s": res.get("duration"),
        "prompt_format": "text",
        "client_prompt_tokens": res.get("total_input_tokens"),
        "server_prompt_tokens": server_delta(before, after, "prompt_tokens"),
    }


def prompt_formats(choice):
    """The formats run for --prompt-format (both: text, then token_ids)."""
    return ["text", "token_ids"] if choice == "both" else [choice]


def load_shape(starts, ends, ttfts, concurrency, window_s=WAVE_WINDOW_S):
    """How a run offered its load, from its requests' send times, end times and TTFTs (s).

    wave: share of requests sent within ``window_s`` of at least C/2 other requests' sends;
    in_flight_mean: sum of the requests' durations / (last end - first send); ttft p50/p90
    (ms, numpy's linear percentiles) over the requests that have one; starts_span_s.
    """
    n = len(starts)
    if not n:
        return {"requests": 0, "wave": None, "in_flight_mean": None, "ttft_p50_ms": None,
                "ttft_p90_ms": None, "span_s": None}
    xs = sorted(starts)
    need = concurrency / 2.0
    lo = hi = 0
    waved = 0
    for i, t in enumerate(xs):
        while xs[lo] < t - window_s:
            lo += 1
        while hi + 1 < n and xs[hi + 1] <= t + window_s:
            hi += 1
        if hi - lo >= need:  # others within the window: (hi - lo + 1) - 1
            waved += 1
    pairs = [(a, b) for a, b in zip(starts, ends) if a is not None and b is not None]
    span = (max(b for _a, b in pairs) - min(a for a, _b in pairs)) if pairs else None
    busy = sum(b - a for a, b in pairs)
    tt = sorted(t * 1000.0 for t in ttfts if t is not None and t > 0)

    def pct(p):
        if not tt:
            return None
        h = (len(tt) - 1) * p / 100.0
        f = int(h)
        return tt[f] + (tt[min(f + 1, len(tt) - 1)] - tt[f]) * (h - f)
    return {"requests": n, "wave": round(waved / float(n), 4),
            "in_flight_mean": round(busy / span, 3) if span else None,
            "ttft_p50_ms": None if pct(50) is None else round(pct(50), 3),
            "ttft_p90_ms": None if pct(90) is None else round(pct(90), 3),
            "span_s": None if span is None else round(span, 3)}


def load_shape_of_log(path, concurrency):
    """load_shape of one run of ours from the module's request log (JSON lines)."""
    starts, ends, ttfts = [], [], []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            starts.append(r["start_s"])
            ends.append(r["end_s"])
            ttfts.append(None if r.get("ttft_ms") is None or r.get("error")
                         else r["ttft_ms"] / 1000.0)
    return load_shape(starts, ends, ttfts, concurrency)


def load_shape_of_vllm(res, concurrency):
    """load_shape of one run of vllm bench from its --save-detailed result (start_times,
    ttfts, latencies; an older result without latencies: TTFT + the ITLs)."""
    starts = res.get("start_times") or []
    ttfts = res.get("ttfts") or []
    lat = res.get("latencies")
    itls = res.get("itls") or []
    errors = res.get("errors") or []
    if not starts or len(ttfts) != len(starts):
        return None
    ends, tt = [], []
    for i, st in enumerate(starts):
        failed = i < len(errors) and errors[i]
        if lat and i < len(lat) and lat[i]:
            ends.append(st + lat[i])
        else:
            ends.append(st + (ttfts[i] or 0.0) + sum(itls[i] if i < len(itls) else []))
        tt.append(None if failed else ttfts[i])
    return load_shape(starts, ends, tt, concurrency)


def prompt_per_request(prompt_delta, output_delta, output_len):
    """Prompt tokens per request from the server's counter deltas: every request generates
    exactly output_len tokens, so requests = output delta / output_len."""
    if prompt_delta is None or not output_delta or not output_len:
        return None
    return prompt_delta * float(output_len) / output_delta


def aggregate_level(runs):
    """Medians, ratios, spreads and paired ratios over a level's runs.

    ``runs``: records (ours_record / vllm_record, plus "rep") of one level. Failed runs are
    left out; medians use every good run of a tool, paired ratios only reps where both tools
    have a good run.
    """
    good = [r for r in runs if r.get("ok")]
    by_tool = dict((t, [r for r in good if r["tool"] == t]) for t in TOOLS)
    reps = sorted(set(r["rep"] for r in good))
    pairs = []
    for rep in reps:
        o = [r for r in by_tool["ours"] if r["rep"] == rep]
        v = [r for r in by_tool["vllm"] if r["rep"] == rep]
        if o and v:
            pairs.append((o[0], v[0]))
    out = {"runs": dict((t, len(by_tool[t])) for t in TOOLS), "pairs": len(pairs),
           "failed_runs": len(runs) - len(good)}
    for t in TOOLS:
        out[t] = {}
        for m in METRICS:
            vals = [r.get(m) for r in by_tool[t]]
            out[t][m] = {"median": median(vals), "spread": spread(vals), "values": vals}
    out["ratio"] = dict((m, ratio(out["ours"][m]["median"], out["vllm"][m]["median"]))
                        for m in METRICS)
    out["paired_ratio"] = {}
    for m in METRICS:
        rs = [ratio(o.get(m), v.get(m)) for o, v in pairs]
        out["paired_ratio"][m] = median(rs)
        out["paired_ratio"][m + "_values"] = rs
    tokens = {}
    for t in TOOLS:
        rs = [r for r in runs if r["tool"] == t]
        known = [r for r in rs if r.get("server_tokens") is not None]
        tokens[t] = {
            "client": sum(r.get("client_tokens") or 0 for r in rs),
            "server": sum(r["server_tokens"] for r in known) if known else None,
            "match": (all(r.get("client_tokens") == r["server_tokens"] for r in known)
                      if known and len(known) == len(rs) else None),
            "diffs": [None if r.get("server_tokens") is None
                      else (r.get("client_tokens") or 0) - r["server_tokens"] for r in rs],
        }
    out["tokens"] = tokens
    out["client_limited"] = [{"rep": r["rep"], "reasons": r.get("client_limited_reasons") or []}
                             for r in runs if r["tool"] == "ours" and r.get("client_limited")]
    return out


def _within(r, tolerance):
    return None if r is None else abs(r - 1.0) <= tolerance + 1e-12


def verdicts(agg, tolerance=TOLERANCE, cpu_ratio_max=CPU_RATIO_MAX):
    """PASS/FAIL per criterion from aggregate_level's result (pass None: not measurable).

    tok/s and TTFT p50 are judged on the paired ratio (adjacent runs); ``noisy`` marks a
    criterion where either tool's own spread over its reps exceeds the tolerance, i.e. the
    server moved more between runs than the difference being tested. CPU is judged on the
    ratio of the medians of CPU ms per 1,000 output tokens.
    """
    out = {}
    for key, m in (("tok_s", "output_tok_s"), ("ttft_p50", "ttft_p50_ms")):
        paired = agg["paired_ratio"][m]
        spreads = [agg[t][m]["spread"] for t in TOOLS]
        out[key] = {"criterion": "within %g %%" % (tolerance * 100), "paired_ratio": paired,
                    "ratio_of_medians": agg["ratio"][m], "pass": _within(paired, tolerance),
                    "spread_ours": spreads[0], "spread_vllm": spreads[1],
                    "noisy": any(s is not None and s > 1.0 + tolerance for s in spreads)}
    r = agg["ratio"]["cpu_ms_per_1k"]
    out["cpu"] = {"criterion": "ours / vllm <= %g" % cpu_ratio_max, "ratio_of_medians": r,
                  "paired_ratio": agg["paired_ratio"]["cpu_ms_per_1k"],
                  "pass": None if r is None else r <= cpu_ratio_max + 1e-12}
    return out


def estimate_pair_s(level_pair_walls, last_pair_wall, duration_s):
    """Seconds the next [ours, vllm] pair will probably take.

    The slowest pair so far at this level; at a new level, 1.25 x the last pair of the
    previous level (more concurrency: longer warm-up and drain) but at least
    2 * duration_s + 20 s; before any pair, 2 * (1.5 * duration_s + 10 s).
    """
    if level_pair_walls:
        return max(level_pair_walls)
    if last_pair_wall:
        return max(1.25 * last_pair_wall, 2 * duration_s + 20.0)
    return 2 * (1.5 * duration_s + 10.0)


def pair_fits(remaining_s, estimate_s, reserve_s=BUDGET_RESERVE_S):
    """True when no budget is set or the next pair fits in what is left of it."""
    return remaining_s is None or remaining_s - reserve_s >= estimate_s


# ---------------------------------------------------------------------------------------
# worker side (runs under the vLLM venv's python: `python this_script --worker KIND ...`)
# ---------------------------------------------------------------------------------------
def self_cpu():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def serve_jobs(handler, rfile, wfile, cpu=self_cpu, clock=time.perf_counter):
    """Read JSON jobs (one a line) from rfile, answer one JSON line each on wfile.

    The answer: {"id", "ok", "result" | "error", "cpu_s", "wall_s"}, where cpu_s is this
    process's CPU (user + sys, all threads) over the job. Returns at end of input.
    """
    while True:
        line = rfile.readline()
        if not line:
            return
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        res = {"id": job.get("id")}
        c0, t0 = cpu(), clock()
        try:
            res["result"] = handler(job)
            res["ok"] = True
        except (Exception, SystemExit) as e:  # argparse exits on a bad argument
            traceback.print_exc(file=sys.stderr)
            sys.stderr.flush()
            res["ok"] = False
            res["error"] = "%s: %s" % (type(e).__name__, e)
        res["cpu_s"] = cpu() - c0
        res["wall_s"] = clock() - t0
        wfile.write(json.dumps(res, default=str) + "\n")
        wfile.flush()


def _ours_handler(collections_path):
    sys.path.insert(0, collections_path)
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep import engine as sc
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import run_sweep
    info = {"aiohttp": getattr(sc.aiohttp, "__version__", None)}

    def handler(job):
        return run_sweep(job["params"], request_log_path=job.get("request_log_path"))
    return handler, info


def _vllm_handler():
    import gc
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.benchmarks.serve import add_cli_args, main
    import vllm
    info = {"vllm": getattr(vllm, "__version__", None)}

    def handler(job):
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args(job["argv"])
        try:
            res = main(args)
        finally:
            # main() freezes the GC heap (gc.freeze) for its run; in a long-lived process
            # that would pile up run after run.
            gc.unfreeze()
        if isinstance(res, dict):  # the saved file is read by the orchestrator
            return dict((k, v) for k, v in res.items() if not isinstance(v, (list, dict)))
        return None
    return handler, info


def _selftest_handler():
    """For the unit tests: prints to stdout like vllm bench does, and echoes the job."""
    def handler(job):
        print("noise on stdout that must not reach the orchestrator")
        if job.get("sleep"):
            time.sleep(job["sleep"])
        if job.get("raise"):
            raise ValueError(job["raise"])
        return {"echo": job.get("payload"), "pid": os.getpid()}
    return handler, {}


def worker_main(argv):
    """Worker process: import the tool once, then serve jobs until stdin closes."""
    t0 = time.time()
    kind = argv[0]
    # keep the real stdout for results only; everything printed (by vllm bench, by C code)
    # goes to stderr
    real_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    here = os.path.dirname(SCRIPT)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    if kind == "ours":
        handler, info = _ours_handler(argv[1])
    elif kind == "vllm":
        handler, info = _vllm_handler()
    elif kind == "selftest":
        handler, info = _selftest_handler()
    else:
        raise SystemExit("unknown worker kind %r" % kind)
    ready = {"ready": True, "kind": kind, "pid": os.getpid(), "python": sys.executable,
             "startup_cpu_s": self_cpu(), "import_wall_s": time.time() - t0,
             "ready_at": time.time()}
    ready.update(info)
    real_out.write(json.dumps(ready) + "\n")
    real_out.flush()
    serve_jobs(handler, sys.stdin, real_out)
    return 0


# ---------------------------------------------------------------------------------------
# orchestrator side (stdlib only)
# ---------------------------------------------------------------------------------------
class WorkerError(Exception):
    pass


class Interrupted(BaseException):
    """SIGTERM/SIGINT: stop measuring, clean up, report what was measured."""


def _interrupt(signum, frame):
    raise Interrupted("stopped by signal %d" % signum)


class Worker(object):
    """A worker process speaking one JSON line per job on stdin/stdout."""

    def __init__(self, name, cmd, log, env=None):
        self.name = name
        self.t0 = time.time()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=log, start_new_session=True, env=env)
        self.buf = b""
        self.seq = 0
        self.ready = None

    def _readline(self, timeout):
        fd = self.proc.stdout.fileno()
        deadline = None if timeout is None else time.time() + timeout
        while True:
            if b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    msg = json.loads(line.decode("utf-8", "replace"))
                except ValueError:
                    msg = None
                if isinstance(msg, dict):
                    return msg
                sys.stderr.write("%s worker stdout (ignored): %r\n" % (self.name, line[:200]))
                continue
            left = None if deadline is None else deadline - time.time()
            if left is not None and left <= 0:
                raise WorkerError("%s worker: no answer within %.0f s" % (self.name, timeout))
            r, _unused, _unused2 = select.select([fd], [], [], 1.0 if left is None else min(left, 1.0))
            if r:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise WorkerError("%s worker exited (rc %s)"
                                      % (self.name, self.proc.wait()))
                self.buf += chunk

    def wait_ready(self, timeout):
        self.ready = self._readline(timeout)
        # from Popen to the worker's ready line (not to when it was read: the orchestrator
        # may have been waiting for the server meanwhile)
        self.ready["startup_wall_s"] = self.ready.get("ready_at", time.time()) - self.t0
        return self.ready

    def call(self, job, timeout):
        self.seq += 1
        job = dict(job, id=self.seq)
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError("%s worker: cannot send a job (rc %s): %s"
                              % (self.name, self.proc.poll(), e))
        msg = self._readline(timeout)
        if msg.get("id") != self.seq:
            raise WorkerError("%s worker answered job %r, expected %d"
                              % (self.name, msg.get("id"), self.seq))
        return msg

    def close(self, grace_s=3.0):
        """Close stdin (an idle worker exits), then kill its process group."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        return self.proc.returncode


def scrape(metrics_url):
    """Server counters from /metrics, or None when unreadable."""
    if COLLECTIONS not in sys.path:
        sys.path.insert(0, COLLECTIONS)
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.prometheus import (
        server_counters)
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as r:
            return server_counters(r.read().decode())
    except (OSError, ValueError):
        return None


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


def start_paced_stub(args):
    """(url, processes) of the client ceiling's stub, paced: a known TTFT (--stub-ttft-ms)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    from bench_client_ceiling import start_stub
    return start_stub(args.stub_processes, ttft_s=args.stub_ttft_ms / 1000.0,
                      itl_s=args.stub_itl_ms / 1000.0)


def stub_calibration(args, base, report):
    """The paced stub's own first-token delay (mean over every request it answered, measured
    in the stub from the request body's arrival to the first token's write) and, per level and
    tool, the median of the runs' TTFT p50 minus it: each tool's bias."""
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError as e:
        return {"error": str(e)}
    vals = {}
    for line in text.splitlines():
        if line.startswith("stub_first_token_seconds_"):
            k, _sep, v = line.partition(" ")
            vals[k] = float(v)
    n = vals.get("stub_first_token_seconds_count") or 0
    served = (vals.get("stub_first_token_seconds_sum", 0.0) / n * 1000.0) if n else None
    levels = []
    for level in report.get("levels") or []:
        row = {"concurrency": level["concurrency"], "prompt_format": level.get("prompt_format")}
        for tool in TOOLS:
            xs = sorted(r["ttft_p50_ms"] for r in level["runs"]
                        if r.get("ok") and r["tool"] == tool and r.get("ttft_p50_ms") is not None)
            med = xs[len(xs) // 2] if xs else None
            row[tool] = {"ttft_p50_ms": med,
                         "bias_ms": None if med is None or served is None else med - served}
        levels.append(row)
    return {"ttft_set_ms": args.stub_ttft_ms, "itl_set_ms": args.stub_itl_ms,
            "requests": int(n), "first_token_served_ms": served, "levels": levels}


def format_stub(cal):
    if not cal:
        return []
    if cal.get("error"):
        return ["", "paced stub: no /metrics (%s)" % cal["error"]]
    out = ["", "paced stub (calibration, not vLLM): first token set %.1f ms after each request, "
               "measured in the stub %.3f ms (mean of %d requests); tokens every %.1f ms" % (
                   cal["ttft_set_ms"], cal["first_token_served_ms"] or 0.0, cal["requests"],
                   cal["itl_set_ms"]),
           "bias = the tool's TTFT p50 (median over its runs) - the stub's measured delay",
           "%5s %-9s | %12s %10s | %12s %10s" % (
               "C", "ours sent", "TTFT us", "bias us", "TTFT vl", "bias vl")]

    def f(x):
        return "-" if x is None else "%.3f" % x
    for row in cal["levels"]:
        o, v = row.get("ours") or {}, row.get("vllm") or {}
        out.append("%5d %-9s | %12s %10s | %12s %10s" % (
            row["concurrency"], row.get("prompt_format") or "", f(o.get("ttft_p50_ms")),
            f(o.get("bias_ms")),
            f(v.get("ttft_p50_ms")), f(v.get("bias_ms"))))
    return out


def stop_server(server):
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    except OSError:
        pass


def ours_params(args, base, concurrency, vocab_size, seed, **over):
    p = dict(base_url=base, model=args.model, levels=[concurrency], input_len=args.input_len,
             output_len=args.output_len, duration_s=args.duration_s, endpoint="completions",
             request_timeout_s=600, saturation_threshold=0.1, stop_on_saturation=False,
             seed=seed)
    if vocab_size:
        p["vocab_size"] = vocab_size
    if getattr(args, "chunk_usage", False):
        p["chunk_usage"] = True
    if getattr(args, "event_loop", None):
        p["event_loop"] = args.event_loop
    if getattr(args, "stream_transport", None):
        p["stream_transport"] = args.stream_transport
    p["prompt_format"] = getattr(args, "prompt_format", None) or "token_ids"
    if p["prompt_format"] == "both":
        p["prompt_format"] = "text"
    p.update(over)
    return p


def vllm_argv(args, base, concurrency, num_prompts, seed, result_dir, result_filename):
    detail = ["--save-detailed"] if getattr(args, "load_shape", False) else []
    return detail + [
        "--backend", "vllm", "--base-url", base, "--endpoint", "/v1/completions",
        "--model", args.model, "--tokenizer", args.model_dir,
        "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--ignore-eos",
        "--temperature", "0", "--request-rate", "inf", "--disable-tqdm",
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--seed", str(seed), "--save-result", "--result-dir", result_dir,
        "--result-filename", result_filename]


class Bench(object):
    """State of one comparison run; ``report`` is what gets printed and written."""

    def __init__(self, args, base, work, log, deadline):
        self.args, self.base, self.work, self.log = args, base, work, log
        self.deadline = deadline
        self.metrics_url = base + "/metrics"
        self.workers = {}
        self.vocab_size = args.vocab_size
        self.rng = random.SystemRandom()
        self.fixed_cpu = {}
        self.report = {"args": vars(args), "base_url": base, "work_dir": work,
                       "workers": {}, "levels": [], "stopped": None}

    def remaining(self):
        return None if self.deadline is None else self.deadline - time.time()

    def job_timeout(self):
        rem = self.remaining()
        cap = 10 * self.args.duration_s + 600
        return cap if rem is None else max(1.0, min(cap, rem - 5.0))

    def start_workers(self):
        py = self.args.vllm_python
        self.workers["ours"] = Worker("ours", [py, SCRIPT, "--worker", "ours", COLLECTIONS],
                                      self.log)
        self.workers["vllm"] = Worker("vllm", [py, SCRIPT, "--worker", "vllm"], self.log)

    def wait_workers(self):
        for name in TOOLS:
            rem = self.remaining()
            ready = self.workers[name].wait_ready(600 if rem is None else max(1.0, rem - 5))
            self.report["workers"][name] = {"ready": ready}
            print("%s worker ready: start-up (interpreter + imports) %.2f CPU-s, %.1f s wall"
                  % (name, ready["startup_cpu_s"], ready["startup_wall_s"]), flush=True)

    def run_tool(self, tool, c, rep, prev_ours, fmt=None):
        """One run of one tool; returns its record (with "rep", "concurrency" and, for ours,
        the prompt format ``fmt``)."""
        fmt = fmt or prompt_formats(self.args.prompt_format)[0]
        seed = self.rng.randrange(1, 2 ** 31)
        before = scrape(self.metrics_url)
        log_path = None
        if tool == "ours":
            job = {"params": ours_params(self.args, self.base, c, self.vocab_size, seed,
                                         prompt_format=fmt)}
            if self.args.load_shape:
                log_path = os.path.join(self.work, "ours-c%d-r%d-%s.jsonl" % (c, rep, fmt))
                job["request_log_path"] = log_path
            n = None
        else:
            n = choose_num_prompts(c, prev_ours, self.args.duration_s, self.args.definition)
            fname = "vllm-c%d-r%d-%s.json" % (c, rep, fmt)
            job = {"argv": vllm_argv(self.args, self.base, c, n, seed, self.work, fname)}
        msg = self.workers[tool].call(job, self.job_timeout())
        after = scrape(self.metrics_url)
        if not msg.get("ok"):
            rec = {"tool": tool, "ok": False, "error": msg.get("error"), "cpu_s": msg["cpu_s"],
                   "wall_s": msg["wall_s"], "server_tokens": server_delta(before, after),
                   "client_tokens": None, "num_prompts": n}
        elif tool == "ours":
            rec = ours_record(msg["result"], msg["cpu_s"], msg["wall_s"], before, after,
                              self.args.definition)
            if log_path and os.path.exists(log_path):
                rec["load_shape"] = load_shape_of_log(log_path, c)
        else:
            path = os.path.join(self.work, fname)
            if os.path.exists(path):
                with open(path) as f:
                    res = json.load(f)
            else:
                res = msg.get("result") or {}
            rec = vllm_record(res, msg["cpu_s"], msg["wall_s"], before, after, n)
            rec["seed"] = seed
            if self.args.load_shape:
                rec["load_shape"] = load_shape_of_vllm(res, c)
        rec.update(rep=rep, concurrency=c, format=fmt)
        rec["prompt_per_request"] = prompt_per_request(
            server_delta(before, after, "prompt_tokens"), rec.get("server_tokens"),
            self.args.output_len)
        if rec.get("ok"):
            rec["cpu_ms_per_1k_net"] = cpu_ms_per_1k(
                rec["cpu_s"] - self.fixed_cpu.get((tool, fmt), self.fixed_cpu.get(tool, 0.0)),
                rec.get("server_tokens") or rec.get("client_tokens"))
        return rec

    def warm_up(self):
        """Two small jobs per worker before the levels, both left out of the per-run CPU.

        The first loads lazily imported code (the tokenizer, transformers) and, without
        --vocab-size, learns the vocabulary for our client. The second, identical, measures
        the tool's fixed cost per run in a warm process (ours: preflight, session, one
        request; vllm bench: tokenizer load, dataset, prompt alignment, one request); the
        "net" CPU columns subtract it.
        """
        formats = prompt_formats(self.args.prompt_format)
        # token_ids first: its preflight learns the vocabulary (without --vocab-size) for the
        # token_ids runs; text runs do not need it
        order = sorted(formats, key=lambda f: f != "token_ids")

        def ours(fmt):
            return {"params": ours_params(self.args, self.base, 1, self.vocab_size, 1,
                                          duration_s=0.001, min_requests=1, warmup_requests=0,
                                          prompt_format=fmt)}

        def vllm(_fmt):
            return {"argv": vllm_argv(self.args, self.base, 1, 1, 1, self.work,
                                      "vllm-warmup.json")}
        jobs = {"ours": ours, "vllm": vllm}
        for name in TOOLS:
            w = self.report["workers"][name]
            for fmt in (order if name == "ours" else order[:1]):
                for phase in ("warmup", "fixed"):
                    before = scrape(self.metrics_url)
                    msg = self.workers[name].call(jobs[name](fmt), self.job_timeout())
                    after = scrape(self.metrics_url)
                    if not msg.get("ok"):
                        raise WorkerError("%s %s job failed: %s" % (name, phase,
                                                                    msg.get("error")))
                    if name == "ours" and not self.vocab_size:
                        self.vocab_size = (msg["result"].get("server") or {}).get("vocab_size")
                    key = phase if name == "vllm" or fmt == order[0] else "%s_%s" % (phase, fmt)
                    w[key] = {"cpu_s": msg["cpu_s"], "wall_s": msg["wall_s"],
                              "server_tokens": server_delta(before, after)}
                    if name == "ours":
                        w[key]["prompt_format"] = fmt
                self.fixed_cpu[(name, fmt)] = msg["cpu_s"]
            self.fixed_cpu[name] = w["fixed"]["cpu_s"]
        self.report["vocab_size"] = self.vocab_size
        print("warm-up job: ours %.3f, vllm %.3f CPU-s; fixed cost per run (same job again): "
              "ours %.3f, vllm %.3f CPU-s; vocab_size %s" % (
                  self.report["workers"]["ours"]["warmup"]["cpu_s"],
                  self.report["workers"]["vllm"]["warmup"]["cpu_s"],
                  self.fixed_cpu["ours"], self.fixed_cpu["vllm"], self.vocab_size), flush=True)

    def run_levels(self):
        args = self.args
        last_pair = None
        for c in args.levels:
            for fmt in prompt_formats(args.prompt_format):
                level = {"concurrency": c, "prompt_format": fmt, "runs": [], "pair_walls": []}
                prev_ours = None
                for rep, order in enumerate(job_order(args.reps), 1):
                    est = estimate_pair_s(level["pair_walls"], last_pair, args.duration_s)
                    if not pair_fits(self.remaining(), est):
                        self.report["stopped"] = (
                            "time budget: %.0f s left, next pair needs about %.0f s (+%.0f s "
                            "reserve); stopped before C=%d %s rep %d"
                            % (self.remaining(), est, BUDGET_RESERVE_S, c, fmt, rep))
                        if level["runs"]:
                            self.report["levels"].append(level)
                        return
                    if rep == 1:
                        self.report["levels"].append(level)
                    t0 = time.time()
                    for tool in order:
                        rec = self.run_tool(tool, c, rep, prev_ours, fmt)
                        level["runs"].append(rec)
                        if tool == "ours" and rec.get("ok"):
                            prev_ours = rec
                        print(progress_line(rec), flush=True)
                    last_pair = time.time() - t0
                    level["pair_walls"].append(last_pair)

    def close(self):
        for name, w in self.workers.items():
            rc = w.close()
            self.report["workers"].setdefault(name, {})["exit_rc"] = rc


def progress_line(r):
    if not r.get("ok"):
        return "C=%d rep %d %-4s FAILED: %s (%.1f s)" % (
            r["concurrency"], r["rep"], r["tool"], r.get("error"), r.get("wall_s") or 0)
    extra = (" n=%s" % r.get("num_prompts")) if r["tool"] == "vllm" else (
        " window %s req" % r.get("requests_in_window"))
    return ("C=%d %s rep %d %-4s %9.1f tok/s  TTFT p50 %8.2f ms  TPOT p50 %7.3f ms  tokens %s/%s "
            "srv  CPU %.2f s (%s ms/1k)  %.1f s%s%s" % (
                r["concurrency"], r.get("format") or "", r["rep"], r["tool"],
                r["output_tok_s"] or 0,
                r["ttft_p50_ms"] or 0, r["tpot_p50_ms"] or 0, r.get("client_tokens"),
                r.get("server_tokens"), r["cpu_s"], fmt(r.get("cpu_ms_per_1k"), "%.1f"),
                r["wall_s"], extra, " client-limited" if r.get("client_limited") else ""))


def fmt(x, spec="%.3f"):
    return "-" if x is None else spec % x


def _verdict_word(p):
    return "n/a " if p is None else ("PASS" if p else "FAIL")


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def prompt_and_shape_lines(levels):
    """Per level and tool: prompt tokens per request (server delta; each tool's own count) and
    the load shape of each run (wave share, mean in flight, TTFT p50/p90 over all requests)."""
    out = ["", "prompt tokens per request (server vllm:prompt_tokens_total delta x output_len / "
               "output delta; mean over runs) and the tools' own totals; ours: requests whose "
               "usage.prompt_tokens != input_len (sum over runs)",
           "%5s | %10s %10s | %14s %14s | %8s" % (
               "C", "srv/req us", "srv/req vl", "own total us", "own total vl", "miss us")]
    for level in levels:
        runs = level["runs"]
        by = dict((t, [r for r in runs if r["tool"] == t and r.get("ok")]) for t in TOOLS)
        own = dict((t, sum(r.get("client_prompt_tokens") or 0 for r in by[t])) for t in TOOLS)
        miss = [r.get("prompt_mismatched") for r in by["ours"]]
        out.append("%5d | %10s %10s | %14d %14d | %8s" % (
            level["concurrency"],
            fmt(_mean([r.get("prompt_per_request") for r in by["ours"]]), "%.2f"),
            fmt(_mean([r.get("prompt_per_request") for r in by["vllm"]]), "%.2f"),
            own["ours"], own["vllm"],
            "-" if all(m is None for m in miss) else str(sum(m or 0 for m in miss))))
    shapes = [(level, r) for level in levels for r in level["runs"] if r.get("load_shape")]
    if shapes:
        out.append("")
        out.append("load shape per run: wave = share of requests sent within %d ms of at least "
                   "C/2 others; in flight = mean requests in flight, first send to last end; "
                   "TTFT over all requests (ms)" % int(WAVE_WINDOW_S * 1000))
        out.append("%5s %4s %-4s | %6s %6s %9s | %9s %9s" % (
            "C", "rep", "tool", "n", "wave", "in flight", "TTFT p50", "TTFT p90"))
        for level, r in shapes:
            sh = r["load_shape"]
            out.append("%5d %4d %-4s | %6d %6s %9s | %9s %9s" % (
                level["concurrency"], r["rep"], r["tool"], sh["requests"],
                fmt(sh["wave"]), fmt(sh["in_flight_mean"], "%.1f"),
                fmt(sh["ttft_p50_ms"], "%.2f"), fmt(sh["ttft_p90_ms"], "%.2f")))
    return out


def format_report(report, tolerance=TOLERANCE, cpu_ratio_max=CPU_RATIO_MAX):
    """The printed tables and verdict lines (a list of lines); fills aggregates in."""
    args = report["args"]
    lines = []
    for level in report["levels"]:
        level["aggregate"] = aggregate_level(level["runs"])
        level["verdicts"] = verdicts(level["aggregate"], tolerance, cpu_ratio_max)
    lines.append("")
    definition = args.get("definition") or "steady_state"
    lines.append("definition: %s" % DEFINITION_TEXT.get(definition, definition))
    lines.append("input %d / output %d tokens, window %g s, %d reps per level (order O V, V O, "
                 "...); ratios are ours / vllm bench serve" % (
                     args["input_len"], args["output_len"], args["duration_s"], args["reps"]))
    lines.append("values are medians over reps; paired = median of per-rep ratios (adjacent "
                 "runs); spr = max/min of a tool's reps")
    formats = []
    for level in report["levels"]:
        if level.get("prompt_format") not in formats:
            formats.append(level.get("prompt_format"))
    for pf in formats:
        section = [lv for lv in report["levels"] if lv.get("prompt_format") == pf]
        lines.append("")
        lines.append("== our prompts: %s; vllm bench serve: text (random dataset) ==" % (
            pf or "token_ids"))
        lines.append("%5s %5s | %9s %9s %6s %6s %6s %6s | %8s %8s %6s %6s %6s %6s" % (
            "C", "pairs", "tok/s us", "tok/s vl", "ratio", "paired", "spr us", "spr vl",
            "TTFT us", "TTFT vl", "ratio", "paired", "spr us", "spr vl"))
        for level in section:
            a = level["aggregate"]
            m, t = "output_tok_s", "ttft_p50_ms"
            lines.append("%5d %5d | %9s %9s %6s %6s %6s %6s | %8s %8s %6s %6s %6s %6s" % (
                level["concurrency"], a["pairs"],
                fmt(a["ours"][m]["median"], "%.1f"), fmt(a["vllm"][m]["median"], "%.1f"),
                fmt(a["ratio"][m]), fmt(a["paired_ratio"][m]),
                fmt(a["ours"][m]["spread"]), fmt(a["vllm"][m]["spread"]),
                fmt(a["ours"][t]["median"], "%.2f"), fmt(a["vllm"][t]["median"], "%.2f"),
                fmt(a["ratio"][t]), fmt(a["paired_ratio"][t]),
                fmt(a["ours"][t]["spread"]), fmt(a["vllm"][t]["spread"])))
        lines.append("")
        lines.append("TPOT p50 ms; output tokens client/server delta (sum over all runs); client "
                     "CPU ms per 1,000 output tokens")
        lines.append("(worker CPU over the run / server delta; net: minus the tool's fixed cost "
                     "per run, measured once in the warm worker)")
        lines.append("%5s | %7s %7s %6s %6s | %15s %15s | %8s %8s %6s | %7s %7s %6s %s" % (
            "C", "TPOT us", "TPOT vl", "ratio", "paired", "tokens us/srv", "tokens vl/srv",
            "cpu us", "cpu vl", "ratio", "net us", "net vl", "ratio", "flags"))
        for level in section:
            a = level["aggregate"]
            m, k, n = "tpot_p50_ms", "cpu_ms_per_1k", "cpu_ms_per_1k_net"
            flags = []
            for tool in TOOLS:
                if a["tokens"][tool]["match"] is False:
                    flags.append("%s tokens != server %s" % (tool, a["tokens"][tool]["diffs"]))
            if a["client_limited"]:
                flags.append("client-limited in rep %s" % ",".join(
                    str(x["rep"]) for x in a["client_limited"]))
            if a["failed_runs"]:
                flags.append("%d failed runs" % a["failed_runs"])
            tok = dict((tool, "%d/%s" % (a["tokens"][tool]["client"],
                                         fmt(a["tokens"][tool]["server"], "%d")))
                       for tool in TOOLS)
            lines.append("%5d | %7s %7s %6s %6s | %15s %15s | %8s %8s %6s | %7s %7s %6s %s" % (
                level["concurrency"], fmt(a["ours"][m]["median"]), fmt(a["vllm"][m]["median"]),
                fmt(a["ratio"][m]), fmt(a["paired_ratio"][m]), tok["ours"], tok["vllm"],
                fmt(a["ours"][k]["median"], "%.1f"), fmt(a["vllm"][k]["median"], "%.1f"),
                fmt(a["ratio"][k]), fmt(a["ours"][n]["median"], "%.1f"),
                fmt(a["vllm"][n]["median"], "%.1f"), fmt(a["ratio"][n]), "; ".join(flags)))
        lines.extend(prompt_and_shape_lines(section))
        lines.append("")
    ws = report.get("workers") or {}
    if ws:
        lines.append("")
        for name in TOOLS:
            w = ws.get(name) or {}
            rd, wu, fx = w.get("ready") or {}, w.get("warmup") or {}, w.get("fixed") or {}
            if rd:
                lines.append("%s worker: start-up (interpreter + imports) %.2f CPU-s (%.1f s "
                             "wall), warm-up job %s CPU-s: not in the per-run CPU above; fixed "
                             "cost per run %s CPU-s" % (
                                 name, rd.get("startup_cpu_s", 0), rd.get("startup_wall_s", 0),
                                 fmt(wu.get("cpu_s"), "%.3f"), fmt(fx.get("cpu_s"), "%.3f")))
            fixed = [(v.get("prompt_format"), v) for k, v in sorted(w.items())
                     if k == "fixed" or k.startswith("fixed_")]
            if len(fixed) > 1:  # ours with both prompt formats: the preflight differs
                lines.append("%s worker: fixed cost per run by prompt format: %s" % (
                    name, ", ".join("%s %.3f CPU-s %.2f s wall" % (pf, v["cpu_s"], v["wall_s"])
                                    for pf, v in fixed)))
    loops = sorted(set(r.get("event_loop") for level in report["levels"]
                       for r in level.get("runs", []) if r.get("tool") == "ours"
                       and r.get("event_loop")))
    if loops:
        lines.append("our client's event loop: %s" % ", ".join(loops))
    lines.append("")
    for level in report["levels"]:
        v, c = level["verdicts"], level["concurrency"]
        c = "%d%s" % (c, "" if len(formats) < 2 else " " + str(level.get("prompt_format")))
        for key, label in (("tok_s", "output tok/s"), ("ttft_p50", "TTFT p50")):
            d = v[key]
            lines.append("C=%-4s %-13s within %g %%: %s  paired %s (ratio of medians %s)%s" % (
                c, label, tolerance * 100, _verdict_word(d["pass"]), fmt(d["paired_ratio"]),
                fmt(d["ratio_of_medians"]),
                ("  [noisy: spread ours %s, vllm %s]"
                 % (fmt(d["spread_ours"]), fmt(d["spread_vllm"]))) if d["noisy"] else ""))
        d = v["cpu"]
        a = level["aggregate"]
        lines.append("C=%-4s %-13s <= %g x vllm: %s  %s (ours %s vs vllm %s ms/1k; net of fixed "
                     "per-run cost %s)" % (
                         c, "client CPU", cpu_ratio_max, _verdict_word(d["pass"]),
                         fmt(d["ratio_of_medians"]),
                         fmt(a["ours"]["cpu_ms_per_1k"]["median"], "%.1f"),
                         fmt(a["vllm"]["cpu_ms_per_1k"]["median"], "%.1f"),
                         fmt(a["ratio"]["cpu_ms_per_1k_net"])))
        for x in a["client_limited"]:
            lines.append("C=%-4s ours client-limited in rep %d: %s" % (
                c, x["rep"], "; ".join(x["reasons"]) or "(no reason given)"))
    if report.get("stopped"):
        lines.append("")
        lines.append("STOPPED EARLY: %s" % report["stopped"])
    return lines


def parse_args(argv):
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
    ap.add_argument("--reps", type=int, default=3, help="[ours, vllm] pairs per level")
    ap.add_argument("--vocab-size", type=int,
                    help="vocab_size for our client (skips its vocabulary probe)")
    ap.add_argument("--event-loop", choices=["auto", "asyncio", "uvloop"],
                    help="our client's event loop (event_loop; default auto)")
    ap.add_argument("--stream-transport", choices=["native", "aiohttp"],
                    help="our client's streaming transport (stream_transport; default native)")
    ap.add_argument("--chunk-usage", action="store_true",
                    help="our client asks for running usage in every chunk (chunk_usage)")
    ap.add_argument("--time-budget-s", type=float,
                    help="stop starting new reps/levels when what is left would not fit")
    ap.add_argument("--json-out", help="also write all numbers here")
    ap.add_argument("--prompt-format", choices=PROMPT_FORMAT_CHOICES, default="text",
                    help="our client's prompts (prompt_format): text, as vllm bench's random "
                         "dataset sends them (the default), token_ids, or both (each level's "
                         "pairs of each format in turn, text first)")
    ap.add_argument("--no-load-shape", dest="load_shape", action="store_false",
                    help="no per-request detail (vllm bench --save-detailed, our request "
                         "log) and no load-shape table")
    ap.add_argument("--definition", choices=DEFINITIONS, default="whole_run",
                    help="which of our figures to compare with vllm bench's (default whole_run, "
                         "its own definition)")
    ap.add_argument("--stub-ttft-ms", type=float,
                    help="calibration: instead of vLLM, a paced stub server (the client "
                         "ceiling's, tests/benchmarks/bench_client_ceiling.py) whose first token "
                         "comes this many ms after each request: both tools' TTFT is then "
                         "compared with a known value (their bias); never a stand-in for vLLM")
    ap.add_argument("--stub-itl-ms", type=float, default=2.0,
                    help="the paced stub's gap between tokens (ms)")
    ap.add_argument("--stub-processes", type=int, default=2,
                    help="the paced stub's server processes")
    args = ap.parse_args(argv)
    if args.stub_ttft_ms is not None:
        if args.base_url:
            ap.error("--stub-ttft-ms starts its own server: leave out --base-url")
        if args.stub_ttft_ms < 0 or args.stub_itl_ms < 0 or args.stub_processes < 1:
            ap.error("--stub-ttft-ms and --stub-itl-ms must be >= 0, --stub-processes >= 1")
    try:
        args.levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        ap.error("--levels must be comma-separated integers, got %s" % args.levels)
    if not args.levels or any(c <= 0 for c in args.levels):
        ap.error("--levels must be positive integers, got %s" % args.levels)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    if args.duration_s <= 0:
        ap.error("--duration-s must be > 0")
    if args.vocab_size is not None and args.vocab_size < 2:
        ap.error("--vocab-size must be >= 2")
    return args


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--worker":
        return worker_main(argv[1:])
    args = parse_args(argv)
    t_start = time.time()
    deadline = t_start + args.time_budget_s if args.time_budget_s else None
    work = tempfile.mkdtemp(prefix="bench-sweep-")
    log = open(os.path.join(work, "children.log"), "w")
    server = None
    stub = None
    if args.stub_ttft_ms is not None:
        stub = start_paced_stub(args)
        args.base_url, args.model = stub[0], "stub"
    base = (args.base_url or "http://127.0.0.1:%d" % args.port).rstrip("/")
    bench = Bench(args, base, work, log, deadline)
    old = dict((s, signal.signal(s, _interrupt)) for s in (signal.SIGTERM, signal.SIGINT))
    rc = 0
    try:
        if not args.base_url:
            server = start_server(args, log)
            print("starting vLLM on %s (log %s) ..." % (base, log.name), flush=True)
        bench.start_workers()  # their imports overlap the server's start
        rem = bench.remaining()
        print("server healthy after %.0f s" % wait_health(
            base, timeout=600 if rem is None else max(1, rem), proc=server), flush=True)
        bench.wait_workers()
        bench.warm_up()
        bench.run_levels()
    except Interrupted as e:
        bench.report["stopped"] = str(e)
        rc = 1
    except WorkerError as e:
        bench.report["stopped"] = "worker error: %s (see %s)" % (e, log.name)
        rc = 1
    except Exception as e:  # report what was measured before the failure
        traceback.print_exc()
        bench.report["stopped"] = "error: %s: %s" % (type(e).__name__, e)
        rc = 1
    finally:
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        bench.close()
        if server is not None:
            stop_server(server)
        if stub is not None:
            bench.report["stub"] = stub_calibration(args, base, bench.report)
            for p in stub[1]:
                p.terminate()
        log.close()
    bench.report["elapsed_s"] = time.time() - t_start
    for line in format_report(bench.report) + format_stub(bench.report.get("stub")):
        print(line)
    print("children's log: %s" % os.path.join(work, "children.log"))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(bench.report, f, indent=2, default=str)
    for s, h in old.items():
        signal.signal(s, h)
    if not any(level["runs"] for level in bench.report["levels"]):
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
