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
import gc
import json
import multiprocessing
import os
import random
import socket
import sys
import time

try:
    import aiohttp
    HAS_AIOHTTP = True
except ImportError:  # the module reports this with the interpreter's path
    aiohttp = None
    HAS_AIOHTTP = False

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.metrics import (
    PROMETHEUS_PARSER, Record, headline, percentile, precision, saturation_check,
    server_counters, server_cross_check, summarize_level)
# the streaming hot path (the SSE rules, the native transport): sweep_stream
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep._stream import (
    Endpoint, NativeClient, SSEStream)

READ_BUFSIZE = 4 * 1024 * 1024
LOOP_TICK_S = 0.01
LOOP_LAG_LIMIT_MS = 10.0
# A worker process or agent sends a heartbeat when it has had nothing to send for this long;
# the parent fails the level when one is silent for SILENCE_LIMIT_S (a load-generator host
# that stopped answering without closing its connection: a partition, a stopped process).
HEARTBEAT_S = 1.0
SILENCE_LIMIT_S = 30.0
CPU_LIMIT = 0.8
VOCAB_PROBE_MAX = 1 << 21  # larger than any tokenizer's vocabulary
PROBE_TIMEOUT_S = 60
STREAM_TRANSPORTS = ("native", "aiohttp")
PROMPT_FORMATS = ("token_ids", "text")
# prompt_format text: candidate words (common English, and the words the project's tiny
# tokenizer is trained on); the preflight keeps those that are one token after a space
PROMPT_WORDS = tuple(sorted(set((
    "the a an of to in for on with as at by from about into over after under between "
    "model token server request response stream latency throughput batch queue cache memory "
    "gpu cpu node host cluster network switch link bandwidth kernel driver version install "
    "deploy verify benchmark level concurrency window sample prompt output input length "
    "weights tensor parallel pipeline expert attention layer head vector matrix value key "
    "fast slow small large first last next ready healthy failed started stopped restart "
    "one two three four five six seven eight nine ten hundred thousand million "
    "is are was were be been has have had do does did can will would should may might "
    "and or but not no yes all any some each every other more most many much few new old "
    "good great long short high low big little right left same different own just only "
    "time year day week people man woman child world life hand part place case point group "
    "number way work system program question government company state house water room "
    "he she it we they you i me him her us them my your his its our their this that these "
    "those what which who when where why how there here then now also very well even back "
    "up down out off again still never always often make take come give look use find tell "
    "ask seem feel try leave call keep let begin show hear play run move live believe hold "
    "bring write stand lose pay meet include continue set learn change lead understand watch "
    "follow stop create speak read spend grow open walk win offer remember love consider "
    "appear buy wait serve die send expect build stay fall cut reach kill remain").split())))
TEXT_MIN_WORDS = 16        # fewer one-token words than this: prompts would repeat too often
TEXT_CHECK_PROMPTS = 8     # random prompts tokenized at preflight, each must be input_len
TOKENIZE_CONCURRENCY = 8
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
    fmt = p.get("prompt_format") or "token_ids"
    if fmt not in PROMPT_FORMATS:
        raise SweepError("prompt_format must be 'token_ids' or 'text', got %r" % (fmt,))
    if fmt == "text" and p.get("endpoint") == "chat":
        raise SweepError("prompt_format=text applies to endpoint=completions (chat prompts are "
                         "always text, their length set by the chat template)")
    if (p.get("stream_transport") or "native") not in STREAM_TRANSPORTS:
        raise SweepError("stream_transport must be 'native' or 'aiohttp', got %r"
                         % (p.get("stream_transport"),))
    if p.get("repeats") is not None and (not isinstance(p["repeats"], int) or p["repeats"] < 1):
        raise SweepError("repeats must be an integer >= 1, got %r" % (p["repeats"],))
    if p.get("processes") is not None and (not isinstance(p["processes"], int)
                                           or p["processes"] < 1):
        raise SweepError("processes must be an integer >= 1, got %r" % (p["processes"],))
    check_load_generators(p)
    if p.get("precision_pct") is not None and not 0 < p["precision_pct"] < 100:
        raise SweepError("precision_pct must be in (0, 100) when given, got %r"
                         % (p["precision_pct"],))
    if p.get("max_duration_s") is not None and p["max_duration_s"] < p.get("duration_s", 0):
        raise SweepError("max_duration_s must be >= duration_s (%r), got %r"
                         % (p.get("duration_s"), p["max_duration_s"]))
    if p.get("vocab_size") is not None and p["vocab_size"] < 2:
        raise SweepError("vocab_size must be >= 2 when given, got %r" % (p["vocab_size"],))
    if p.get("base_url") is not None and (p.get("stream_transport") or "native") == "native":
        try:
            Endpoint(p["base_url"])
        except ValueError as e:
            raise SweepError(str(e))


