# -*- coding: utf-8 -*-
"""One level's bookkeeping, shared by the engine and the worker processes: the window rule
(:class:`LevelState`), the client's own health (:class:`Sampler`: event-loop lag and CPU), the
garbage collector kept quiet during a level, and the summary of a level run several times.
"""
from __future__ import annotations

import asyncio
import gc
import time

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (
    lifetime, percentile, precision)

LOOP_TICK_S = 0.01
LOOP_LAG_LIMIT_MS = 10.0
CPU_LIMIT = 0.8


def default_min_requests(concurrency):
    return max(2 * concurrency, 8)


def repeats_summary(runs):
    """What a level run several times (``repeats``) adds to its first run's summary: the
    headline figures of every repeat (``repeats``) and their t-intervals across repeats
    (``precision_repeats``), which also cover drift between runs."""
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats.compare import (
        CompareError, interval)
    reps = {
        "output_tok_s": [r["output_tok_s"] for r in runs],
        "ttft_ms_p50": [r["ttft_ms"]["p50"] for r in runs],
        "whole_run_output_tok_s": [(r.get("whole_run") or {}).get("output_tok_s") for r in runs],
        "whole_run_ttft_ms_median": [((r.get("whole_run") or {}).get("ttft_ms") or {}).get(
            "median") for r in runs],
        "requests_failed": [r["requests_failed"] for r in runs],
        "client_limited": [bool((r.get("client") or {}).get("client_limited")) for r in runs],
    }
    prec = {}
    for key in ("output_tok_s", "ttft_ms_p50", "whole_run_output_tok_s",
                "whole_run_ttft_ms_median"):
        try:
            iv = interval([x for x in reps[key] if x is not None])
            prec[key] = dict((k, round(v, 3) if isinstance(v, float) else v)
                             for k, v in iv.items())
        except CompareError:
            prec[key] = None
    return {"repeats": reps, "precision_repeats": prec}


class LevelState(object):
    """The window rule of one level, fed each completed request in order of completion.

    Warm-up: the window opens (w0) at the completion of the ``warmup``-th request. It closes
    (w1) at the first completion at or after w0 + duration once ``min_requests`` requests
    started and ended inside it; with ``min_lifetimes`` also only once it is that many request
    lifetimes long (metrics.lifetime: the median E2E of the requests completed in it so far);
    with ``precision_pct`` also only once the 95 % intervals of output tok/s and TTFT p50 are
    within +-precision_pct of their values; with either of the two at the latest at the first
    completion at or after w0 + ``max_duration`` (the cap; default 10 x duration). A level
    where at least max(10, C) requests failed and more failed than succeeded is aborted.
    """

    def __init__(self, conc, cfg, level_start):
        self.conc, self.cfg = conc, cfg
        self.records = []
        self.w0 = level_start if cfg["warmup"] == 0 else None
        self.w1 = None
        self.measured = 0
        self.failed = 0
        self.stop = False
        self.aborted = None
        self.stopped_by = None
        self.next_check = None
        self.last_precision = None
        self.lifetimes_s = 0.0  # the window length min_lifetimes asked for at the last look

    def feed(self, rec):
        self.records.append(rec)
        if self.stop:
            return
        if rec.error is not None:
            self.failed += 1
            ok = len(self.records) - self.failed
            if self.failed >= max(10, self.conc) and self.failed > ok:
                self.aborted = "aborted: %d of %d requests failed" % (
                    self.failed, len(self.records))
                self.stop, self.stopped_by = True, "aborted"
                if self.w0 is not None:
                    self.w1 = rec.end
                return
        if self.w0 is None:
            if len(self.records) >= self.cfg["warmup"]:
                self.w0 = rec.end
            return
        if rec.start >= self.w0:
            self.measured += 1
        cfg = self.cfg
        if rec.end < self.w0 + cfg["duration"] or self.measured < cfg["min_requests"]:
            return
        target = cfg.get("precision_pct")
        lives = cfg.get("min_lifetimes")
        if not target and not lives:
            self.stop, self.w1, self.stopped_by = True, rec.end, "duration"
            return
        cap = cfg.get("max_duration") or 10.0 * cfg["duration"]
        if rec.end >= self.w0 + cap:
            self.stop, self.w1, self.stopped_by = True, rec.end, "max_duration_s"
            return
        if lives and not self._lifetimes_met(rec.end, lives):
            return
        if not target:
            self.stop, self.w1 = True, rec.end
            self.stopped_by = "min_lifetimes" if self.lifetimes_s > cfg["duration"] else "duration"
            return
        if self.next_check is not None and rec.end < self.next_check:
            return
        elapsed = rec.end - self.w0
        self.next_check = rec.end + max(1.0, 0.1 * elapsed)
        measured = [r for r in self.records if r.ok and r.start >= self.w0 and r.end <= rec.end]
        ok = [r for r in self.records if r.ok and self.w0 < r.end <= rec.end]
        out_tokens = sum(r.completion_tokens or 0 for r in ok)
        prec = precision(self.records, self.w0, rec.end, measured, out_tokens / elapsed)
        self.last_precision = prec
        widths = [(prec.get(k) or {}).get("half_width_pct")
                  for k in ("output_tok_s", "ttft_ms_p50")]
        if all(w is not None and w <= target for w in widths):
            self.stop, self.w1, self.stopped_by = True, rec.end, "precision_pct"

    def _lifetimes_met(self, now, lives):
        """Is the window ``lives`` request lifetimes long at ``now``? The lifetime is looked at
        again only once the window has reached the length the last look asked for."""
        if now - self.w0 < self.lifetimes_s:
            return False
        self.lifetimes_s = lives * lifetime(self.records, self.w0, now)
        return now - self.w0 >= self.lifetimes_s

    def window(self, level_start):
        """(w0, w1); a level aborted before its window could close spans the whole level."""
        w0, w1 = self.w0, self.w1
        if w0 is None or w1 is None or w1 <= w0:
            w0 = level_start
            w1 = max([r.end for r in self.records if r.end is not None] + [level_start + 1e-6])
        return w0, w1


