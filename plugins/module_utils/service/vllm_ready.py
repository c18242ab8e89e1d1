"""Readiness checks for a vLLM OpenAI-compatible endpoint (the standard library and
ansible.module_utils.urls, which every module payload carries).

Ready means, in order: GET /health answers 200 (a refused connection means still loading;
503 means the engine died: the caller's on_wait decides whether to keep waiting), GET
/v1/models lists the served model name, and one real completion returns exactly the requested
number of tokens (counted by the server's usage).
"""
from __future__ import annotations

import json
import socket
import time
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import open_url


class EndpointError(Exception):
    """The endpoint answered, but not the way a ready vLLM server does."""


class LoadTimeout(TimeoutError):
    """The deadline passed while the server was still loading; ``last`` is the last /health
    answer (None = connection refused)."""

    def __init__(self, message, last=None, elapsed=0.0):
        super().__init__(message)
        self.last = last
        self.elapsed = elapsed


def _request(url, api_key=None, body=None, timeout=10.0):
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    try:
        with open_url(url, data=data, headers=headers, method="POST" if data else "GET",
                      timeout=timeout) as resp:
            return resp.status, resp.read()
    except HTTPError as e:
        return e.code, e.read()


def health(base_url, timeout=5.0):
    """Return the HTTP status of /health, or None when nothing accepts the connection yet."""
    try:
        status, _unused = _request(base_url.rstrip("/") + "/health", timeout=timeout)
        return status
    except (URLError, ConnectionError, socket.timeout, OSError):
        return None


def served_models(base_url, api_key=None, timeout=10.0):
    status, raw = _request(base_url.rstrip("/") + "/v1/models", api_key=api_key, timeout=timeout)
    if status == 401:
        raise EndpointError("GET /v1/models answered 401: the API key is missing or wrong")
    if status != 200:
        raise EndpointError("GET /v1/models answered %s: %s" % (status, raw[:300]))
    return [m.get("id") for m in json.loads(raw).get("data", [])]


def completion_check(base_url, model, tokens, api_key=None, timeout=120.0):
    """One completion with an exact output length; returns the server's usage."""
    body = {"model": model, "prompt": "The quick brown fox", "max_tokens": tokens,
            "min_tokens": tokens, "ignore_eos": True, "temperature": 0.0}
    status, raw = _request(base_url.rstrip("/") + "/v1/completions", api_key=api_key,
                           body=body, timeout=timeout)
    if status != 200:
        raise EndpointError("POST /v1/completions answered %s: %s" % (status, raw[:300]))
    doc = json.loads(raw)
    usage = doc.get("usage") or {}
    got = usage.get("completion_tokens")
    if got != tokens:
        raise EndpointError("completion returned %s tokens, %d were requested" % (got, tokens))
    return {"usage": usage, "text": doc["choices"][0].get("text", "")}


def wait_ready(base_url, model, timeout_s, tokens=8, api_key=None, poll_s=2.0,
               clock=time.monotonic, sleep=time.sleep, on_wait=None):
    """Wait for /health 200, then check /v1/models and one completion.

    Returns a dict with the elapsed seconds and what was checked. Raises EndpointError on a
    definite failure (model not served, wrong token count, or whatever ``on_wait`` raises,
    e.g. the unit crashing) and
    LoadTimeout (a TimeoutError) when the deadline passes while still loading.
    """
    start = clock()
    last = None
    while True:
        last = health(base_url)
        if last == 200:
            break
        if clock() - start >= timeout_s:
            raise LoadTimeout("%s/health not ready after %.0f s (last answer: %s)"
                              % (base_url, clock() - start,
                                 "connection refused" if last is None else last),
                              last=last, elapsed=clock() - start)
        if on_wait is not None:
            on_wait(clock() - start, last)
        sleep(poll_s)
    models = served_models(base_url, api_key=api_key)
    if model not in models:
        raise EndpointError("model %r is not served; served names: %s"
                            % (model, ", ".join(models) or "none"))
    done = completion_check(base_url, model, tokens, api_key=api_key)
    return {"elapsed_s": round(clock() - start, 1), "health_status": last, "models": models,
            "completion_tokens": done["usage"].get("completion_tokens"),
            "prompt_tokens": done["usage"].get("prompt_tokens")}
