# -*- coding: utf-8 -*-
"""The server's /metrics for the sweep: the Prometheus text exposition format parsed with
prometheus_client's parser when the interpreter has it (every vLLM venv does), else with the
small parser here (``PROMETHEUS_PARSER`` says which), and the cross-check of the client's
token counts against the server's counters over a level.
"""
from __future__ import annotations

import re

try:
    from prometheus_client.parser import text_string_to_metric_families
    PROMETHEUS_PARSER = "prometheus_client"
except ImportError:  # a load generator without it: the parser below
    text_string_to_metric_families = None
    PROMETHEUS_PARSER = "builtin"


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _parse_labels(text, i):
    """Parse '{a="x",b="y"}' starting at text[i] == '{'; return (labels, index after '}')."""
    labels = {}
    i += 1
    n = len(text)
    while i < n:
        while i < n and text[i] in " ,":
            i += 1
        if i < n and text[i] == "}":
            return labels, i + 1
        m = _NAME.match(text, i)
        if not m:
            raise ValueError("bad label name at %d in %r" % (i, text))
        key = m.group(0)
        i = m.end()
        while i < n and text[i] == " ":
            i += 1
        if text[i:i + 2] != '="':
            raise ValueError("expected =\" after label %r in %r" % (key, text))
        i += 2
        val = []
        while i < n and text[i] != '"':
            if text[i] == "\\" and i + 1 < n:
                nxt = text[i + 1]
                val.append({"n": "\n", "\\": "\\", '"': '"'}.get(nxt, "\\" + nxt))
                i += 2
            else:
                val.append(text[i])
                i += 1
        if i >= n:
            raise ValueError("unterminated label value in %r" % (text,))
        labels[key] = "".join(val)
        i += 1
    raise ValueError("unterminated label set in %r" % (text,))


def parse_prometheus(text, library=None):
    """Samples of a Prometheus text exposition: a list of (name, labels dict, float value).

    prometheus_client's parser when it is importable (``library`` None or True), else (or with
    ``library=False``) the parser below. Raises ValueError on a malformed exposition."""
    if library is None:
        library = text_string_to_metric_families is not None
    if library:
        if text_string_to_metric_families is None:
            raise ValueError("prometheus_client is not importable by this interpreter")
        try:
            return [(s.name, dict(s.labels), float(s.value))
                    for family in text_string_to_metric_families(text) for s in family.samples]
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise ValueError("malformed Prometheus text: %s" % exc)
    return _parse_prometheus_builtin(text)


def _parse_prometheus_builtin(text):
    """The fallback parser: names, label sets with escapes, the value (timestamps ignored)."""
    samples = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if not m:
            raise ValueError("bad metric line %r" % (raw,))
        name = m.group(0)
        i = m.end()
        labels = {}
        if i < len(line) and line[i] == "{":
            labels, i = _parse_labels(line, i)
        parts = line[i:].split()
        if not parts:
            raise ValueError("metric line without a value %r" % (raw,))
        samples.append((name, labels, float(parts[0])))
    return samples


def metric_sum(text_or_samples, name, labels=None):
    """Sum of every sample called ``name`` (across label sets, optionally only those whose
    labels include ``labels``); None when the metric is absent."""
    samples = (parse_prometheus(text_or_samples) if isinstance(text_or_samples, str)
               else text_or_samples)
    total, seen = 0.0, False
    for n, lab, v in samples:
        if n != name:
            continue
        if labels and any(lab.get(k) != v2 for k, v2 in labels.items()):
            continue
        total += v
        seen = True
    return total if seen else None


SERVER_COUNTERS = {
    "output_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
}


def server_counters(text):
    """{'output_tokens': float|None, 'prompt_tokens': float|None} from a /metrics scrape."""
    samples = parse_prometheus(text)
    return dict((k, metric_sum(samples, n)) for k, n in SERVER_COUNTERS.items())


def server_cross_check(before, after, records):
    """Compare the client's usage totals over a level with the server counters' deltas.

    ``before``/``after`` are server_counters() results (or None when /metrics was not
    readable). The client totals count every request of the level that got a usage report
    (warm-up, window and drain alike), since the counters cover the whole level.
    """
    client_out = sum(r.completion_tokens or 0 for r in records)
    client_in = sum(r.prompt_tokens or 0 for r in records)
    out = {"client_output_tokens": client_out, "client_prompt_tokens": client_in,
           "server_output_tokens": None, "server_prompt_tokens": None,
           "output_diff": None, "prompt_diff": None, "match": None}
    if not before or not after:
        return out
    for key, ckey, dkey, cval in (("output_tokens", "server_output_tokens", "output_diff",
                                   client_out),
                                  ("prompt_tokens", "server_prompt_tokens", "prompt_diff",
                                   client_in)):
        if before.get(key) is not None and after.get(key) is not None:
            delta = int(round(after[key] - before[key]))
            out[ckey] = delta
            out[dkey] = cval - delta
    if out["output_diff"] is not None and out["prompt_diff"] is not None:
        out["match"] = out["output_diff"] == 0 and out["prompt_diff"] == 0
    return out
