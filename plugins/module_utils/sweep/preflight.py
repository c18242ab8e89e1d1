# -*- coding: utf-8 -*-
"""The sweep's preflight, before any load: the server answers, serves the model with room for
input_len + output_len, the prompt vocabulary (a binary search over validation errors unless
vocab_size is given) and, for ``prompt_format: text``, words that are one token each in the
server's tokenizer (checked with ``/tokenize``). A mixin of :class:`engine.Sweep`.
"""
from __future__ import annotations

import asyncio
import json
import random

try:
    import aiohttp
except ImportError:  # run_sweep and run_agent report this with the interpreter's path
    aiohttp = None

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.prometheus import (
    server_counters)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import (
    SweepError, short)

VOCAB_PROBE_MAX = 1 << 21  # larger than any tokenizer's vocabulary
PROBE_TIMEOUT_S = 60
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


class PreflightMixin(object):
    """What the sweep learns about the server before its first level (see the module doc)."""

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
            raise SweepError("%s answered HTTP %d: %s" % (url, status, short(text)))
        try:
            models = json.loads(text)["data"]
        except (ValueError, KeyError, TypeError):
            raise SweepError("%s did not return an OpenAI model list: %s" % (url, short(text)))
        served = [m.get("id") for m in models]
        entry = [m for m in models if m.get("id") == self.s.model]
        if not entry:
            raise SweepError("model %r is not served at %s; served model names: %s"
                             % (self.s.model, self.base, ", ".join(map(str, served))))
        max_len = entry[0].get("max_model_len")
        need = self.s.input_len + self.s.output_len
        if max_len and need > max_len:
            raise SweepError("input_len + output_len = %d exceeds the server's max_model_len %d"
                             % (need, max_len))
        self.server = {"served_models": served, "max_model_len": max_len}
        if self.s.endpoint == "completions" and self.prompt_format == "text":
            self.server["prompt_text"] = await self._text_setup()
        elif self.s.endpoint == "completions" and self.vocab_size is None:
            self.vocab_size = await self._probe_vocab()
        self.server["vocab_size"] = self.vocab_size
        self.server["prompt_format"] = (self.prompt_format if self.s.endpoint == "completions"
                                        else "chat")
        before = await self.scrape()
        self.server["metrics_available"] = before is not None

    async def _probe_token(self, token_id):
        """One probe: True (accepted), False (refused as out of vocabulary), or a string that
        says why no verdict came (the connection dropped, or HTTP 5xx)."""
        body = {"model": self.s.model, "prompt": [token_id], "max_tokens": 1}
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
            return "%s: %s" % (type(e).__name__, short(e, 200) or "connection dropped")
        if status == 200:
            return True
        if status == 400 and "vocab" in text.lower():
            return False
        if status >= 500:
            return "HTTP %d: %s" % (status, short(text, 200))
        raise SweepError("vocabulary probe with token id %d got HTTP %d: %s"
                         % (token_id, status, short(text)))

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
        body = {"model": self.s.model, "prompt": text, "add_special_tokens": special}
        try:
            async with self.session.post(url, json=body, headers=self.headers,
                                         timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
                                         ) as r:
                status, answer = r.status, await r.text()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise SweepError("prompt_format=text needs the server's /tokenize endpoint: %s: "
                             "%s: %s; use prompt_format=token_ids"
                             % (url, type(e).__name__, short(e, 200)))
        if status != 200:
            raise SweepError("prompt_format=text needs the server's /tokenize endpoint: %s "
                             "answered HTTP %d: %s; use prompt_format=token_ids"
                             % (url, status, short(answer, 200)))
        try:
            data = json.loads(answer)
            count = data["count"] if "count" in data else len(data["tokens"])
        except (ValueError, KeyError, TypeError):
            raise SweepError("prompt_format=text: %s did not return a token count: %s; use "
                             "prompt_format=token_ids" % (url, short(answer, 200)))
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
        n_words = self.s.input_len - special
        if special < 0 or n_words < 1:
            raise SweepError("prompt_format=text: the server adds %d special tokens to a prompt, "
                             "so input_len %d cannot be made of words; raise input_len or use "
                             "prompt_format=token_ids" % (special, self.s.input_len))
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
        bad = [c for c in got if c != self.s.input_len]
        if bad:
            self.text = None
            raise SweepError("prompt_format=text: %d of %d random prompts of %d words came out "
                             "at %s tokens, not input_len %d, in the server's tokenizer; use "
                             "prompt_format=token_ids"
                             % (len(bad), len(got), n_words, sorted(set(bad)),
                                self.s.input_len))
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
