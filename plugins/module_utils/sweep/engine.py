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

Prompts (``prompt_format: token_ids``, the default) are random token-id lists of exactly
``input_len`` tokens drawn from the server's vocabulary (its size is learned with a binary search over ``/v1/completions`` validation
errors unless given; a probe whose connection drops or that gets HTTP 5xx counts as out of range
only while the server still accepts token id 0), from a generator seeded once per run and per level, so no level reuses
another's prompts and prefix caching cannot flatter later levels. Output length is forced with
``max_tokens = min_tokens = output_len`` and ``ignore_eos``. With ``prompt_format: text`` a
completions prompt is text, as `vllm bench serve`'s random dataset sends it, so the server's
tokenization is part of every request (see ``Sweep._text_setup``): random words, each one token
after a space in the server's tokenizer, as many as make exactly ``input_len`` prompt tokens with
the special tokens the server adds (BOS), checked with ``/tokenize`` before the first level.
Every request's ``usage.prompt_tokens`` is compared with ``input_len`` (``input_length``). Counts come from the server's
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

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.level import (
    CPU_LIMIT, LOOP_LAG_LIMIT_MS, LevelState, Sampler, default_min_requests, gc_quiet,
    gc_restore, repeats_summary)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (
    Record, headline, saturation_check, summarize_level)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.preflight import PreflightMixin
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.prometheus import (
    PROMETHEUS_PARSER, server_cross_check)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import (
    SECRET_PARAMS, RequestLogError, SweepError, SweepSettings, request_headers, short)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.workers import (
    READ_BUFSIZE, WorkersMixin)
# the streaming hot path (the SSE rules, the native transport): _stream
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep._stream import (
    NativeClient, SSEStream)

CHAT_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
              "november oscar papa quebec romeo sierra tango uniform victor whiskey xray "
              "yankee zulu").split()


