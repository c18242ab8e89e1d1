# -*- coding: utf-8 -*-
"""Async closed-loop load generator for the throughput sweep (aiohttp).

One shared ``aiohttp.ClientSession`` (``TCPConnector(limit=0)``: no connection cap, 4 MiB read
buffer so long SSE lines never break), streaming ``/v1/completions`` (or chat) with usage
counts, a light SSE parser of its own, and per level:

1. ``C`` workers, each sending its next request when its last one ends (closed loop);
2. warm-up: the window opens at the completion of the ``warmup_requests``-th request;
3. measurement window: closes at the first completion at or after ``duration_s`` once at least
   ``min_requests`` requests started and ended inside it (whichever ends later);
4. drain: workers send nothing more and finish their in-flight requests (excluded from rates,
   included in the server cross-check, which covers the whole level).

Prompts are random token-id lists of exactly ``input_len`` tokens drawn from the server's
vocabulary (its size is learned with a binary search over ``/v1/completions`` validation
errors unless given; a probe whose connection drops or that gets HTTP 5xx counts as out of range
only while the server still accepts token id 0), from a generator seeded once per run and per level, so no level reuses
another's prompts and prefix caching cannot flatter later levels. Output length is forced with
``max_tokens = min_tokens = output_len`` and ``ignore_eos``; counts come from the server's
``usage`` (``stream_options.include_usage``). Every streamed chunk with a choice is a token
chunk (as `vllm bench serve` counts them: a token may decode to no text). With ``chunk_usage``
the server also reports running usage in every chunk (``continuous_usage_stats``), which gives
tokens per chunk (multi-token chunks under speculative decoding) at a cost: the server builds
and sends a usage object per token, which a real client does not ask for, and on a small model
whose API server is the bottleneck that lowers the throughput being measured.

The client records its CPU time (``time.process_time``) and the lag of its event loop (a
ticker task) and marks a level ``client_limited`` when the loop lag p99 exceeds
``LOOP_LAG_LIMIT_MS`` or the client used more than ``CPU_LIMIT`` of a core over the window.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

try:
    import aiohttp
    HAS_AIOHTTP = True
except ImportError:  # the module reports this with the interpreter's path
    aiohttp = None
    HAS_AIOHTTP = False

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep_metrics import (
    PROMETHEUS_PARSER, Record, headline, percentile, saturation_check, server_counters,
    server_cross_check, summarize_level)

READ_BUFSIZE = 4 * 1024 * 1024
LOOP_TICK_S = 0.01
LOOP_LAG_LIMIT_MS = 10.0
CPU_LIMIT = 0.8
VOCAB_PROBE_MAX = 1 << 21  # larger than any tokenizer's vocabulary
PROBE_TIMEOUT_S = 60
CHAT_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
              "november oscar papa quebec romeo sierra tango uniform victor whiskey xray "
              "yankee zulu").split()


class SweepError(Exception):
    """A problem that stops the sweep (bad parameter, unreachable server, wrong model)."""


class RequestLogError(SweepError):
    """The request log (request_log_path) could not be opened or written."""


def failure_message(exc):
    """The module's message for an exception out of run_sweep: a SweepError says it all (a
    RequestLogError names request_log_path); anything else is named by its type."""
    if isinstance(exc, SweepError):
        return str(exc)
    return "sweep failed: %s: %s" % (type(exc).__name__, exc)


def default_min_requests(concurrency):
    return max(2 * concurrency, 8)


def check_params(p):
    """Validate the sweep parameters (a dict); raise SweepError naming the variable."""
    levels = p.get("levels") or []
    if not levels:
        raise SweepError("levels must list at least one concurrency")
    bad = [c for c in levels if not isinstance(c, int) or c <= 0]
    if bad:
        raise SweepError("levels must be positive integers, got %s in %s" % (bad, levels))
    if len(set(levels)) != len(levels):
        raise SweepError("levels must not repeat a concurrency: %s" % (levels,))
    for key in ("input_len", "output_len"):
        if not isinstance(p.get(key), int) or p[key] <= 0:
            raise SweepError("%s must be a positive integer, got %r" % (key, p.get(key)))
    for key in ("duration_s", "request_timeout_s"):
        if not p.get(key) or p[key] <= 0:
            raise SweepError("%s must be > 0, got %r" % (key, p.get(key)))
    for key in ("min_requests", "warmup_requests"):
        if p.get(key) is not None and p[key] < (1 if key == "min_requests" else 0):
            raise SweepError("%s must be >= %d, got %r"
                             % (key, 1 if key == "min_requests" else 0, p[key]))
    for key in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms"):
        if p.get(key) is not None and p[key] <= 0:
            raise SweepError("%s must be > 0 when given, got %r" % (key, p[key]))
    if p.get("saturation_threshold") is None or p["saturation_threshold"] < 0:
        raise SweepError("saturation_threshold must be >= 0, got %r"
                         % (p.get("saturation_threshold"),))
    if p.get("event_loop", "auto") not in ("auto", "asyncio", "uvloop"):
        raise SweepError("event_loop must be auto, asyncio or uvloop, got %r"
                         % (p.get("event_loop"),))
    if p.get("endpoint") not in ("completions", "chat"):
        raise SweepError("endpoint must be 'completions' or 'chat', got %r" % (p.get("endpoint"),))
    if p.get("vocab_size") is not None and p["vocab_size"] < 2:
        raise SweepError("vocab_size must be >= 2 when given, got %r" % (p["vocab_size"],))


def _headers(api_key):
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = "Bearer " + api_key
    return h


def _short(text, n=300):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


class Sweep(object):
    """One sweep run; ``params`` is the module's parameter dict (see vllm_sweep)."""

    def __init__(self, params):
        check_params(params)
        self.p = dict(params)
        self.base = self.p["base_url"].rstrip("/")
        self.metrics_url = self.p.get("metrics_url") or self.base + "/metrics"
        self.headers = _headers(self.p.get("api_key"))
        self.seed = self.p.get("seed")
        if self.seed is None:  # fresh per run: a re-run must not hit the previous run's cache
            self.seed = int.from_bytes(os.urandom(4), "big")
        self.vocab_size = self.p.get("vocab_size")
        self.server = {}
        self.t0 = time.perf_counter()
        self.session = None

    # --- preflight -----------------------------------------------------------------------
    async def _get(self, url, timeout=10.0):
        async with self.session.get(url, headers=self.headers,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            return r.status, await r.text()

    async def preflight(self):
        url = self.base + "/v1/models"
        try:
            status, text = await self._get(url)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise SweepError("cannot reach the server at %s (base_url): %s: %s"
                             % (url, type(e).__name__, e))
        if status in (401, 403):
            raise SweepError("%s answered HTTP %d: check api_key" % (url, status))
        if status != 200:
            raise SweepError("%s answered HTTP %d: %s" % (url, status, _short(text)))
        try:
            models = json.loads(text)["data"]
        except (ValueError, KeyError, TypeError):
            raise SweepError("%s did not return an OpenAI model list: %s" % (url, _short(text)))
        served = [m.get("id") for m in models]
        entry = [m for m in models if m.get("id") == self.p["model"]]
        if not entry:
            raise SweepError("model %r is not served at %s; served model names: %s"
                             % (self.p["model"], self.base, ", ".join(map(str, served))))
        max_len = entry[0].get("max_model_len")
        need = self.p["input_len"] + self.p["output_len"]
        if max_len and need > max_len:
            raise SweepError("input_len + output_len = %d exceeds the server's max_model_len %d"
                             % (need, max_len))
        self.server = {"served_models": served, "max_model_len": max_len}
        if self.p["endpoint"] == "completions" and self.vocab_size is None:
            self.vocab_size = await self._probe_vocab()
        self.server["vocab_size"] = self.vocab_size
        before = await self.scrape()
        self.server["metrics_available"] = before is not None

    async def _probe_token(self, token_id):
        """One probe: True (accepted), False (refused as out of vocabulary), or a string that
        says why no verdict came (the connection dropped, or HTTP 5xx)."""
        body = {"model": self.p["model"], "prompt": [token_id], "max_tokens": 1}
        headers = dict(self.headers)
        headers["Connection"] = "close"  # a fresh connection each: a drop belongs to this probe
        try:
            async with self.session.post(self.base + "/v1/completions", json=body,
                                         headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
                                         ) as r:
                status, text = r.status, await r.text()
        except asyncio.TimeoutError:  # before OSError: TimeoutError is one on Python >= 3.11
            raise SweepError("vocabulary probe with token id %d got no answer within %d s "
                             "from %s/v1/completions; pass vocab_size to skip the probe"
                             % (token_id, PROBE_TIMEOUT_S, self.base))
        except (aiohttp.ClientError, OSError) as e:
            return "%s: %s" % (type(e).__name__, _short(e, 200) or "connection dropped")
        if status == 200:
            return True
        if status == 400 and "vocab" in text.lower():
            return False
        if status >= 500:
            return "HTTP %d: %s" % (status, _short(text, 200))
        raise SweepError("vocabulary probe with token id %d got HTTP %d: %s"
                         % (token_id, status, _short(text)))

    async def _token_ok(self, token_id):
        """Whether the server accepts ``token_id`` as a prompt token.

        Some servers do not answer an out-of-vocabulary id with HTTP 400: vLLM 0.25 raises an
        unhandled ValueError and drops the connection, others answer 5xx. Such a probe counts
        as "out of range" only when the server still accepts token id 0 right after it; when it
        does not, the server stopped answering and the sweep fails (SweepError).
        """
        verdict = await self._probe_token(token_id)
        if verdict is True or verdict is False:
            return verdict
        alive = verdict if token_id == 0 else await self._probe_token(0)
        if alive is True:
            return False
        what = "token id %d: %s" % (token_id, verdict)
        if token_id != 0:
            what += "; token id 0 after it: %s" % (
                "refused as out of vocabulary" if alive is False else alive)
        raise SweepError("the server at %s stopped answering during the vocabulary probe (%s); "
                         "check the server's log, or pass vocab_size to skip the probe"
                         % (self.base, what))

    async def _probe_vocab(self):
        """Largest valid prompt token id + 1, by binary search over validation errors."""
        lo, hi = 0, VOCAB_PROBE_MAX  # lo valid, hi assumed invalid
        if not await self._token_ok(lo):
            raise SweepError("the server rejects token id 0; pass vocab_size")
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if await self._token_ok(mid):
                lo = mid
            else:
                hi = mid
        return lo + 1

    async def scrape(self):
        """Server counters from /metrics, or None when they cannot be read."""
        try:
            status, text = await self._get(self.metrics_url)
            if status != 200:
                return None
            counters = server_counters(text)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError):
            return None
        if counters.get("output_tokens") is None:
            return None
        return counters

    # --- requests ------------------------------------------------------------------------
    def _body(self, rng):
        p = self.p
        n = p["output_len"]
        stream_options = {"include_usage": True}
        if p.get("chunk_usage"):
            stream_options["continuous_usage_stats"] = True
        body = {"model": p["model"], "max_tokens": n, "min_tokens": n, "ignore_eos": True,
                "temperature": 0.0, "stream": True, "stream_options": stream_options}
        if p["endpoint"] == "chat":
            words = " ".join(rng.choice(CHAT_WORDS) for _unused in range(p["input_len"]))
            body["messages"] = [{"role": "user", "content": words}]
        else:
            v = self.vocab_size
            body["prompt"] = [rng.randrange(v) for _unused in range(p["input_len"])]
        return json.dumps(body).encode()

    async def request(self, rec, body):
        url = self.base + ("/v1/chat/completions" if self.p["endpoint"] == "chat"
                           else "/v1/completions")
        timeout = aiohttp.ClientTimeout(total=self.p["request_timeout_s"])
        last_ct = 0
        usage = None
        rec.start = time.perf_counter()
        try:
            async with self.session.post(url, data=body, headers=self.headers,
                                         timeout=timeout) as resp:
                if resp.status != 200:
                    rec.error = "HTTP %d: %s" % (resp.status, _short(await resp.text(), 200))
                    return
                buf = b""
                done = False
                async for data in resp.content.iter_any():
                    now = time.perf_counter()
                    buf += data
                    lines = buf.split(b"\n")
                    buf = lines.pop()
                    for line in lines:
                        if not line.startswith(b"data:"):
                            continue  # blank separators, comments, event names
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                            break
                        obj = json.loads(payload)
                        if "error" in obj:
                            rec.error = "stream error: %s" % _short(obj["error"], 200)
                            return
                        u = obj.get("usage")
                        if obj.get("choices"):
                            if u is not None:  # continuous usage: tokens in this chunk
                                ct = u.get("completion_tokens") or 0
                                if ct > last_ct:
                                    rec.chunk_times.append(now)
                                    if rec.chunk_tokens is not None:
                                        rec.chunk_tokens.append(ct - last_ct)
                                    last_ct = ct
                            else:  # a token chunk; how many tokens it holds is unknown
                                d = obj["choices"][0].get("delta")
                                # (chat: not the opening chunk that only names the role)
                                if d is None or "role" not in d or d.get("content"):
                                    rec.chunk_times.append(now)
                                    rec.chunk_tokens = None
                        elif u is not None:
                            usage = u
                    if done:
                        break
        except asyncio.TimeoutError:
            rec.error = "timeout after %ss (request_timeout_s)" % self.p["request_timeout_s"]
        except (aiohttp.ClientError, OSError, ValueError) as e:
            rec.error = "%s: %s" % (type(e).__name__, _short(e, 200))
        finally:
            rec.end = time.perf_counter()
        if rec.error is None:
            if usage is None:
                rec.error = "stream ended without a usage report"
            else:
                rec.completion_tokens = usage.get("completion_tokens")
                rec.prompt_tokens = usage.get("prompt_tokens")
                if not rec.chunk_times:
                    rec.error = "no token chunk received"

    # --- one level -----------------------------------------------------------------------
    async def run_level(self, conc):
        p = self.p
        warmup = p.get("warmup_requests")
        warmup = conc if warmup is None else warmup
        min_req = p.get("min_requests") or default_min_requests(conc)
        duration = float(p["duration_s"])
        rng = random.Random("%d/%d" % (self.seed, conc))
        records = []
        state = {"w0": None, "w1": None, "measured": 0, "stop": False, "aborted": None,
                 "failed": 0}
        level_start = time.perf_counter()
        cpu_start = time.process_time()
        if warmup == 0:
            state["w0"], state["cpu_w0"] = level_start, cpu_start
        before = await self.scrape()

        def on_done(rec):
            records.append(rec)
            if rec.error is not None:
                state["failed"] += 1
                ok = len(records) - state["failed"]
                if state["failed"] >= max(10, conc) and state["failed"] > ok:
                    state["aborted"] = "aborted: %d of %d requests failed" % (
                        state["failed"], len(records))
                    state["stop"] = True
                    if state["w0"] is not None:
                        state["w1"] = rec.end
                    return
            if state["w0"] is None:
                if len(records) >= warmup:
                    state["w0"] = rec.end
                    state["cpu_w0"] = time.process_time()
                return
            if rec.start >= state["w0"]:
                state["measured"] += 1
            if (rec.end >= state["w0"] + duration and state["measured"] >= min_req
                    and not state["stop"]):
                state["w1"] = rec.end
                state["cpu_w1"] = time.process_time()
                state["stop"] = True

        async def worker(wid):
            while not state["stop"]:
                rec = Record(level=conc, worker=wid, expected_tokens=p["output_len"],
                             chunk_tokens=[])
                await self.request(rec, self._body(rng))
                on_done(rec)

        lags = []
        ticking = {"on": True}

        async def ticker():
            loop_prev = time.perf_counter()
            while ticking["on"]:
                await asyncio.sleep(LOOP_TICK_S)
                now = time.perf_counter()
                lags.append((now, max(0.0, now - loop_prev - LOOP_TICK_S)))
                loop_prev = now

        tick = asyncio.ensure_future(ticker())
        try:
            await asyncio.gather(*[worker(i) for i in range(conc)])
        finally:
            ticking["on"] = False
            await tick
        level_end = time.perf_counter()
        cpu_level = time.process_time() - cpu_start
        after = await self.scrape()

        w0, w1 = state["w0"], state["w1"]
        if w0 is None or w1 is None or w1 <= w0:  # aborted before a window could close
            w0 = level_start
            w1 = max([r.end for r in records] + [level_start + 1e-6])
            state.setdefault("cpu_w0", cpu_start)
            state["cpu_w1"] = state.get("cpu_w1") or time.process_time()
        summary = summarize_level(records, conc, w0, w1, p["output_len"], slo=self.slo())
        win_lags = [x for t, x in lags if w0 <= t <= w1] or [x for _unused, x in lags]
        cpu_win = state.get("cpu_w1", cpu_level) - state.get("cpu_w0", 0.0)
        lag_p99 = (percentile(win_lags, 99) or 0.0) * 1000.0
        cpu_util = cpu_win / (w1 - w0)
        total_out = sum(r.completion_tokens or 0 for r in records)
        limited = []
        if lag_p99 > LOOP_LAG_LIMIT_MS:
            limited.append("event-loop lag p99 %.1f ms > %.1f ms" % (lag_p99, LOOP_LAG_LIMIT_MS))
        if cpu_util > CPU_LIMIT:
            limited.append("client CPU %.0f%% of a core > %.0f%%"
                           % (cpu_util * 100, CPU_LIMIT * 100))
        summary["client"] = {
            "cpu_s_level": round(cpu_level, 4),
            "cpu_s_window": round(cpu_win, 4),
            "cpu_util_window": round(cpu_util, 4),
            "cpu_ms_per_1k_output_tokens": round(cpu_level * 1e6 / total_out, 3)
            if total_out else None,
            "loop_lag_ms": {
                "p50": round((percentile(win_lags, 50) or 0.0) * 1000.0, 3),
                "p99": round(lag_p99, 3),
                "max": round(max(win_lags or [0.0]) * 1000.0, 3),
            },
            "client_limited": bool(limited),
            "client_limited_reasons": limited,
        }
        summary["timing"] = {
            "warmup_s": round(w0 - level_start, 4),
            "drain_s": round(max(level_end - w1, 0.0), 4),
            "level_s": round(level_end - level_start, 4),
            "warmup_requests": warmup,
            "min_requests": min_req,
        }
        summary["aborted"] = state["aborted"]
        summary["server_check"] = server_cross_check(before, after, records)
        return summary, records, (w0, w1)

    def slo(self):
        return {"ttft_ms": self.p.get("slo_ttft_ms"), "tpot_ms": self.p.get("slo_tpot_ms"),
                "e2e_ms": self.p.get("slo_e2e_ms")}

    # --- whole sweep ---------------------------------------------------------------------
    async def run(self, log_path=None):
        """Preflight, then the levels; the request log is opened only once preflight passed."""
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE) as s:
            self.session = s
            cpu0 = time.process_time()
            await self.preflight()
            log = None
            if log_path:
                try:
                    log = open(log_path, "w")
                except (IOError, OSError) as e:
                    raise RequestLogError("request_log_path %s: %s" % (log_path, e))
            try:
                return await self._levels(log, cpu0, log_path)
            finally:
                if log is not None:
                    log.close()  # write_log flushed every level: nothing is left to fail

    async def _levels(self, log, cpu0, log_path=None):
        levels, prev, stop_reason, signals = [], None, None, []
        for conc in self.p["levels"]:
            summary, records, (w0, w1) = await self.run_level(conc)
            levels.append(summary)
            if log is not None:
                try:
                    self.write_log(log, records, w0, w1)
                except (IOError, OSError) as e:
                    raise RequestLogError("request_log_path %s: %s" % (log_path, e))
            reason = saturation_check(prev, summary, self.p["saturation_threshold"])
            if reason and summary["client"]["client_limited"]:
                reason += " (level was client-limited: the client may be the bottleneck)"
            summary["saturation_signal"] = reason
            if reason:
                signals.append(reason)
                if self.p.get("stop_on_saturation", True):
                    stop_reason = "stopped after concurrency %d: %s" % (conc, reason)
                    break
            prev = summary
        if stop_reason is None:
            stop_reason = "ran all levels" + (
                "; signals: " + " | ".join(signals) if signals else
                "; no saturation signal")
        client = {
            "python": sys.executable,
            "python_version": "%d.%d.%d" % sys.version_info[:3],
            "aiohttp_version": aiohttp.__version__,
            "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            "metrics_parser": PROMETHEUS_PARSER,
            "cpu_s_total": round(time.process_time() - cpu0, 4),
            "loop_lag_limit_ms": LOOP_LAG_LIMIT_MS,
            "cpu_limit": CPU_LIMIT,
        }
        params = dict((k, v) for k, v in self.p.items() if k != "api_key")
        params["seed"] = self.seed
        params["metrics_url"] = self.metrics_url
        return {"levels": levels, "headline": headline(levels), "stop_reason": stop_reason,
                "parameters": params, "client": client, "server": self.server}

    def write_log(self, fh, records, w0, w1):
        for r in records:
            d = r.to_dict(self.t0)
            d["phase"] = ("warmup" if r.end <= w0 else "drain" if r.end > w1 else "window")
            d["measured"] = bool(r.start >= w0 and r.end <= w1)
            fh.write(json.dumps(d, sort_keys=True) + "\n")
        fh.flush()


def loop_factory(choice="auto"):
    """The event loop factory for ``event_loop``: uvloop's when asked for, or with "auto" when
    it is importable (vLLM depends on it, so its venv has it) and Python >= 3.11 (whose
    asyncio.Runner takes a factory); None means asyncio's own loop. uvloop cuts the client's
    CPU per streamed chunk, which is what a closed-loop client mostly spends."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SweepError("event_loop=uvloop but uvloop is not importable by %s"
                             % sys.executable)
        return None
    if sys.version_info < (3, 11):
        if choice == "uvloop":
            raise SweepError("event_loop=uvloop needs Python >= 3.11 (this is %d.%d)"
                             % sys.version_info[:2])
        return None
    return uvloop.new_event_loop


def run_sweep(params, request_log_path=None):
    """Run the whole sweep synchronously; returns the facts dict. Raises SweepError (its
    subclass RequestLogError when the request log cannot be opened or written)."""
    if not HAS_AIOHTTP:
        raise SweepError("aiohttp is not importable by %s" % sys.executable)
    sweep = Sweep(params)  # validates the parameters
    factory = loop_factory(params.get("event_loop") or "auto")
    coro = sweep.run(log_path=request_log_path)
    if factory is None:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
