# -*- coding: utf-8 -*-
"""Metric computations for the throughput sweep (pure Python: the standard library, and
prometheus_client's parser when the interpreter has it).

Definitions (the module documentation repeats them; all times are seconds from one monotonic
clock, reported in milliseconds):

* A request record holds ``start`` (just before the HTTP request is sent), ``chunk_times``
  (arrival time of every streamed chunk that carried output tokens), ``chunk_tokens`` (tokens
  in each such chunk, from the server's running usage count; ``None`` when the server does not
  send it), ``end`` (the stream finished), ``completion_tokens`` / ``prompt_tokens`` (from the
  server's ``usage``, never counted from chunks), ``error`` (``None`` when the request
  succeeded).
* TTFT = first token chunk arrival - start.
* E2E = end - start.
* TPOT = (E2E - TTFT) / (N - 1) per request, N = completion_tokens (requests with N < 2 have no
  TPOT). vLLM's name; guidellm/aiperf call this "ITL".
* ITL = the gaps between consecutive token chunks of one request (vLLM's name); a chunk may carry
  several tokens (speculative decoding), reported as tokens per chunk.
* Percentiles are ``statistics.quantiles(values, n=100, method="inclusive")``: linear
  interpolation between closest ranks, numpy's default ``linear`` method (rank
  h = (n - 1) * p / 100 on the sorted values).
* /metrics (Prometheus text format) is parsed with prometheus_client's parser, which every
  vLLM venv has (the sweep runs with the vLLM venv's python on the GPU host); a load generator
  whose python lacks it uses a small parser of its own (prometheus.py; ``PROMETHEUS_PARSER``
  says which).
* Steady-state window [w0, w1]: w0 is the completion time of the last warm-up request, w1 the
  completion time of the request that closed the window (the first completion at or after
  w0 + duration once enough requests were measured). Requests still running at w1 (the drain)
  and everything before w0 (warm-up, ramp-up) are excluded.
* Rates: output tok/s = sum of completion_tokens of successful requests whose end lies in
  (w0, w1], divided by (w1 - w0); total tok/s adds their prompt_tokens; requests/s counts
  those requests. In a closed loop this counts each completion once, so ramp and drain
  cannot inflate or deflate it.
* Latency statistics (TTFT, TPOT, ITL, E2E) use the successful requests that start AND end
  inside the window (start >= w0, end <= w1).
* Achieved concurrency = time-average of requests in flight over the window = sum over all
  requests of the overlap of [start, end] with [w0, w1], divided by (w1 - w0).
* Goodput (with SLOs): the requests counted in the rates that also meet every SLO given
  (TTFT <= slo_ttft_ms, TPOT <= slo_tpot_ms, E2E <= slo_e2e_ms), per second of window.
* A level meets the SLOs when the p99 of each latency with an SLO is within it (the MLPerf
  server convention) and no request failed.
* Two definitions per level. ``definition: steady_state`` names the figures above (the
  window). ``whole_run`` holds the figures computed the way ``vllm bench serve`` computes
  them (vllm/benchmarks/serve.py ``calculate_metrics``, lib/endpoint_request_func.py): every
  request of the level (warm-up, window and drain); duration = first send to last completion
  (of any request, failed ones included, as its wall clock runs until all tasks end); output
  tok/s = output tokens (usage) of the successful requests / duration; TTFT = first token
  chunk - send; latency (E2EL) = last token chunk - send; TPOT = (latency - TTFT) / (N - 1)
  for N > 1; ITL = every gap between consecutive token chunks; mean, median, std (population,
  np.std) and p50/p90/p99 (np.percentile's linear interpolation).
* Prompt lengths (``input_length``): every successful request's usage.prompt_tokens against
  ``input_len`` (completions, either prompt format; mismatches are counted and the level is
  marked when there is one), with the prompt-token total of the level (the server
  cross-check compares it with the ``vllm:prompt_tokens_total`` delta).
* Precision (``precision``): output tok/s with a batch-means interval (the window cut into
  ``PRECISION_BATCHES`` equal sub-windows, fewer where a sub-window would be shorter than one
  request lifetime, the median E2E of the requests completed in the window: in a closed loop
  of requests of one length the requests run in phase, so a shorter sub-window sees a part of
  the cycle, all prefill or all decode, and the batch means swing with the phase, not with the
  server; the count is the window's length in lifetimes, rounded, and a window of fewer than
  1.5 lifetimes has no interval; each request's tokens spread evenly over the span of its
  token chunks, the tokens falling in a sub-window / its length are the batch values; the
  interval is centred on the window's output tok/s) and TTFT p50 with the distribution-free
  interval of a median (order statistics) over the measured requests, both at 95 %
  confidence (plugins/module_utils/stats/compare.py).
"""
from __future__ import annotations