class Sampler(object):
    """Event-loop lag and CPU time of this process, sampled by a 10 ms ticker task."""

    def __init__(self):
        self.on = True
        self.samples = []  # (time, loop lag s, process CPU s)

    async def run(self):
        prev = time.perf_counter()
        self.samples.append((prev, 0.0, time.process_time()))
        while self.on:
            await asyncio.sleep(LOOP_TICK_S)
            now = time.perf_counter()
            self.samples.append((now, max(0.0, now - prev - LOOP_TICK_S), time.process_time()))
            prev = now

    @classmethod
    def from_samples(cls, samples):
        s = cls()
        s.on = False
        s.samples = [tuple(x) for x in samples]
        return s

    def _cpu_at(self, t):
        best = None
        for when, _lag, cpu in self.samples:
            if when <= t:
                best = cpu
            else:
                return cpu if best is None else best
        return best if best is not None else 0.0

    def health(self, w0, w1, index, workers):
        """Window CPU, loop lag and the client_limited verdict of this process."""
        lags = [lag for t, lag, _cpu in self.samples if w0 <= t <= w1] or \
            [lag for _t, lag, _cpu in self.samples]
        cpu_win = max(0.0, self._cpu_at(w1) - self._cpu_at(w0))
        util = cpu_win / (w1 - w0) if w1 > w0 else 0.0
        lag_p99 = (percentile(lags, 99) or 0.0) * 1000.0
        limited = []
        if lag_p99 > LOOP_LAG_LIMIT_MS:
            limited.append("event-loop lag p99 %.1f ms > %.1f ms" % (lag_p99, LOOP_LAG_LIMIT_MS))
        if util > CPU_LIMIT:
            limited.append("client CPU %.0f%% of a core > %.0f%%" % (util * 100, CPU_LIMIT * 100))
        return {"process": index, "workers": workers, "cpu_s_window": round(cpu_win, 4),
                "cpu_util_window": round(util, 4),
                "loop_lag_ms": {"p50": round((percentile(lags, 50) or 0.0) * 1000.0, 3),
                                "p99": round(lag_p99, 3),
                                "max": round(max(lags or [0.0]) * 1000.0, 3)},
                "client_limited": bool(limited), "client_limited_reasons": limited}


def gc_quiet(settings):
    """Before a level: collect, freeze what exists, and (unless gc_during_level) switch the
    collector off until the level ends. A full collection walks every tracked object (the
    level's growing record lists included) while the loop is blocked; the records hold no
    cycles, so nothing piles up meanwhile. Returns what _gc_restore reports."""
    gc.collect()
    gc.freeze()
    info = {"mode": "on" if settings.gc_during_level else "off during the level",
            "collections": 0, "pause_ms_total": 0.0, "pause_ms_max": 0.0, "_t": None}

    def cb(phase, _details):
        if phase == "start":
            info["_t"] = time.perf_counter()
        elif info["_t"] is not None:
            ms = (time.perf_counter() - info["_t"]) * 1000.0
            info["collections"] += 1
            info["pause_ms_total"] += ms
            info["pause_ms_max"] = max(info["pause_ms_max"], ms)
            info["_t"] = None
    info["_cb"] = cb
    gc.callbacks.append(cb)
    if not settings.gc_during_level:
        gc.disable()
    return info


def gc_restore(info):
    gc.enable()
    if info.get("_cb") in gc.callbacks:
        gc.callbacks.remove(info["_cb"])
    gc.unfreeze()
    return {"mode": info["mode"], "collections": info["collections"],
            "pause_ms_total": round(info["pause_ms_total"], 3),
            "pause_ms_max": round(info["pause_ms_max"], 3)}