def check_load_generators(p):
    """load_generators: a list of {host, port}; needs load_generator_authkey, excludes
    processes > 1 (each agent is one client process; start more agents for more cores)."""
    lgs = p.get("load_generators") or []
    if not lgs:
        return
    if not isinstance(lgs, (list, tuple)):
        raise SweepError("load_generators must be a list of {host, port}, got %r" % (lgs,))
    seen = set()
    for i, lg in enumerate(lgs):
        if not isinstance(lg, dict) or not lg.get("host") or not isinstance(
                lg.get("port"), int) or not 0 < lg["port"] < 65536:
            raise SweepError("load_generators[%d] must be {host: <name or address>, port: "
                             "<1-65535>}, got %r" % (i, lg))
        key = (lg["host"], lg["port"])
        if key in seen:
            raise SweepError("load_generators[%d] repeats %s:%d" % (i, lg["host"], lg["port"]))
        seen.add(key)
    if not p.get("load_generator_authkey"):
        raise SweepError("load_generators needs load_generator_authkey (the agents' secret)")
    if int(p.get("processes") or 1) > 1:
        raise SweepError("processes (%d) applies to a sweep without load_generators; each "
                         "agent runs one client process (start more agents for more cores)"
                         % p["processes"])
    if len(lgs) > max(p.get("levels") or [1]):
        raise SweepError("load_generators lists %d agents, more than the largest level (%d)"
                         % (len(lgs), max(p.get("levels") or [1])))