class Sweep(PreflightMixin, WorkersMixin):
    """One sweep run; ``params`` is the module's parameter dict (see vllm_sweep), checked and
    typed into ``self.s`` (:class:`SweepSettings`)."""

    def __init__(self, params):
        self.s = SweepSettings.from_params(params)
        self.params = dict(params)  # as given: what agents get and the results report
        self.base = self.s.base_url.rstrip("/")
        self.metrics_url = self.s.metrics_url or self.base + "/metrics"
        self.headers = request_headers(self.s.api_key)
        self.seed = self.s.seed
        if self.seed is None:  # fresh per run: a re-run must not hit the previous run's cache
            self.seed = int.from_bytes(os.urandom(4), "big")
        self.vocab_size = self.s.vocab_size
        self.prompt_format = self.s.prompt_format
        self.text = None  # prompt_format text: the words (set by the preflight, see _text_setup)
        self.server = {}
        self.t0 = time.perf_counter()
        self.session = None
        self.pool = None  # worker processes (processes > 1), see run_sweep
        self.connections = {"opened": 0}
        self.children_cpu = 0.0
        self.native = None  # stream_transport native: the streaming connections (see _open)

    # --- agents (load_generators) -----------------------------------------------------------
    AGENT_DROP = ("load_generators", "load_generator_authkey", "processes")

    def agent_setup(self):
        """What an agent needs to send this sweep's requests: the parameters (with api_key,
        without the agents' key), the seed and what the preflight learned."""
        p = dict((k, v) for k, v in self.params.items() if k not in self.AGENT_DROP)
        p["seed"] = self.seed
        p["vocab_size"] = self.vocab_size
        return {"params": p, "text": self.text, "server": dict(self.server)}

    @classmethod
    def for_agent(cls, setup):
        sweep = cls(setup["params"])
        sweep.text = setup.get("text")
        sweep.server = setup.get("server") or {}
        return sweep

    # --- requests ------------------------------------------------------------------------
    def _body(self, rng):
        s = self.s
        n = s.output_len
        stream_options = {"include_usage": True}
        if s.chunk_usage:
            stream_options["continuous_usage_stats"] = True
        body = {"model": s.model, "max_tokens": n, "min_tokens": n, "ignore_eos": True,
                "temperature": 0.0, "stream": True, "stream_options": stream_options}
        if s.endpoint == "chat":
            words = " ".join(rng.choice(CHAT_WORDS) for _unused in range(s.input_len))
            body["messages"] = [{"role": "user", "content": words}]
        elif self.text is not None:
            body["prompt"] = self._text_prompt(rng)
        else:
            v = self.vocab_size
            body["prompt"] = [rng.randrange(v) for _unused in range(s.input_len)]
        return json.dumps(body).encode()

    async def request(self, rec, body):
        chat = self.s.endpoint == "chat"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        chunk_usage = bool(self.s.chunk_usage)
        if self.native is not None:
            await self.native.stream(rec, path, body, self.s.request_timeout_s, chat=chat,
                                     chunk_usage=chunk_usage)
            return
        timeout = aiohttp.ClientTimeout(total=self.s.request_timeout_s)
        sse = SSEStream(rec, chat=chat, chunk_usage=chunk_usage)
        rec.start = time.perf_counter()
        try:
            async with self.session.post(self.base + path, data=body, headers=self.headers,
                                         timeout=timeout) as resp:
                if resp.status != 200:
                    rec.error = "HTTP %d: %s" % (resp.status, short(await resp.text(), 200))
                    return
                # read to the end of the body even after [DONE]: aiohttp closes a connection
                # whose body was not read to its end, and the next request would then pay a
                # new TCP connection (and the server's accept) inside its TTFT
                async for data in resp.content.iter_any():
                    sse.feed(data, time.perf_counter())
        except asyncio.TimeoutError:
            rec.error = "timeout after %ss (request_timeout_s)" % self.s.request_timeout_s
        except (aiohttp.ClientError, OSError, ValueError) as e:
            rec.error = "%s: %s" % (type(e).__name__, short(e, 200))
        finally:
            rec.end = time.perf_counter()
        sse.finish()

    # --- one level -----------------------------------------------------------------------
    def level_settings(self, conc):
        s = self.s
        warmup = s.warmup_requests
        return {"warmup": conc if warmup is None else warmup,
                "min_requests": s.min_requests or default_min_requests(conc),
                "duration": float(s.duration_s),
                "precision_pct": s.precision_pct,
                "min_lifetimes": s.min_lifetimes,
                "max_duration": s.max_duration_s}

    async def run_level(self, conc):
        """One level: C closed-loop workers in this process, or spread over the worker
        processes (``processes`` > 1); returns (summary, records, (w0, w1))."""
        if self.pool is not None:
            return await self._run_level_pool(conc)
        cfg = self.level_settings(conc)
        rng = random.Random("%d/%d" % (self.seed, conc))
        gc_info = gc_quiet(self.s)
        before = await self.scrape()
        opened0 = self.connections["opened"]
        level_start = time.perf_counter()
        cpu_start = time.process_time()
        state = LevelState(conc, cfg, level_start)
        output_len = self.s.output_len

        async def worker(wid):
            while not state.stop:
                rec = Record(level=conc, worker=wid, expected_tokens=output_len,
                             chunk_tokens=[])
                await self.request(rec, self._body(rng))
                state.feed(rec)

        sampler = Sampler()
        tick = asyncio.ensure_future(sampler.run())
        try:
            await asyncio.gather(*[worker(i) for i in range(conc)])
        finally:
            sampler.on = False
            await tick
            gc_info = gc_restore(gc_info)
        level_end = time.perf_counter()
        cpu_level = time.process_time() - cpu_start
        after = await self.scrape()
        w0, w1 = state.window(level_start)
        proc = sampler.health(w0, w1, 0, conc)
        client = {
            "processes": 1,
            "cpu_s_level": round(cpu_level, 4),
            "cpu_s_window": proc["cpu_s_window"],
            "cpu_util_window": proc["cpu_util_window"],
            "loop_lag_ms": proc["loop_lag_ms"],
            "client_limited": proc["client_limited"],
            "client_limited_reasons": proc["client_limited_reasons"],
            "connections_opened": self.connections["opened"] - opened0,
            "gc": gc_info,
        }
        return self._finish_level(conc, cfg, state, client, before, after, level_start,
                                  level_end, w0, w1)

    def _finish_level(self, conc, cfg, state, client, before, after, level_start, level_end,
                      w0, w1):
        records = state.records
        summary = summarize_level(
            records, conc, w0, w1, self.s.output_len, slo=self.slo(),
            also_slos=self.s.also_slos,
            expected_prompt_tokens=(self.s.input_len if self.s.endpoint == "completions"
                                    else None),
            prompt_format=self.server.get("prompt_format") or self.prompt_format)
        total_out = sum(r.completion_tokens or 0 for r in records)
        client["cpu_ms_per_1k_output_tokens"] = (
            round(client["cpu_s_level"] * 1e6 / total_out, 3) if total_out else None)
        summary["client"] = client
        summary["timing"] = {
            "warmup_s": round(w0 - level_start, 4),
            "drain_s": round(max(level_end - w1, 0.0), 4),
            "level_s": round(level_end - level_start, 4),
            "warmup_requests": cfg["warmup"],
            "min_requests": cfg["min_requests"],
            "stopped_by": state.stopped_by,
        }
        summary["aborted"] = state.aborted
        summary["server_check"] = server_cross_check(before, after, records)
        return summary, records, (w0, w1)

    def _open_native(self):
        """stream_transport native: the requests' own keep-alive connections (sweep_stream)."""
        if self.s.stream_transport != "native":
            return

        def opened():
            self.connections["opened"] += 1
        self.native = NativeClient(self.base, self.headers, on_open=opened)

    def _close_native(self):
        if self.native is not None:
            self.native.close()
            self.native = None

    def _trace(self):
        trace = aiohttp.TraceConfig()

        async def opened(_session, _ctx, _params):
            self.connections["opened"] += 1
        trace.on_connection_create_end.append(opened)
        return trace

    def slo(self):
        return {"ttft_ms": self.s.slo_ttft_ms, "tpot_ms": self.s.slo_tpot_ms,
                "e2e_ms": self.s.slo_e2e_ms}

    # --- whole sweep ---------------------------------------------------------------------
    async def run_preflight(self):
        """The preflight alone, in its own session (before worker processes are forked)."""
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE) as s:
            self.session = s
            await self.preflight()
        self.session = None

    async def run(self, log_path=None, preflight=True):
        """Preflight, then the levels; the request log is opened only once preflight passed."""
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE,
                                         trace_configs=[self._trace()]) as s:
            self.session = s
            cpu0 = time.process_time()
            if preflight:
                await self.preflight()
            self._open_native()
            log = None
            if log_path:
                try:
                    log = open(log_path, "w")
                except (IOError, OSError) as e:
                    raise RequestLogError("request_log_path %s: %s" % (log_path, e))
            try:
                return await self._levels(log, cpu0, log_path)
            finally:
                self._close_native()
                if log is not None:
                    log.close()  # write_log flushed every level: nothing is left to fail

    async def _levels(self, log, cpu0, log_path=None):
        levels, prev, stop_reason, signals = [], None, None, []
        for conc in self.s.levels:
            runs = []
            for rep in range(self.s.repeats):
                summary, records, (w0, w1) = await self.run_level(conc)
                runs.append(summary)
                if log is not None:
                    try:
                        self.write_log(log, records, w0, w1, rep)
                    except (IOError, OSError) as e:
                        raise RequestLogError("request_log_path %s: %s" % (log_path, e))
            summary = runs[0]
            if len(runs) > 1:
                summary.update(repeats_summary(runs))
            levels.append(summary)
            reason = saturation_check(prev, summary, self.s.saturation_threshold)
            if reason and summary["client"]["client_limited"]:
                reason += " (level was client-limited: the client may be the bottleneck)"
            summary["saturation_signal"] = reason
            if reason:
                signals.append(reason)
                if self.s.stop_on_saturation:
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
            "stream_transport": self.s.stream_transport,
            "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            "metrics_parser": PROMETHEUS_PARSER,
            "cpu_s_total": round(time.process_time() - cpu0 + self.children_cpu, 4),
            "processes": len(self.s.load_generators) or self.s.processes,
            "load_generators": ["%s:%d" % (lg["host"], lg["port"])
                                for lg in self.s.load_generators],
            "loop_lag_limit_ms": LOOP_LAG_LIMIT_MS,
            "cpu_limit": CPU_LIMIT,
        }
        params = dict((k, v) for k, v in self.params.items() if k not in SECRET_PARAMS)
        params["seed"] = self.seed
        params["metrics_url"] = self.metrics_url
        return {"levels": levels, "headline": headline(levels), "stop_reason": stop_reason,
                "parameters": params, "client": client, "server": self.server}

    def write_log(self, fh, records, w0, w1, repeat=0):
        for r in records:
            d = r.to_dict(self.t0)
            d["repeat"] = repeat
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