import math
import statistics


PERCENTILES = (50, 90, 99)
PRECISION_BATCHES = 10
STEADY_STATE = "steady_state"
WHOLE_RUN = "whole_run (as vllm bench serve: all requests, first send to last completion)"
OUTPUT_LENGTH_MISS_LIMIT = 0.01  # a level where more than 1 % of requests miss is marked


class Record(object):
    """One request as the client saw it (see the module docstring for the fields)."""

    __slots__ = ("level", "worker", "start", "end", "chunk_times", "chunk_tokens",
                 "completion_tokens", "prompt_tokens", "expected_tokens", "error")

    def __init__(self, level=0, worker=0, start=0.0, end=None, chunk_times=None,
                 chunk_tokens=None, completion_tokens=None, prompt_tokens=None,
                 expected_tokens=None, error=None):
        self.level = level
        self.worker = worker
        self.start = start
        self.end = end
        self.chunk_times = list(chunk_times or [])
        self.chunk_tokens = list(chunk_tokens) if chunk_tokens is not None else None
        self.completion_tokens = completion_tokens
        self.prompt_tokens = prompt_tokens
        self.expected_tokens = expected_tokens
        self.error = error

    @property
    def ok(self):
        return self.error is None

    @property
    def ttft(self):
        if not self.chunk_times:
            return None
        return self.chunk_times[0] - self.start

    @property
    def e2e(self):
        if self.end is None:
            return None
        return self.end - self.start

    @property
    def tpot(self):
        """(E2E - TTFT) / (N - 1); None when N < 2 or the request has no first token."""
        n = self.completion_tokens
        if not self.ok or n is None or n < 2 or self.ttft is None:
            return None
        return (self.e2e - self.ttft) / (n - 1)

    @property
    def itls(self):
        t = self.chunk_times
        return [t[i] - t[i - 1] for i in range(1, len(t))]

    def to_dict(self, t0=0.0):
        """JSON-friendly form, times in seconds relative to ``t0``."""
        def rel(x):
            return None if x is None else round(x - t0, 6)
        ttft, e2e, tpot = self.ttft, self.e2e, self.tpot
        return {
            "level": self.level,
            "worker": self.worker,
            "start_s": rel(self.start),
            "end_s": rel(self.end),
            "ttft_ms": None if ttft is None else round(ttft * 1000.0, 3),
            "tpot_ms": None if tpot is None else round(tpot * 1000.0, 3),
            "e2e_ms": None if e2e is None else round(e2e * 1000.0, 3),
            "completion_tokens": self.completion_tokens,
            "prompt_tokens": self.prompt_tokens,
            "expected_tokens": self.expected_tokens,
            "chunk_times_s": [rel(x) for x in self.chunk_times],
            "chunk_tokens": self.chunk_tokens,
            "error": self.error,
        }


def _cut_points(xs):
    """The 99 percentile cut points 1..99 of two or more values (statistics.quantiles)."""
    return statistics.quantiles(xs, n=100, method="inclusive")