SECRET_PARAMS = ("api_key", "load_generator_authkey")


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
        self.prompt_format = self.p.get("prompt_format") or "token_ids"
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
        p = dict((k, v) for k, v in self.p.items() if k not in self.AGENT_DROP)
        p["seed"] = self.seed
        p["vocab_size"] = self.vocab_size
        return {"params": p, "text": self.text, "server": dict(self.server)}

    @classmethod
    def for_agent(cls, setup):
        sweep = cls(setup["params"])
        sweep.text = setup.get("text")
        sweep.server = setup.get("server") or {}
        return sweep

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
        if self.p["endpoint"] == "completions" and self.prompt_format == "text":
            self.server["prompt_text"] = await self._text_setup()
        elif self.p["endpoint"] == "completions" and self.vocab_size is None:
            self.vocab_size = await self._probe_vocab()
        self.server["vocab_size"] = self.vocab_size
        self.server["prompt_format"] = (self.prompt_format if self.p["endpoint"] == "completions"
                                        else "chat")
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

    # --- prompt_format text ----------------------------------------------------------------
    async def _tokenize(self, text, special=True):
        """Prompt tokens of ``text`` as the server counts them (``POST /tokenize``, the
        completions API's tokenization: special tokens added unless ``special`` is False)."""
        url = self.base + "/tokenize"
        body = {"model": self.p["model"], "prompt": text, "add_special_tokens": special}
        try:
            async with self.session.post(url, json=body, headers=self.headers,
                                         timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
                                         ) as r:
                status, answer = r.status, await r.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise SweepError("prompt_format=text needs the server's /tokenize endpoint: %s: "
                             "%s: %s; use prompt_format=token_ids"
                             % (url, type(e).__name__, _short(e, 200)))
        if status != 200:
            raise SweepError("prompt_format=text needs the server's /tokenize endpoint: %s "
                             "answered HTTP %d: %s; use prompt_format=token_ids"
                             % (url, status, _short(answer, 200)))
        try:
            data = json.loads(answer)
            count = data["count"] if "count" in data else len(data["tokens"])
        except (ValueError, KeyError, TypeError):
            raise SweepError("prompt_format=text: %s did not return a token count: %s; use "
                             "prompt_format=token_ids" % (url, _short(answer, 200)))
        return int(count)

    async def _tokenize_many(self, texts):
        sem = asyncio.Semaphore(TOKENIZE_CONCURRENCY)

        async def one(t):
            async with sem:
                return await self._tokenize(t)
        return await asyncio.gather(*[one(t) for t in texts])

    async def _text_setup(self):
        """Words for prompt_format text, learned from the server's tokenizer.

        The special tokens a prompt gets: /tokenize of one word with and without them (vllm
        bench serve's ``num_special_tokens_to_add``). Words that are one token after a space:
        ``anchor + " " + w`` counts one more than ``anchor``. The first word stands at the start
        of the text, without a space before it: those of the words that are one token there too
        (with the special tokens), else the prompt starts with a space and any word. A prompt is
        the first word and ``input_len - special - 1`` more, drawn with the level's seeded
        generator; TEXT_CHECK_PROMPTS random ones must count exactly ``input_len`` (else the
        sweep fails here, naming prompt_format).
        """
        anchor = "the"
        n_anchor = await self._tokenize(anchor)
        special = n_anchor - await self._tokenize(anchor, special=False)
        n_words = self.p["input_len"] - special
        if special < 0 or n_words < 1:
            raise SweepError("prompt_format=text: the server adds %d special tokens to a prompt, "
                             "so input_len %d cannot be made of words; raise input_len or use "
                             "prompt_format=token_ids" % (special, self.p["input_len"]))
        counts = await self._tokenize_many([anchor + " " + w for w in PROMPT_WORDS])
        words = [w for w, c in zip(PROMPT_WORDS, counts) if c - n_anchor == 1]
        if len(words) < TEXT_MIN_WORDS:
            raise SweepError("prompt_format=text: only %d of %d candidate words are one token "
                             "after a space in the server's tokenizer (at least %d needed); use "
                             "prompt_format=token_ids" % (len(words), len(PROMPT_WORDS),
                                                          TEXT_MIN_WORDS))
        lead = ""
        counts = await self._tokenize_many(words)
        first = [w for w, c in zip(words, counts) if c == special + 1]
        if not first:  # e.g. a tokenizer that knows words only after a space
            lead = " "
            counts = await self._tokenize_many([" " + w for w in words])
            first = [w for w, c in zip(words, counts) if c == special + 1]
        if not first:
            raise SweepError("prompt_format=text: no candidate word is one token at the start "
                             "of a prompt in the server's tokenizer; use prompt_format=token_ids")
        self.text = {"lead": lead, "first": first, "words": words, "n_words": n_words}
        rng = random.Random("%d/text-check" % self.seed)
        checks = [self._text_prompt(rng) for _unused in range(TEXT_CHECK_PROMPTS)]
        got = await self._tokenize_many(checks)
        bad = [c for c in got if c != self.p["input_len"]]
        if bad:
            self.text = None
            raise SweepError("prompt_format=text: %d of %d random prompts of %d words came out "
                             "at %s tokens, not input_len %d, in the server's tokenizer; use "
                             "prompt_format=token_ids"
                             % (len(bad), len(got), n_words, sorted(set(bad)),
                                self.p["input_len"]))
        return {"special_tokens": special, "words": len(words), "first_words": len(first),
                "leading_space": bool(lead), "checked_prompts": len(got)}

    def _text_prompt(self, rng):
        t = self.text
        words, choice = t["words"], rng.choice
        return t["lead"] + " ".join([choice(t["first"])] +
                                    [choice(words) for _unused in range(t["n_words"] - 1)])

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
        elif self.text is not None:
            body["prompt"] = self._text_prompt(rng)
        else:
            v = self.vocab_size
            body["prompt"] = [rng.randrange(v) for _unused in range(p["input_len"])]
        return json.dumps(body).encode()

    async def request(self, rec, body):
        chat = self.p["endpoint"] == "chat"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        chunk_usage = bool(self.p.get("chunk_usage"))
        if self.native is not None:
            await self.native.stream(rec, path, body, self.p["request_timeout_s"], chat=chat,
                                     chunk_usage=chunk_usage)
            return
        timeout = aiohttp.ClientTimeout(total=self.p["request_timeout_s"])
        sse = SSEStream(rec, chat=chat, chunk_usage=chunk_usage)
        rec.start = time.perf_counter()
        try:
            async with self.session.post(self.base + path, data=body, headers=self.headers,
                                         timeout=timeout) as resp:
                if resp.status != 200:
                    rec.error = "HTTP %d: %s" % (resp.status, _short(await resp.text(), 200))
                    return
                # read to the end of the body even after [DONE]: aiohttp closes a connection
                # whose body was not read to its end, and the next request would then pay a
                # new TCP connection (and the server's accept) inside its TTFT
                async for data in resp.content.iter_any():
                    sse.feed(data, time.perf_counter())
        except asyncio.TimeoutError:
            rec.error = "timeout after %ss (request_timeout_s)" % self.p["request_timeout_s"]
        except (aiohttp.ClientError, OSError, ValueError) as e:
            rec.error = "%s: %s" % (type(e).__name__, _short(e, 200))
        finally:
            rec.end = time.perf_counter()
        sse.finish()

    # --- one level -----------------------------------------------------------------------
    def level_settings(self, conc):
        p = self.p
        warmup = p.get("warmup_requests")
        return {"warmup": conc if warmup is None else warmup,
                "min_requests": p.get("min_requests") or default_min_requests(conc),
                "duration": float(p["duration_s"]),
                "precision_pct": p.get("precision_pct"),
                "max_duration": p.get("max_duration_s")}

    async def run_level(self, conc):
        """One level: C closed-loop workers in this process, or spread over the worker
        processes (``processes`` > 1); returns (summary, records, (w0, w1))."""
        if self.pool is not None:
            return await self._run_level_pool(conc)
        cfg = self.level_settings(conc)
        rng = random.Random("%d/%d" % (self.seed, conc))
        gc_info = _gc_quiet(self.p)
        before = await self.scrape()
        opened0 = self.connections["opened"]
        level_start = time.perf_counter()
        cpu_start = time.process_time()
        state = LevelState(conc, cfg, level_start)
        p = self.p

        async def worker(wid):
            while not state.stop:
                rec = Record(level=conc, worker=wid, expected_tokens=p["output_len"],
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
            gc_info = _gc_restore(gc_info)
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
            records, conc, w0, w1, self.p["output_len"], slo=self.slo(),
            expected_prompt_tokens=(self.p["input_len"] if self.p["endpoint"] == "completions"
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

    async def _run_level_pool(self, conc):
        cfg = self.level_settings(conc)
        pool = self.pool
        shares = split_workers(conc, len(pool.conns))
        clocks = pool.sync_clocks()  # agents: their clock offsets, just before the level
        offsets = [c["offset_s"] for c in clocks] if clocks else [0.0] * len(pool.conns)
        before = await self.scrape()
        cpu_start = time.process_time()
        level_start = time.perf_counter()
        state = LevelState(conc, cfg, level_start)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        ends = {}
        stop_sent = {"on": False}
        seen = [level_start] * len(pool.conns)  # the last message from each, our clock

        def watchdog():
            if done.done():
                return
            now = time.perf_counter()
            for i, t in enumerate(seen):
                if i not in ends and now - t > SILENCE_LIMIT_S:
                    done.set_exception(SweepError(
                        "%s sent nothing for %.0f s during concurrency %d (it sends a heartbeat "
                        "every %g s): its host stopped answering or its process stopped"
                        % (pool.names[i], now - t, conc, HEARTBEAT_S)))
                    return
            timers.append(loop.call_later(1.0, watchdog))
        timers = [loop.call_later(1.0, watchdog)]

        def readable(i, conn):
            seen[i] = time.perf_counter()
            try:
                msg = conn.recv()
            except (EOFError, OSError) as e:
                if not done.done():
                    done.set_exception(SweepError(
                        "%s ended during concurrency %d: %s" % (
                            pool.names[i], conc, pool.died_hint(i, e))))
                loop.remove_reader(conn.fileno())
                return
            if msg[0] == "recs":
                off = offsets[i]
                for tup in msg[1]:
                    state.feed(Record(*(map_record(tup, off) if off else tup)))
                if state.stop and not stop_sent["on"]:
                    stop_sent["on"] = True
                    for c in pool.conns:
                        try:
                            c.send(("stop",))
                        except (OSError, EOFError):
                            pass  # that one's reader reports it
            elif msg[0] == "end":
                ends[i] = msg[1]
                if len(ends) == len(pool.conns) and not done.done():
                    done.set_result(True)
            elif msg[0] == "error" and not done.done():
                done.set_exception(SweepError("%s: %s" % (pool.names[i], msg[1])))

        gc_parent = _gc_quiet(self.p)
        first = 0
        try:
            for i, conn in enumerate(pool.conns):
                try:
                    conn.send(("level", conc, shares[i], first,
                               "%d/%d/%d" % (self.seed, conc, i)))
                except (OSError, EOFError) as e:
                    raise SweepError("%s ended before concurrency %d: %s"
                                     % (pool.names[i], conc, pool.died_hint(i, e)))
                first += shares[i]
                loop.add_reader(conn.fileno(), readable, i, conn)
                os.set_blocking(conn.fileno(), True)  # uvloop made it non-blocking: whole messages
            await done
        finally:
            for t in timers:
                t.cancel()
            for conn in pool.conns:
                try:
                    loop.remove_reader(conn.fileno())
                except (OSError, ValueError):
                    pass
            _gc_restore(gc_parent)
        level_end = time.perf_counter()
        after = await self.scrape()
        w0, w1 = state.window(level_start)
        procs, limited = [], []
        cpu_level = time.process_time() - cpu_start
        cpu_window = 0.0
        for i in range(len(pool.conns)):
            e = ends[i]
            samples = e["samples"]
            if offsets[i]:
                samples = [(t - offsets[i], lag, cpu) for t, lag, cpu in samples]
            h = Sampler.from_samples(samples).health(w0, w1, i, shares[i])
            if clocks:
                h["host"] = pool.names[i]
                h["clock"] = clocks[i]
            cpu_level += e["cpu_s_level"]
            self.children_cpu += e["cpu_s_level"]
            cpu_window += h["cpu_s_window"]
            procs.append(h)
            limited.extend("%s: %s" % (pool.names[i], r) for r in h["client_limited_reasons"])
        client = {
            "processes": len(pool.conns),
            "cpu_s_level": round(cpu_level, 4),
            "cpu_s_window": round(cpu_window, 4),
            "cpu_util_window": max(h["cpu_util_window"] for h in procs),
            "loop_lag_ms": dict((k, max(h["loop_lag_ms"][k] for h in procs))
                                for k in ("p50", "p99", "max")),
            "client_limited": bool(limited),
            "client_limited_reasons": limited,
            "connections_opened": sum(ends[i]["connections_opened"] for i in ends),
            "per_process": procs,
            "gc": ends[0].get("gc"),
        }
        if clocks:
            client["load_generators"] = len(pool.conns)
            client["clock_offset_error_ms_max"] = max(c["error_bound_ms"] for c in clocks)
        return self._finish_level(conc, cfg, state, client, before, after, level_start,
                                  level_end, w0, w1)

    # --- a worker process (processes > 1) ------------------------------------------------
    async def child_serve(self, conn, idle_s=None):
        """Serve the parent's messages until "quit" (or, for an agent, a closed connection:
        returns "quit" or "disconnect"; raises AgentIdle after ``idle_s`` without a message)."""
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector, read_bufsize=READ_BUFSIZE,
                                         trace_configs=[self._trace()]) as s:
            self.session = s
            self._open_native()
            try:
                while True:
                    try:
                        msg = await asyncio.wait_for(_recv(loop, conn, eof=("eof",)), idle_s)
                    except asyncio.TimeoutError:
                        raise AgentIdle("no message from the sweep for %s s (agent_timeout_s)"
                                        % idle_s)
                    if msg[0] in ("quit", "eof"):
                        return "quit" if msg[0] == "quit" else "disconnect"
                    if msg[0] == "ping":
                        conn.send(("pong", time.perf_counter()))
                    elif msg[0] == "level":
                        self.agent_levels = getattr(self, "agent_levels", 0) + 1
                        await self._child_level(loop, conn, *msg[1:])
            finally:
                self._close_native()

    async def _child_level(self, loop, conn, conc, workers, first, seed):
        p = self.p
        rng = random.Random(seed)
        state = {"stop": False}
        pending = []
        gc_info = _gc_quiet(p)
        opened0 = self.connections["opened"]
        cpu0 = time.process_time()

        def on_msg():
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                msg = ("stop",)
            if msg[0] in ("stop", "quit"):  # quit: the parent gave up on the level
                state["stop"] = True

        loop.add_reader(conn.fileno(), on_msg)
        os.set_blocking(conn.fileno(), True)  # sends and receives move whole messages

        async def worker(wid):
            while not state["stop"]:
                rec = Record(level=conc, worker=wid, expected_tokens=p["output_len"],
                             chunk_tokens=[])
                await self.request(rec, self._body(rng))
                pending.append(_record_tuple(rec))

        flushing = {"on": True}

        async def flusher():
            last = time.perf_counter()
            while flushing["on"]:
                await asyncio.sleep(Pool.FLUSH_S)
                if pending:
                    batch = list(pending)
                    del pending[:]
                    conn.send(("recs", batch))
                    last = time.perf_counter()
                elif time.perf_counter() - last >= HEARTBEAT_S:
                    conn.send(("hb",))  # alive, nothing finished (long requests)
                    last = time.perf_counter()

        sampler = Sampler()
        tick = asyncio.ensure_future(sampler.run())
        flush = asyncio.ensure_future(flusher())
        try:
            await asyncio.gather(*[worker(first + j) for j in range(workers)])
        finally:
            sampler.on = False
            flushing["on"] = False
            await tick
            await flush
            loop.remove_reader(conn.fileno())
            gc_info = _gc_restore(gc_info)
        if pending:
            conn.send(("recs", list(pending)))
        conn.send(("end", {"samples": sampler.samples, "cpu_s_level": time.process_time() - cpu0,
                           "connections_opened": self.connections["opened"] - opened0,
                           "gc": gc_info}))

    def _open_native(self):
        """stream_transport native: the requests' own keep-alive connections (sweep_stream)."""
        if (self.p.get("stream_transport") or "native") != "native":
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
        return {"ttft_ms": self.p.get("slo_ttft_ms"), "tpot_ms": self.p.get("slo_tpot_ms"),
                "e2e_ms": self.p.get("slo_e2e_ms")}

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
        for conc in self.p["levels"]:
            runs = []
            for rep in range(int(self.p.get("repeats") or 1)):
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
            "stream_transport": self.p.get("stream_transport") or "native",
            "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            "metrics_parser": PROMETHEUS_PARSER,
            "cpu_s_total": round(time.process_time() - cpu0 + self.children_cpu, 4),
            "processes": (len(self.p.get("load_generators") or [])
                          or int(self.p.get("processes") or 1)),
            "load_generators": ["%s:%d" % (lg["host"], lg["port"])
                                for lg in self.p.get("load_generators") or []],
            "loop_lag_limit_ms": LOOP_LAG_LIMIT_MS,
            "cpu_limit": CPU_LIMIT,
        }
        params = dict((k, v) for k, v in self.p.items() if k not in SECRET_PARAMS)
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


