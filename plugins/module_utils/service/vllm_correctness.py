# -*- coding: utf-8 -*-
"""Greedy-decoding correctness check of a vLLM endpoint against a reference (the standard
library and ansible.module_utils.urls, which every module payload carries).

What it does
------------
``generate()`` sends each prompt of a fixed set, one request at a time (so every request is
decoded in a batch of one and the result does not depend on what else the server runs), to
``/v1/completions`` with greedy decoding: ``temperature 0``, ``seed``, ``max_tokens`` (with
``ignore_eos`` and ``min_tokens`` the output length is exact), ``logprobs`` and
``return_tokens_as_token_ids`` (vLLM's option that names every returned token
``token_id:<id>``). It returns per prompt the generated token ids, the logprob of each
generated token and the top-1 logprob at each position (the largest of the returned top
logprobs; under greedy decoding the generated token is the top-1 unless two tie).

``compare_outputs(outputs, reference, thresholds)`` compares them with a reference made the
same way (a stored result, or ``generate()`` on another endpoint):

* ``prefix_match_rate``: sum over prompts of the length of the common prefix of the two token
  sequences, divided by the sum of the reference lengths (1.0 = identical; greedy decoding
  that diverges once continues from another context, so the prefix is the honest measure);
* ``token_match_rate``: position-wise, equal tokens at the same position divided by the longer
  sequence's length, summed over prompts;
* ``exact_match_prompts``: prompts whose sequences are identical; ``first_divergence`` the
  position of the first differing token per prompt (None when identical);
* ``logprob_gap_max`` / ``logprob_gap_mean``: absolute differences of the top-1 logprobs at
  the positions of the common prefix (where both decoded the same context; beyond the first
  divergence the contexts differ and the logprobs are not comparable), in nats;
* ``passed``: every threshold given holds (``min_token_match_rate``,
  ``min_prefix_match_rate``, ``max_logprob_gap_max``, ``max_logprob_gap_mean``; None skips
  one); ``failures`` lists the ones that broke.

Python API: ``check_params(params)``, ``generate(base_url, model, prompts=None, max_tokens=32,
seed=0, top_logprobs=1, ignore_eos=True, api_key=None, timeout_s=120, post=None)``,
``compare_outputs(result_or_outputs, reference_result_or_outputs, thresholds=None)``,
``run_check(params)`` (what the module vllm_ops.deploy.vllm_correctness does: generate,
reference from ``reference`` or ``reference_base_url``, compare). Every failure is a
``CorrectnessError`` whose message names the parameter or the endpoint at fault.

Thresholds: the defaults suit comparing serving layouts of one model on one kind of device
(TP, kernels and batch sizes reorder floating-point sums, so the logprobs move a little and a
near-tie may flip late in a sequence); a gate may tighten them. On a model with random
weights (the CPU test model, dummy weights on a GPU) the check compares layouts, not model
quality.
"""
from __future__ import annotations

import hashlib
import json
import re
import socket
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import open_url

# A small fixed prompt set: plain English in several registers (any tokenizer splits it).
BUILTIN_PROMPTS = (
    "The capital of France is",
    "Here is a short poem about the sea:",
    "def fibonacci(n):",
    "Q: What is 17 multiplied by 23?\nA:",
    "The three laws of thermodynamics state that",
    "Translate to German: The weather is nice today.",
    "List the planets of the solar system in order:",
    "Once upon a time, in a small village by the mountains,",
)
DEFAULT_THRESHOLDS = {
    "min_token_match_rate": 0.9,
    "min_prefix_match_rate": 0.8,
    "max_logprob_gap_max": 1.0,
    "max_logprob_gap_mean": 0.1,
}
TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")


class CorrectnessError(Exception):
    """The check could not run or the reference does not fit (names what is at fault)."""


def normalize_base_url(url):
    """``http://host:port`` from a base URL given with or without a trailing ``/v1``."""
    url = (url or "").strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    return url