def percentile(values, p):
    """Percentile ``p`` (an integer 0..100) by linear interpolation (numpy's default); None
    if there are no values."""
    if not values:
        return None
    if p < 0 or p > 100 or int(p) != p:
        raise ValueError("percentile p must be an integer within 0..100, got %r" % (p,))
    xs = sorted(values)
    if p == 0 or len(xs) == 1:
        return xs[0]
    if p == 100:
        return xs[-1]
    return _cut_points(xs)[int(p) - 1]


def describe(values, scale=1000.0, digits=3):
    """mean/p50/p90/p99/max of ``values`` (seconds), scaled (default: to ms)."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    out = {"count": len(values), "mean": round(statistics.fmean(values) * scale, digits)}
    xs = sorted(values)
    cuts = _cut_points(xs) if len(xs) > 1 else None
    for p in PERCENTILES:
        out["p%d" % p] = round((cuts[p - 1] if cuts else xs[0]) * scale, digits)
    out["max"] = round(xs[-1] * scale, digits)
    return out


def bench_stats(values, scale=1000.0, digits=3):
    """mean, median, std (population) and p50/p90/p99 the way vllm bench serve reports them
    (numpy mean/median/std/percentile; an empty list counts as [0], as there)."""
    xs = sorted(values) if values else [0.0]
    mean = statistics.fmean(xs)
    out = {"count": len(values), "mean": round(mean * scale, digits),
           "median": round(statistics.median(xs) * scale, digits),
           "std": round(statistics.pstdev(xs) * scale, digits)}
    cuts = _cut_points(xs) if len(xs) > 1 else None
    for p in PERCENTILES:
        out["p%d" % p] = round((cuts[p - 1] if cuts else xs[0]) * scale, digits)
    return out


def whole_run(records):
    """The level's figures as vllm bench serve computes them (see the module docstring)."""
    ok = [r for r in records if r.ok and r.chunk_times]
    starts = [r.start for r in records]
    ends = [r.end for r in records if r.end is not None]
    if not starts or not ends:
        return {"definition": WHOLE_RUN, "completed": 0, "failed": len(records),
                "duration_s": None, "output_tok_s": None, "request_s": None,
                "total_tok_s": None, "total_output_tokens": 0, "total_input_tokens": 0,
                "ttft_ms": bench_stats([]), "tpot_ms": bench_stats([]),
                "itl_ms": bench_stats([]), "e2el_ms": bench_stats([])}
    dur = max(ends) - min(starts)
    out_tokens = sum(r.completion_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    ttfts, tpots, itls, e2els = [], [], [], []
    for r in ok:
        ttft = r.chunk_times[0] - r.start
        latency = r.chunk_times[-1] - r.start
        ttfts.append(ttft)
        e2els.append(latency)
        n = r.completion_tokens or 0
        if n > 1:
            tpots.append((latency - ttft) / (n - 1))
        itls.extend(r.itls)
    return {
        "definition": WHOLE_RUN,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": round(dur, 6),
        "total_output_tokens": out_tokens,
        "total_input_tokens": in_tokens,
        "output_tok_s": round(out_tokens / dur, 3) if dur > 0 else None,
        "request_s": round(len(ok) / dur, 4) if dur > 0 else None,
        "total_tok_s": round((out_tokens + in_tokens) / dur, 3) if dur > 0 else None,
        "ttft_ms": bench_stats(ttfts),
        "tpot_ms": bench_stats(tpots),
        "itl_ms": bench_stats(itls),
        "e2el_ms": bench_stats(e2els),
    }


def _rounded(iv, digits=3):
    out = {}
    for k, v in iv.items():
        out[k] = round(v, digits) if isinstance(v, float) else v
    return out


def window_batches(records, w0, w1, batches=PRECISION_BATCHES):
    """Output tok/s of each of ``batches`` equal sub-windows of [w0, w1]: every successful
    request's usage tokens spread evenly over the span of its token chunks (first to last
    chunk), each sub-window getting the tokens of the part of that span inside it (smoother
    than counting whole requests at their completion, which at low concurrency puts 0 or 1
    completions in a sub-window; one pass over the requests, not over their chunks)."""
    width = (w1 - w0) / float(batches)
    tokens = [0.0] * batches
    for r in records:
        if not (r.ok and r.chunk_times and r.completion_tokens):
            continue
        a, b, n = r.chunk_times[0], r.chunk_times[-1], float(r.completion_tokens)
        if b <= w0 or a > w1:
            continue
        if b - a <= 0:
            tokens[min(batches - 1, int((a - w0) / width))] += n
            continue
        rate = n / (b - a)
        first = max(0, int((max(a, w0) - w0) / width))
        last = min(batches - 1, int((min(b, w1) - w0) / width))
        for i in range(first, last + 1):
            lo, hi = max(a, w0 + i * width), min(b, w0 + (i + 1) * width)
            if hi > lo:
                tokens[i] += rate * (hi - lo)
    return [t / width for t in tokens]


def lifetime(records, w0, w1):
    """One request lifetime: the median E2E of the successful requests that completed in
    (w0, w1], wherever they started (0.0 when none did)."""
    e2e = [r.end - r.start for r in records if r.ok and r.end is not None and w0 < r.end <= w1]
    return statistics.median(e2e) if e2e else 0.0


def lifetime_batches(records, w0, w1, most=PRECISION_BATCHES):
    """How many sub-windows [w0, w1] is cut into for its batch means: ``most``, fewer where a
    sub-window would be shorter than one request :func:`lifetime` (the window's length in
    lifetimes, rounded); see the module docstring."""
    life = lifetime(records, w0, w1)
    if life <= 0:
        return most
    return max(0, min(most, int((w1 - w0) / life + 0.5)))


def precision(records, w0, w1, measured, value=None, seed=0):
    """Confidence intervals (95 %) of the window's output tok/s (batch means over sub-windows
    of at least one request lifetime, centred on the window's figure ``value``) and TTFT p50
    (order statistics of the median over the measured requests); see the module docstring."""
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats.compare import (
        CompareError, batch_means_interval, median_interval)
    out = {}
    try:
        k = lifetime_batches(records, w0, w1)
        if k < 2:
            raise CompareError("the window holds %d request lifetime(s) (rounded), fewer "
                               "than 2" % k)
        iv = batch_means_interval(window_batches(records, w0, w1, k), k)
        if value is not None:
            half = iv["ci_high"] - iv["value"]
            iv.update(value=value, ci_low=value - half, ci_high=value + half,
                      half_width_pct=(100.0 * half / value) if value else None)
        out["output_tok_s"] = _rounded(iv)
    except CompareError:
        out["output_tok_s"] = None
    ttfts = [r.ttft for r in measured if r.ttft is not None]
    try:
        iv = median_interval([t * 1000.0 for t in ttfts])
        out["ttft_ms_p50"] = _rounded(iv)
    except CompareError:
        out["ttft_ms_p50"] = None
    return out


def output_length_check(records, expected):
    """Successful requests whose usage.completion_tokens != expected; marked past 1 %."""
    ok = [r for r in records if r.ok]
    missed = [r for r in ok if r.completion_tokens != expected]
    frac = (len(missed) / float(len(ok))) if ok else 0.0
    return {
        "expected": expected,
        "checked": len(ok),
        "mismatched": len(missed),
        "fraction": round(frac, 6),
        "marked": frac > OUTPUT_LENGTH_MISS_LIMIT,
    }


def prompt_length_check(records, expected, prompt_format=None):
    """Successful requests whose usage.prompt_tokens != expected (``input_len``; None for
    chat, whose length the template sets: then nothing is compared) and the level's prompt-token
    total (every request with a usage report, as the server cross-check counts them). Marked
    when any request missed: both prompt formats are meant to be exact."""
    ok = [r for r in records if r.ok]
    total = sum(r.prompt_tokens or 0 for r in records)
    if expected is None:
        return {"expected": None, "prompt_format": prompt_format, "checked": len(ok),
                "mismatched": None, "fraction": None, "marked": False,
                "prompt_tokens_total": total, "lengths_seen": None}
    missed = [r for r in ok if r.prompt_tokens != expected]
    seen = sorted(set(r.prompt_tokens for r in missed if r.prompt_tokens is not None))
    return {
        "expected": expected,
        "prompt_format": prompt_format,
        "checked": len(ok),
        "mismatched": len(missed),
        "fraction": round(len(missed) / float(len(ok)), 6) if ok else 0.0,
        "marked": bool(missed),
        "prompt_tokens_total": total,
        "lengths_seen": seen[:10],  # the wrong lengths (at most 10)
    }


def _meets(r, slo):
    if slo.get("ttft_ms") is not None and (r.ttft is None or r.ttft * 1000.0 > slo["ttft_ms"]):
        return False
    if slo.get("tpot_ms") is not None:
        tp = r.tpot
        if tp is None or tp * 1000.0 > slo["tpot_ms"]:
            return False
    if slo.get("e2e_ms") is not None and r.e2e * 1000.0 > slo["e2e_ms"]:
        return False
    return True


def goodput(completed_in, slo, dur):
    """The requests of ``completed_in`` that meet every SLO of ``slo``, per second of the
    window ``dur``: request_s, output_tok_s and their fraction of the requests."""
    good = [r for r in completed_in if _meets(r, slo)]
    return {
        "request_s": round(len(good) / dur, 4),
        "output_tok_s": round(sum(r.completion_tokens or 0 for r in good) / dur, 3),
        "fraction": round(len(good) / float(len(completed_in)), 4) if completed_in else 0.0,
    }


def clean_slo(slo):
    """Keep only the SLOs that were given: {'ttft_ms': .., 'tpot_ms': .., 'e2e_ms': ..}."""
    return dict((k, float(v)) for k, v in (slo or {}).items() if v is not None)


def summarize_level(records, concurrency, w0, w1, expected_tokens, slo=None,
                    expected_prompt_tokens=None, prompt_format=None, also_slos=None):
    """Summary of one level over the window [w0, w1] (see the module docstring);
    ``expected_prompt_tokens`` (input_len) is what every request's usage.prompt_tokens is
    compared with (``input_length``). ``also_slos`` ({name: {ttft_ms, tpot_ms, e2e_ms}}):
    other SLOs the same requests are judged by, each into ``by_slo[name]`` (its goodput and
    verdict, as ``goodput`` and ``slo`` are for ``slo``); they decide nothing in the sweep."""
    if w1 <= w0:
        raise ValueError("window end %r must be after its start %r" % (w1, w0))
    slo = clean_slo(slo)
    dur = w1 - w0
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    completed_in = [r for r in ok if w0 < r.end <= w1]
    measured = [r for r in ok if r.start >= w0 and r.end <= w1]
    out_tokens = sum(r.completion_tokens or 0 for r in completed_in)
    in_tokens = sum(r.prompt_tokens or 0 for r in completed_in)
    busy = 0.0
    for r in records:
        end = r.end if r.end is not None else w1
        busy += max(0.0, min(end, w1) - max(r.start, w0))

    itls, chunk_tokens = [], []
    for r in measured:
        itls.extend(r.itls)
        if r.chunk_tokens is not None:
            chunk_tokens.extend(r.chunk_tokens)

    errors = {}
    for r in failed:
        key = str(r.error)[:200]
        errors[key] = errors.get(key, 0) + 1

    summary = {
        "concurrency": concurrency,
        "requests_total": len(records),
        "requests_ok": len(ok),
        "requests_failed": len(failed),
        "failed_in_window": sum(1 for r in failed if r.end is not None and w0 < r.end <= w1),
        "requests_in_window": len(completed_in),
        "requests_measured": len(measured),
        "window_s": round(dur, 6),
        "output_tokens_in_window": out_tokens,
        "output_tok_s": round(out_tokens / dur, 3),
        "total_tok_s": round((out_tokens + in_tokens) / dur, 3),
        "request_s": round(len(completed_in) / dur, 4),
        "achieved_concurrency": round(busy / dur, 3),
        "ttft_ms": describe([r.ttft for r in measured if r.ttft is not None]),
        "tpot_ms": describe([r.tpot for r in measured if r.tpot is not None]),
        "itl_ms": describe(itls),
        "e2e_ms": describe([r.e2e for r in measured]),
        "tokens_per_chunk": {
            "mean": round(sum(chunk_tokens) / float(len(chunk_tokens)), 4) if chunk_tokens
            else None,
            "max": max(chunk_tokens) if chunk_tokens else None,
        },
        "output_length": output_length_check(records, expected_tokens),
        "input_length": prompt_length_check(records, expected_prompt_tokens, prompt_format),
        "errors": errors,
    }
    summary["goodput"] = goodput(completed_in, slo, dur) if slo else None
    summary["slo"] = slo_verdict(summary, slo)
    if also_slos:
        summary["by_slo"] = {}
        for name, other in sorted(also_slos.items()):
            other = clean_slo(other)
            summary["by_slo"][name] = {"goodput": goodput(completed_in, other, dur),
                                       "slo": slo_verdict(summary, other)}
    summary["definition"] = STEADY_STATE
    summary["precision"] = precision(records, w0, w1, measured, summary["output_tok_s"])
    summary["whole_run"] = whole_run(records)
    return summary


def slo_verdict(summary, slo):
    """{'met': bool|None, 'breaks': [...]}: p99 of each latency with an SLO within it."""
    slo = clean_slo(slo)
    if not slo:
        return {"met": None, "breaks": []}
    breaks = []
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        if key not in slo:
            continue
        p99 = summary[key]["p99"]
        if p99 is None:
            breaks.append("%s: no measured requests" % key)
        elif p99 > slo[key]:
            breaks.append("%s p99 %.3f > SLO %.3f" % (key, p99, slo[key]))
    if summary["requests_failed"]:
        breaks.append("%d failed requests" % summary["requests_failed"])
    return {"met": not breaks, "breaks": breaks}


def saturation_check(prev, cur, threshold):
    """Why the sweep should stop after level ``cur`` (a summary), or None to go on.

    Rules, in order: any failed request; an SLO break; throughput saturation -- the step from
    ``prev`` raised output tok/s by less than ``threshold`` per doubling of concurrency
    (required gain = threshold * log2(C_cur / C_prev), so a doubling needs ``threshold``)
    while TTFT p50 grew.
    """
    if cur["requests_failed"]:
        return "errors at concurrency %d: %d failed requests" % (
            cur["concurrency"], cur["requests_failed"])
    verdict = cur.get("slo") or {}
    if verdict.get("met") is False:
        return "SLO broken at concurrency %d: %s" % (cur["concurrency"],
                                                     "; ".join(verdict["breaks"]))
    if prev is None or prev["output_tok_s"] <= 0:
        return None
    ratio = cur["concurrency"] / float(prev["concurrency"])
    if ratio <= 1:
        return None
    required = threshold * math.log(ratio, 2)
    gain = cur["output_tok_s"] / prev["output_tok_s"] - 1.0
    t_prev, t_cur = prev["ttft_ms"]["p50"], cur["ttft_ms"]["p50"]
    ttft_grew = t_prev is not None and t_cur is not None and t_cur > t_prev
    if gain < required and ttft_grew:
        return ("saturated at concurrency %d: output tok/s %+.1f%% from concurrency %d "
                "(needed %+.1f%%) while TTFT p50 grew %.1f -> %.1f ms"
                % (cur["concurrency"], gain * 100, prev["concurrency"], required * 100,
                   t_prev, t_cur))
    return None


def knee(levels):
    """Level of maximum output tok/s (levels without failures) and highest level meeting SLOs."""
    clean = [s for s in levels if not s["requests_failed"]]
    best = max(clean, key=lambda s: s["output_tok_s"]) if clean else None
    slo_ok = [s["concurrency"] for s in levels if (s.get("slo") or {}).get("met")]
    return {
        "max_throughput_level": best["concurrency"] if best else None,
        "max_output_tok_s": best["output_tok_s"] if best else None,
        "highest_level_meeting_slo": max(slo_ok) if slo_ok else None,
    }


def headline(levels):
    """The numbers users quote: single-stream tok/s, peak tok/s and where, the knee."""
    single = [s for s in levels if s["concurrency"] == 1 and not s["requests_failed"]]
    k = knee(levels)
    return {
        "single_stream_tok_s": single[0]["output_tok_s"] if single else None,
        "peak_output_tok_s": k["max_output_tok_s"],
        "peak_level": k["max_throughput_level"],
        "knee": k,
        "client_limited_levels": [s["concurrency"] for s in levels
                                  if (s.get("client") or {}).get("client_limited")],
        "output_length_marked_levels": [s["concurrency"] for s in levels
                                        if s["output_length"]["marked"]],
        "input_length_marked_levels": [s["concurrency"] for s in levels
                                       if (s.get("input_length") or {}).get("marked")],
        "levels_with_errors": [s["concurrency"] for s in levels if s["requests_failed"]],
    }


def format_table(levels):
    """Plain-text per-level table (list of lines) for logs and the demo."""
    head = ("%5s %6s %6s %10s %6s %10s %9s %9s %9s %9s %7s %7s | %10s %9s  %s"
            % ("conc", "ok", "fail", "out_tok/s", "+-95%", "tot_tok/s", "ttft_p50", "ttft_p99",
               "tpot_p50", "tpot_p99", "srv_chk", "in_miss", "run_tok/s", "run_ttft", "flags"))
    lines = [head]
    for s in levels:
        flags = []
        if s["requests_failed"]:
            flags.append("errors")
        if s["output_length"]["marked"]:
            flags.append("length-miss")
        inlen = s.get("input_length") or {}
        if inlen.get("marked"):
            flags.append("prompt-length-miss")
        if (s.get("client") or {}).get("client_limited"):
            flags.append("client-limited")
        if (s.get("slo") or {}).get("met") is False:
            flags.append("slo-broken")
        chk = (s.get("server_check") or {}).get("match")
        prec = (s.get("precision") or {}).get("output_tok_s") or {}
        whole = s.get("whole_run") or {}
        hw = prec.get("half_width_pct")
        lines.append("%5d %6d %6d %10.1f %6s %10.1f %9s %9s %9s %9s %7s %7s | %10s %9s  %s" % (
            s["concurrency"], s["requests_ok"], s["requests_failed"], s["output_tok_s"],
            "-" if hw is None else "%.1f%%" % hw,
            s["total_tok_s"], _fmt(s["ttft_ms"]["p50"]), _fmt(s["ttft_ms"]["p99"]),
            _fmt(s["tpot_ms"]["p50"]), _fmt(s["tpot_ms"]["p99"]),
            "n/a" if chk is None else ("ok" if chk else "DIFF"),
            "-" if inlen.get("mismatched") is None else str(inlen["mismatched"]),
            _fmt(whole.get("output_tok_s")), _fmt((whole.get("ttft_ms") or {}).get("median")),
            ",".join(flags)))
    lines.append("left of |: steady_state window (+-95%: output tok/s interval half-width; "
                 "in_miss: requests whose usage.prompt_tokens != input_len); "
                 "right: whole_run as vllm bench serve (first send to last completion; "
                 "run_ttft = TTFT median, ms)")
    return lines


def _fmt(x):
    return "-" if x is None else "%.2f" % x