# --- the level's window rule, client health, GC, worker processes -----------------------------
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


def split_workers(conc, processes):
    """C workers over ``processes`` processes, as evenly as possible (the first get one more)."""
    n = max(1, min(processes, conc))
    base, extra = divmod(conc, n)
    return [base + (1 if i < extra else 0) for i in range(n)] + [0] * (processes - n)


class LevelState(object):
    """The window rule of one level, fed each completed request in order of completion.

    Warm-up: the window opens (w0) at the completion of the ``warmup``-th request. It closes
    (w1) at the first completion at or after w0 + duration once ``min_requests`` requests
    started and ended inside it; with ``precision_pct`` also only once the 95 % intervals of
    output tok/s and TTFT p50 are within +-precision_pct of their values, or at the first
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
        if not target:
            self.stop, self.w1, self.stopped_by = True, rec.end, "duration"
            return
        cap = cfg.get("max_duration") or 10.0 * cfg["duration"]
        if rec.end >= self.w0 + cap:
            self.stop, self.w1, self.stopped_by = True, rec.end, "max_duration_s"
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


def _gc_quiet(p):
    """Before a level: collect, freeze what exists, and (unless gc_during_level) switch the
    collector off until the level ends. A full collection walks every tracked object (the
    level's growing record lists included) while the loop is blocked; the records hold no
    cycles, so nothing piles up meanwhile. Returns what _gc_restore reports."""
    gc.collect()
    gc.freeze()
    info = {"mode": "on" if p.get("gc_during_level") else "off during the level",
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
    if not p.get("gc_during_level"):
        gc.disable()
    return info


def _gc_restore(info):
    gc.enable()
    if info.get("_cb") in gc.callbacks:
        gc.callbacks.remove(info["_cb"])
    gc.unfreeze()
    return {"mode": info["mode"], "collections": info["collections"],
            "pause_ms_total": round(info["pause_ms_total"], 3),
            "pause_ms_max": round(info["pause_ms_max"], 3)}


def _record_tuple(r):
    return (r.level, r.worker, r.start, r.end, r.chunk_times, r.chunk_tokens,
            r.completion_tokens, r.prompt_tokens, r.expected_tokens, r.error)


def _send_quit(conns):
    """Tell every worker process or agent to quit; one that is gone already is skipped."""
    for c in conns:
        try:
            c.send(("quit",))
        except (OSError, EOFError):
            pass


class Pool(object):
    """Load-generator worker processes, forked before any event loop runs (``processes``).

    Each child runs its own event loop and aiohttp session. Per level the parent sends
    ("level", C, workers, first worker id, rng seed); the child runs that many closed-loop
    workers, sends its completed requests in batches every FLUSH_S (("recs", [...])), stops
    sending new requests on ("stop",), and when its last request ended sends ("end", {...})
    with its CPU and loop-lag samples. The parent applies the window rule to the merged
    completions, so token counts and windows are those of one client with C workers.
    """

    FLUSH_S = 0.02

    def sync_clocks(self):
        """Forked workers share this process's clock: nothing to estimate."""
        return None

    def died_hint(self, i, exc):
        return type(exc).__name__

    def __init__(self, sweep, n):
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        for i in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_child_main, args=(sweep, theirs, i), daemon=True)
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        self.names = ["load-generator process %d" % i for i in range(n)]

    def close(self):
        _send_quit(self.conns)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        for c in self.conns:
            c.close()