def check_params(p):
    """Validate the parameters (a dict like the module's); raise CorrectnessError naming the
    variable."""
    if not p.get("base_url") or not re.match(r"^https?://", str(p["base_url"])):
        raise CorrectnessError("base_url must be an http(s) URL, got %r" % (p.get("base_url"),))
    if not p.get("model"):
        raise CorrectnessError("model must name the served model")
    prompts = p.get("prompts")
    if prompts is not None:
        if not isinstance(prompts, list) or not prompts:
            raise CorrectnessError("prompts must be a non-empty list when given")
        for i, pr in enumerate(prompts):
            ok = (isinstance(pr, str) and pr) or (
                isinstance(pr, list) and pr and all(isinstance(t, int) and not isinstance(t, bool)
                                                    and t >= 0 for t in pr))
            if not ok:
                raise CorrectnessError("prompts[%d] must be a non-empty string or a list of "
                                       "token ids >= 0, got %r" % (i, pr))
    for key, low in (("max_tokens", 1), ("top_logprobs", 1)):
        v = p.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
            raise CorrectnessError("%s must be an integer >= %d, got %r" % (key, low, v))
    if p.get("timeout_s") is not None and p["timeout_s"] <= 0:
        raise CorrectnessError("timeout_s must be > 0, got %r" % (p["timeout_s"],))
    for key in ("min_token_match_rate", "min_prefix_match_rate"):
        v = p.get(key)
        if v is not None and not 0.0 <= v <= 1.0:
            raise CorrectnessError("%s must be in [0, 1], got %r" % (key, v))
    for key in ("max_logprob_gap_max", "max_logprob_gap_mean"):
        v = p.get(key)
        if v is not None and v < 0:
            raise CorrectnessError("%s must be >= 0, got %r" % (key, v))
    ref, ref_url = p.get("reference"), p.get("reference_base_url")
    if ref is not None and ref_url:
        raise CorrectnessError("give reference or reference_base_url, not both")
    if ref is not None:
        outputs_of(ref, "reference")
    if ref_url and not re.match(r"^https?://", str(ref_url)):
        raise CorrectnessError("reference_base_url must be an http(s) URL, got %r" % (ref_url,))


def _post(url, body, api_key=None, timeout=120.0):
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    data = json.dumps(body).encode()
    try:
        resp = open_url(url, data=data, headers=headers, method="POST", timeout=timeout)
        with resp:
            return resp.status, resp.read()
    except HTTPError as e:
        return e.code, e.read()


