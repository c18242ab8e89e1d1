"""What a text prompt costs in time to first token, against the same length given as token ids.

Our sweep client sends prompts as token ids; `vllm bench serve` (random dataset) sends text,
which the server tokenizes before scheduling. This measures that difference alone, on one
server, with one client (stdlib http.client, one request at a time): N pairs, each a token-id
prompt and a text prompt of about the same token count, alternating which goes first, every
prompt fresh (no prefix-cache hits). Text prompts are made by the server itself: /detokenize
of random ids, then /tokenize to count what the text really is (reported).

    python ttft_text_vs_ids.py --base-url http://127.0.0.1:8000 --model NAME --vocab-size 2048

Prints the median TTFT of each kind, their difference and ratio; --json-out writes all samples.
Standard library only.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import time
import urllib.parse


def _conn(base):
    u = urllib.parse.urlsplit(base)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=120)


def post_json(base, path, body):
    c = _conn(base)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError("%s answered HTTP %d: %s" % (path, r.status, data[:300]))
        return json.loads(data)
    finally:
        c.close()


def ttft_ms(base, model, prompt, output_len):
    """(TTFT ms, prompt tokens) of one streamed completion: first chunk with a choice."""
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "stream": True,
            "ignore_eos": True, "temperature": 0.0,
            "stream_options": {"include_usage": True}}
    c = _conn(base)
    try:
        payload = json.dumps(body)
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError("completion answered HTTP %d: %s" % (r.status, r.read()[:300]))
        first, usage = None, {}
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            # the first chunk with a choice, as vllm bench counts it (a dummy-weight model's
            # tokens may decode to no text)
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            if chunk.get("usage"):
                usage = chunk["usage"]
        if first is None:
            raise RuntimeError("no token came back")
        return (first - t0) * 1000.0, usage.get("prompt_tokens")
    finally:
        c.close()


def summarize(ids_ms, text_ms):
    """Medians, their difference and ratio (text / ids), and the paired median difference."""
    m_ids, m_text = statistics.median(ids_ms), statistics.median(text_ms)
    return {"ids_p50_ms": m_ids, "text_p50_ms": m_text,
            "diff_p50_ms": m_text - m_ids,
            "ratio_text_over_ids": m_text / m_ids if m_ids else None,
            "paired_diff_p50_ms": statistics.median(t - i for t, i in zip(text_ms, ids_ms))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed if args.seed is not None else time.time_ns())
    base = args.base_url.rstrip("/")

    def ids():
        # avoid the lowest ids (special tokens in most tokenizers)
        return [rng.randrange(16, args.vocab_size) for _unused in range(args.input_len)]

    # warm both paths
    ttft_ms(base, args.model, ids(), args.output_len)
    text = post_json(base, "/detokenize", {"model": args.model, "tokens": ids()})["prompt"]
    ttft_ms(base, args.model, text, args.output_len)

    samples = []
    for i in range(args.pairs):
        text = post_json(base, "/detokenize", {"model": args.model, "tokens": ids()})["prompt"]
        n_text = post_json(base, "/tokenize",
                           {"model": args.model, "prompt": text, "add_special_tokens": True})["count"]
        id_prompt = ids()
        order = ("ids", "text") if i % 2 == 0 else ("text", "ids")
        rec = {"text_tokens": n_text}
        for kind in order:
            ms, ptok = ttft_ms(base, args.model, id_prompt if kind == "ids" else text,
                               args.output_len)
            rec[kind + "_ms"], rec[kind + "_prompt_tokens"] = ms, ptok
        samples.append(rec)
    out = summarize([s["ids_ms"] for s in samples], [s["text_ms"] for s in samples])
    out["text_prompt_tokens_p50"] = statistics.median(s["text_prompt_tokens"] for s in samples)
    out["ids_prompt_tokens_p50"] = statistics.median(s["ids_prompt_tokens"] for s in samples)
    out["pairs"] = len(samples)
    print("TTFT p50, %d pairs, C=1, %d-token prompts, %d output tokens:" % (
        len(samples), args.input_len, args.output_len))
    print("  token ids %.2f ms | text %.2f ms (server counted %s prompt tokens) | text - ids "
          "%.2f ms (paired %.2f ms), ratio %.3f" % (
              out["ids_p50_ms"], out["text_p50_ms"], out["text_prompt_tokens_p50"],
              out["diff_p50_ms"], out["paired_diff_p50_ms"], out["ratio_text_over_ids"]))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"args": vars(args), "summary": out, "samples": samples}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