# --- load-generator agents on other hosts (load_generators, mode agent) -------------------------
AGENT_CONNECT_S = 60.0  # how long the sweep keeps trying to reach an agent that is starting
CLOCK_PINGS = 8
RECORD_TIME_FIELDS = (2, 3)  # start, end in _record_tuple; 4 is chunk_times


class AgentIdle(SweepError):
    """An agent waited agent_timeout_s for the sweep (to connect, or for its next message)."""


def best_offset(pings):
    """The clock offset of an agent from ping round trips ``(t_send, t_agent, t_recv)``
    (t_send/t_recv on this clock, t_agent on the agent's): offset = t_agent - (t_send +
    t_recv) / 2 of the round trip with the smallest RTT. The agent read its clock between
    send and receive, so the true offset lies within +-RTT/2 of the estimate (error_bound)."""
    if not pings:
        raise ValueError("no ping round trips")
    t_send, t_agent, t_recv = min(pings, key=lambda x: x[2] - x[0])
    rtt = t_recv - t_send
    return {"offset_s": t_agent - (t_send + t_recv) / 2.0, "rtt_ms": round(rtt * 1000.0, 3),
            "error_bound_ms": round(rtt * 500.0, 3), "pings": len(pings)}


def map_record(tup, offset):
    """A record tuple from an agent with its times (start, end, chunk times) moved onto this
    clock (agent time - offset). TTFT, ITL, TPOT and E2E are differences of the agent's own
    times and come out the same; the offset only decides which window a request falls in."""
    out = list(tup)
    for k in RECORD_TIME_FIELDS:
        if out[k] is not None:
            out[k] = out[k] - offset
    out[4] = [t - offset for t in (out[4] or [])]
    return tuple(out)