def request_body(model, prompt, max_tokens=32, seed=0, top_logprobs=1, ignore_eos=True):
    """The /v1/completions body of one greedy request."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "seed": seed, "logprobs": top_logprobs, "return_tokens_as_token_ids": True,
            "stream": False}
    if ignore_eos:
        body.update(ignore_eos=True, min_tokens=max_tokens)
    return body


def _token_id(tok, where):
    m = TOKEN_ID.match(str(tok))
    if not m:
        raise CorrectnessError("%s: token %r is not 'token_id:<id>' (the server ignored "
                               "return_tokens_as_token_ids; is it vLLM?)" % (where, tok))
    return int(m.group(1))


def parse_completion(doc, where="response"):
    """Token ids, their logprobs and the top-1 logprobs of one /v1/completions answer."""
    try:
        choice = doc["choices"][0]
        lp = choice["logprobs"]
        tokens, token_lps, tops = lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]
    except (KeyError, IndexError, TypeError):
        raise CorrectnessError("%s has no choices[0].logprobs with tokens, token_logprobs and "
                               "top_logprobs: %s" % (where, json.dumps(doc)[:300]))
    ids = [_token_id(t, where) for t in tokens]
    top1 = []
    for i, top in enumerate(tops):
        if not top:  # no top logprobs at this position: the generated token's own
            top1.append(token_lps[i])
        else:
            top1.append(max(top.values()))
    usage = doc.get("usage") or {}
    if usage.get("completion_tokens") is not None and usage["completion_tokens"] != len(ids):
        raise CorrectnessError("%s: usage.completion_tokens %s but %d tokens with logprobs"
                               % (where, usage["completion_tokens"], len(ids)))
    return {"token_ids": ids, "logprobs": list(token_lps), "top1_logprobs": top1,
            "text": choice.get("text", ""), "finish_reason": choice.get("finish_reason"),
            "prompt_tokens": usage.get("prompt_tokens")}


def prompts_digest(prompts):
    return hashlib.sha256(json.dumps(list(prompts), sort_keys=True).encode()).hexdigest()[:16]


def generate(base_url, model, prompts=None, max_tokens=32, seed=0, top_logprobs=1,
             ignore_eos=True, api_key=None, timeout_s=120.0, post=None):
    """Decode every prompt greedily (one request at a time); return the result dict."""
    post = post or _post
    base = normalize_base_url(base_url)
    url = base + "/v1/completions"
    prompts = list(prompts) if prompts else list(BUILTIN_PROMPTS)
    outputs = []
    for i, prompt in enumerate(prompts):
        body = request_body(model, prompt, max_tokens, seed, top_logprobs, ignore_eos)
        try:
            status, raw = post(url, body, api_key=api_key, timeout=timeout_s)
        except (URLError, ConnectionError, socket.timeout, OSError) as e:
            raise CorrectnessError("cannot reach %s: %s: %s" % (url, type(e).__name__, e))
        if status in (401, 403):
            raise CorrectnessError("%s answered HTTP %d: check the API key" % (url, status))
        if status != 200:
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            raise CorrectnessError("%s answered HTTP %d to prompt %d: %s"
                                   % (url, status, i, " ".join(text.split())[:300]))
        try:
            doc = json.loads(raw)
        except ValueError:
            raise CorrectnessError("%s did not answer JSON to prompt %d" % (url, i))
        out = parse_completion(doc, "%s prompt %d" % (url, i))
        out["prompt"] = prompt
        outputs.append(out)
    return {"endpoint": base, "model": model, "outputs": outputs,
            "parameters": {"max_tokens": max_tokens, "seed": seed, "top_logprobs": top_logprobs,
                           "ignore_eos": bool(ignore_eos), "temperature": 0.0,
                           "prompts": len(prompts), "prompts_sha256": prompts_digest(prompts),
                           "prompt_set": "given" if prompts != list(BUILTIN_PROMPTS)
                           else "builtin"}}


def outputs_of(result, what="result"):
    """The outputs list of a result dict (or an outputs list itself)."""
    outs = result.get("outputs") if isinstance(result, dict) else result
    if not isinstance(outs, list) or not outs:
        raise CorrectnessError("%s has no outputs (a result of vllm_correctness, or its "
                               "outputs list)" % what)
    for i, o in enumerate(outs):
        if not isinstance(o, dict) or not isinstance(o.get("token_ids"), list) or \
                not isinstance(o.get("top1_logprobs"), list):
            raise CorrectnessError("%s outputs[%d] lacks token_ids/top1_logprobs" % (what, i))
    return outs


def compare_outputs(result, reference, thresholds=None):
    """Compare a result with a reference; see the module documentation."""
    outs, refs = outputs_of(result, "result"), outputs_of(reference, "reference")
    if len(outs) != len(refs):
        raise CorrectnessError("the reference has %d prompts, the result %d: they were not "
                               "made with the same prompts" % (len(refs), len(outs)))
    for i, (o, r) in enumerate(zip(outs, refs)):
        if "prompt" in o and "prompt" in r and o["prompt"] != r["prompt"]:
            raise CorrectnessError("prompt %d differs from the reference's (%r vs %r): "
                                   "compare results of the same prompts" % (i, o["prompt"],
                                                                            r["prompt"]))
    if thresholds is None:
        thresholds = DEFAULT_THRESHOLDS
    per, prefix_sum, ref_sum, match_sum, long_sum, gaps = [], 0, 0, 0, 0, []
    for i, (o, r) in enumerate(zip(outs, refs)):
        a, b = o["token_ids"], r["token_ids"]
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        same = sum(1 for x, y in zip(a, b) if x == y)
        g = [abs(float(x) - float(y)) for x, y in
             zip(o["top1_logprobs"][:n], r["top1_logprobs"][:n]) if x is not None and y is not None]
        gaps.extend(g)
        prefix_sum += n
        ref_sum += len(b)
        match_sum += same
        long_sum += max(len(a), len(b))
        per.append({"prompt": i, "tokens": len(a), "reference_tokens": len(b),
                    "prefix_match": n, "position_matches": same,
                    "first_divergence": None if (n == len(a) == len(b)) else n,
                    "logprob_gap_max": max(g) if g else None})
    rates = {
        "prompts": len(outs),
        "exact_match_prompts": sum(1 for p in per if p["first_divergence"] is None),
        "prefix_match_rate": (prefix_sum / float(ref_sum)) if ref_sum else 1.0,
        "token_match_rate": (match_sum / float(long_sum)) if long_sum else 1.0,
        "logprob_gap_max": max(gaps) if gaps else None,
        "logprob_gap_mean": (sum(gaps) / len(gaps)) if gaps else None,
        "first_divergence": [p["first_divergence"] for p in per],
        "per_prompt": per,
    }
    failures = []
    checks = (("min_token_match_rate", "token_match_rate", "<"),
              ("min_prefix_match_rate", "prefix_match_rate", "<"),
              ("max_logprob_gap_max", "logprob_gap_max", ">"),
              ("max_logprob_gap_mean", "logprob_gap_mean", ">"))
    for key, figure, bad in checks:
        limit = thresholds.get(key)
        value = rates[figure]
        if limit is None or value is None:
            continue
        if (bad == "<" and value < limit) or (bad == ">" and value > limit):
            failures.append("%s %.4g %s %s %.4g" % (figure, value,
                                                    "below" if bad == "<" else "above",
                                                    key, limit))
    rates["thresholds"] = dict((k, thresholds.get(k)) for k, _f, _b in checks)
    rates["failures"] = failures
    rates["passed"] = not failures
    return rates


def thresholds_of(params):
    """The thresholds in a parameter dict; a missing key takes its default, None disables."""
    out = {}
    for key, default in DEFAULT_THRESHOLDS.items():
        out[key] = params[key] if key in params else default
    return out


def run_check(params, post=None):
    """Generate on ``base_url``, get the reference (``reference`` or ``reference_base_url``),
    compare. Returns the result dict with ``comparison``, ``passed`` (None without a
    reference) and ``reference`` (where it came from)."""
    check_params(params)
    ref = params.get("reference")
    prompts = params.get("prompts")
    settings = {}
    if ref is not None:
        # a stored reference brings its prompts and settings unless they are given
        if prompts is None:
            prompts = [o["prompt"] for o in outputs_of(ref, "reference") if "prompt" in o] or None
        settings = dict(ref.get("parameters") or {}) if isinstance(ref, dict) else {}

    def setting(key, default):
        if params.get(key) is not None:
            return params[key]
        return settings.get(key, default)
    gen = dict(prompts=prompts, max_tokens=setting("max_tokens", 32),
               seed=setting("seed", 0), top_logprobs=setting("top_logprobs", 1),
               ignore_eos=setting("ignore_eos", True),
               timeout_s=params.get("timeout_s") or 120.0, post=post)
    result = generate(params["base_url"], params["model"], api_key=params.get("api_key"), **gen)
    source = None
    if ref is not None:
        source = {"source": "stored", "endpoint": ref.get("endpoint") if isinstance(ref, dict)
                  else None}
        ref_params = ref.get("parameters") if isinstance(ref, dict) else None
        if ref_params:
            for key in ("max_tokens", "seed", "ignore_eos", "prompts_sha256"):
                if key in ref_params and ref_params[key] != result["parameters"][key]:
                    raise CorrectnessError(
                        "the reference was made with %s=%r, this check with %r: give the same "
                        "prompts and settings" % (key, ref_params[key],
                                                  result["parameters"][key]))
    elif params.get("reference_base_url"):
        ref = generate(params["reference_base_url"],
                       params.get("reference_model") or params["model"],
                       api_key=params.get("reference_api_key"), **gen)
        source = {"source": "endpoint", "endpoint": ref["endpoint"], "model": ref["model"]}
    if ref is None:
        result.update(comparison=None, passed=None, reference=None)
        return result
    cmp_ = compare_outputs(result, ref, thresholds_of(params))
    result.update(comparison=cmp_, passed=cmp_["passed"], reference=source)
    if source["source"] == "endpoint":
        result["reference_outputs"] = ref["outputs"]
    return result


def summary_line(result):
    """One line for the task output."""
    c = result.get("comparison")
    n = len(result["outputs"])
    if not c:
        return "%d prompts decoded greedily at %s (no reference given)" % (n, result["endpoint"])
    return ("%s: token match %.3f, prefix match %.3f, exact %d/%d, top-1 logprob gap max %s "
            "mean %s%s" % ("PASS" if c["passed"] else "FAIL", c["token_match_rate"],
                           c["prefix_match_rate"], c["exact_match_prompts"], n,
                           _g(c["logprob_gap_max"]), _g(c["logprob_gap_mean"]),
                           ("; " + "; ".join(c["failures"])) if c["failures"] else ""))


def _g(x):
    return "-" if x is None else "%.4g" % x