def agent_name(i, lg):
    return "load generator %s:%d (load_generators[%d])" % (lg["host"], lg["port"], i)


class AgentAuthError(SweepError):
    """The agent refused the key (it was started with another load_generator_authkey)."""


def connect_agent(i, lg, authkey, timeout_s=AGENT_CONNECT_S):
    """A multiprocessing connection to the agent ``lg``; retried while it is still starting
    (connection refused) for up to ``timeout_s``. Raises SweepError naming it."""
    from multiprocessing.connection import Client
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Client((lg["host"], lg["port"]), authkey=authkey)
        except multiprocessing.AuthenticationError:
            raise AgentAuthError("%s refused the sweep: authentication failed (the agent was "
                                 "started with another load_generator_authkey)" % agent_name(i, lg))
        except socket.gaierror as e:
            raise SweepError("cannot resolve the host of %s: %s (give its address)"
                             % (agent_name(i, lg), e))
        except (OSError, EOFError) as e:
            if time.monotonic() >= deadline:
                raise SweepError("cannot reach %s within %d s: %s: %s (is the agent running "
                                 "there, mode=agent, and the port open from here?)"
                                 % (agent_name(i, lg), timeout_s, type(e).__name__, e))
            time.sleep(0.25)


class AgentPool(object):
    """The agents of load_generators, connected and set up: used like Pool's forked workers
    (the same messages), plus "ping" (clock offsets before every level) and "setup"."""

    def __init__(self, sweep, lgs, authkey, connect_s=AGENT_CONNECT_S):
        self.lgs = list(lgs)
        self.names = [agent_name(i, lg) for i, lg in enumerate(self.lgs)]
        self.conns = []
        key = authkey.encode() if isinstance(authkey, str) else authkey
        setup = sweep.agent_setup()
        try:
            for i, lg in enumerate(self.lgs):
                conn = connect_agent(i, lg, key, connect_s)
                self.conns.append(conn)
                conn.send(("setup", setup))
                reply = self._reply(i, 30.0)
                if reply[0] != "ready":
                    raise SweepError("%s: %s" % (self.names[i], reply[1] if len(reply) > 1
                                                 else reply))
        except BaseException:
            self.close()
            raise

    def _reply(self, i, timeout):
        conn = self.conns[i]
        try:
            if not conn.poll(timeout):
                raise SweepError("%s did not answer within %d s" % (self.names[i], timeout))
            return conn.recv()
        except (OSError, EOFError) as e:
            raise SweepError("%s closed the connection: %s"
                             % (self.names[i], type(e).__name__))

    def died_hint(self, i, exc):
        return "the connection closed (%s): the agent or its host died, or it was stopped" % (
            type(exc).__name__)

    def sync_clocks(self, pings=CLOCK_PINGS):
        """Each agent's clock offset (see best_offset), estimated now."""
        out = []
        for i, conn in enumerate(self.conns):
            rounds = []
            for _unused in range(pings):
                t_send = time.perf_counter()
                try:
                    conn.send(("ping",))
                except (OSError, EOFError) as e:
                    raise SweepError("%s: %s" % (self.names[i], self.died_hint(i, e)))
                reply = self._reply(i, 30.0)
                t_recv = time.perf_counter()
                if reply[0] != "pong":
                    raise SweepError("%s answered a ping with %r" % (self.names[i], reply[0]))
                rounds.append((t_send, reply[1], t_recv))
            out.append(best_offset(rounds))
        return out

    def close(self):
        _send_quit(self.conns)
        for c in self.conns:
            c.close()
        self.conns = []


def run_agent(listen_host, listen_port, authkey, timeout_s, event_loop="auto"):
    """Serve one sweep as a load generator: listen (authenticated with ``authkey``), take the
    first connection that authenticates, run its levels; return when it sends "quit" or
    closes the connection, or after ``timeout_s`` without a connection or a message (between
    levels). Returns what happened (never the key)."""
    import threading
    from multiprocessing.connection import Listener
    if not HAS_AIOHTTP:
        raise SweepError("aiohttp is not importable by %s" % sys.executable)
    key = authkey.encode() if isinstance(authkey, str) else authkey
    try:
        listener = Listener((listen_host, listen_port), authkey=key)
    except OSError as e:
        raise SweepError("agent cannot listen on %s:%d (listen_host, listen_port): %s"
                         % (listen_host, listen_port, e))
    info = {"listen": "%s:%d" % (listen_host, listen_port), "auth_failures": 0,
            "levels": 0, "ended": None}
    got = {}

    def accept():
        while "conn" not in got:
            try:
                got["conn"] = listener.accept()
            except multiprocessing.AuthenticationError:
                info["auth_failures"] += 1
            except (OSError, EOFError):
                if got.get("closing"):
                    return
                info["auth_failures"] += 1  # dropped during the handshake
    t0 = time.monotonic()
    th = threading.Thread(target=accept, daemon=True)
    th.start()
    th.join(timeout_s)
    got["closing"] = True
    listener.close()
    if "conn" not in got:
        info["ended"] = "timeout"
        raise AgentIdle("no sweep connected within %s s (agent_timeout_s); %d connection(s) "
                        "failed to authenticate" % (timeout_s, info["auth_failures"]))
    conn = got["conn"]
    try:
        if not conn.poll(timeout_s):
            raise AgentIdle("the sweep connected but sent nothing within %s s "
                            "(agent_timeout_s)" % timeout_s)
        msg = conn.recv()
        if msg[0] == "quit":
            info["ended"] = "quit (stopped before any level)"
            return info
        if msg[0] != "setup":
            raise SweepError("agent: expected setup from the sweep, got %r" % (msg[0],))
        try:
            sweep = Sweep.for_agent(msg[1])
        except SweepError as e:
            conn.send(("error", str(e)))
            raise
        conn.send(("ready",))
        factory = loop_factory(event_loop or "auto")
        coro = sweep.child_serve(conn, idle_s=timeout_s)
        try:
            if factory is None:
                ended = asyncio.run(coro)
            else:
                with asyncio.Runner(loop_factory=factory) as runner:
                    ended = runner.run(coro)
        except (OSError, EOFError) as e:  # the sweep went away mid-level
            ended = "disconnect (%s)" % type(e).__name__
        except SweepError:
            raise
        except Exception as e:  # noqa: BLE001 - tell the sweep, then fail
            try:
                conn.send(("error", "%s: %s" % (type(e).__name__, e)))
            except (OSError, EOFError):
                pass
            raise
        info["ended"] = ended
        info["levels"] = getattr(sweep, "agent_levels", 0)
        info["event_loop"] = "uvloop" if factory is not None else "asyncio"
        info["cpu_s"] = round(time.process_time(), 4)
        info["served_s"] = round(time.monotonic() - t0, 3)
        return info
    finally:
        conn.close()


def stop_agents(lgs, authkey, wait_s=10.0):
    """Send "quit" to every agent that still waits for a sweep (after a failed sweep): returns
    per agent "stopped", or why not ("authentication failed"; "not listening: ..." when it is
    gone, or serving a sweep, which ends it by closing). An agent that refuses the connection
    may still be starting: connect_agent retries for up to ``wait_s`` in all."""
    key = authkey.encode() if isinstance(authkey, str) else authkey
    deadline = time.monotonic() + wait_s
    out = []
    for i, lg in enumerate(lgs):
        name = "%s:%d" % (lg["host"], lg["port"])
        try:
            c = connect_agent(i, lg, key, max(0.0, deadline - time.monotonic()))
        except AgentAuthError:
            out.append({"agent": name, "result": "authentication failed"})
            continue
        except SweepError as e:
            out.append({"agent": name, "result": "not listening: %s" % e})
            continue
        try:
            c.send(("quit",))
            out.append({"agent": name, "result": "stopped"})
        except (OSError, EOFError) as e:
            out.append({"agent": name, "result": "gone (%s)" % type(e).__name__})
        finally:
            c.close()
    return out


def _child_main(sweep, conn, index):
    sweep.pool = None
    sweep.child_index = index
    factory = loop_factory(sweep.p.get("event_loop") or "auto")
    coro = sweep.child_serve(conn)
    try:
        if factory is None:
            asyncio.run(coro)
        else:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(coro)
    except Exception as e:  # noqa: BLE001 - the parent reports it
        try:
            conn.send(("error", "%s: %s" % (type(e).__name__, e)))
        except (OSError, EOFError):
            pass


async def _recv(loop, conn, eof=("quit",)):
    """The next message on a multiprocessing connection, without blocking the loop (``eof``
    when the other end closed it)."""
    fut = loop.create_future()

    def ready():
        if not fut.done():
            try:
                fut.set_result(conn.recv())
            except (EOFError, OSError):
                fut.set_result(eof)
    loop.add_reader(conn.fileno(), ready)
    os.set_blocking(conn.fileno(), True)  # uvloop sets O_NONBLOCK; messages are read whole
    try:
        return await fut
    finally:
        loop.remove_reader(conn.fileno())


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
    n = int(params.get("processes") or 1)

    def run(coro):
        if factory is None:
            return asyncio.run(coro)
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(coro)
    lgs = params.get("load_generators") or []
    if lgs:  # the preflight here, then the agents get its outcome, then the levels
        run(sweep.run_preflight())
        sweep.pool = AgentPool(sweep, lgs, params["load_generator_authkey"])
        try:
            return run(sweep.run(log_path=request_log_path, preflight=False))
        finally:
            sweep.pool.close()
            sweep.pool = None
    if n <= 1:
        return run(sweep.run(log_path=request_log_path))
    # several processes: the preflight first, then fork the workers (no event loop exists in
    # this process while it forks), then the levels
    run(sweep.run_preflight())
    sweep.pool = Pool(sweep, n)
    try:
        return run(sweep.run(log_path=request_log_path, preflight=False))
    finally:
        sweep.pool.close()
        sweep.pool = None
