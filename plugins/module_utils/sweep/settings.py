# -*- coding: utf-8 -*-
"""The sweep's settings: the parameter checks (each error names its parameter) and
:class:`SweepSettings`, the typed, frozen form of the parameters every part of the sweep reads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Optional, Tuple

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep._stream import Endpoint

STREAM_TRANSPORTS = ("native", "aiohttp")
PROMPT_FORMATS = ("token_ids", "text")
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


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


def check_levels(levels, name="levels", ascending=False, coerce=False):
    """The one check of a list of concurrency levels: at least one, each a positive integer,
    none repeated (and ascending when asked). ``coerce``: integer strings ("4") count as
    integers (levels from a command line or an inventory). Returns the levels as ints; raises
    ValueError naming ``name``."""
    if isinstance(levels, str) or not isinstance(levels, (list, tuple)) or not levels:
        raise ValueError("%s must list at least one concurrency, got %r" % (name, levels))
    out, bad = [], []
    for c in levels:
        v = c
        if coerce and isinstance(c, str) and c.strip().isdigit():
            v = int(c.strip())
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            bad.append(c)
        out.append(v)
    if bad:
        raise ValueError("%s must be positive integers, got %s in %s" % (name, bad, list(levels)))
    if len(set(out)) != len(out):
        raise ValueError("%s must not repeat a concurrency: %s" % (name, out))
    if ascending and out != sorted(out):
        raise ValueError("%s must be ascending, got %s" % (name, out))
    return out


SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


def check_also_slos(also, var="also_slos"):
    """``also_slos``: {name: {ttft_ms, tpot_ms, e2e_ms}}, each name a word, each SLO a
    mapping of at least one of those keys to a number > 0; raise SweepError naming ``var``."""
    if also is None:
        return
    if not isinstance(also, dict):
        raise SweepError("%s must be a mapping of a name to its SLO, got %r" % (var, also))
    for name, slo in also.items():
        if not isinstance(name, str) or not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$", name):
            raise SweepError("%s: %r is not a name (letters, digits, _ . : -)" % (var, name))
        if not isinstance(slo, dict) or not slo or set(slo) - set(SLO_KEYS):
            raise SweepError("%s.%s must map some of %s to milliseconds, got %r"
                             % (var, name, ", ".join(SLO_KEYS), slo))
        for key, v in slo.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise SweepError("%s.%s.%s must be a number > 0, got %r" % (var, name, key, v))


def check_params(p):
    """Validate the sweep parameters (a dict); raise SweepError naming the variable."""
    try:
        check_levels(p.get("levels") or [])
    except ValueError as e:
        raise SweepError(str(e))
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
    check_also_slos(p.get("also_slos"))
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
    if p.get("min_lifetimes") is not None and not p["min_lifetimes"] > 0:
        raise SweepError("min_lifetimes must be > 0 when given, got %r" % (p["min_lifetimes"],))
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


def request_headers(api_key):
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = "Bearer " + api_key
    return h


def short(text, n=300):
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


@dataclass(frozen=True)
class SweepSettings(object):
    """The sweep's parameters, checked (:func:`check_params`) and with their defaults filled in.
    Secrets (api_key, load_generator_authkey) are left out of ``repr``."""

    base_url: str
    model: str
    levels: Tuple[int, ...]
    input_len: int
    output_len: int
    duration_s: float
    request_timeout_s: float
    saturation_threshold: float
    endpoint: str = "completions"
    min_requests: Optional[int] = None
    warmup_requests: Optional[int] = None
    slo_ttft_ms: Optional[float] = None
    slo_tpot_ms: Optional[float] = None
    slo_e2e_ms: Optional[float] = None
    also_slos: Optional[dict] = None
    stop_on_saturation: bool = True
    prompt_format: str = "token_ids"
    stream_transport: str = "native"
    event_loop: str = "auto"
    repeats: int = 1
    processes: int = 1
    precision_pct: Optional[float] = None
    min_lifetimes: Optional[float] = None
    max_duration_s: Optional[float] = None
    vocab_size: Optional[int] = None
    metrics_url: Optional[str] = None
    seed: Optional[int] = None
    chunk_usage: bool = False
    gc_during_level: bool = False
    load_generators: Tuple[dict, ...] = ()
    api_key: Optional[str] = None
    load_generator_authkey: Optional[str] = None

    # parameters whose None (or absence) means the default
    _OR_DEFAULT = ("prompt_format", "stream_transport", "event_loop", "repeats", "processes",
                   "load_generators")

    @classmethod
    def from_params(cls, params):
        """Check ``params`` (a dict, as the module passes them) and type them; raises
        SweepError naming the parameter."""
        check_params(params)
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(params) - set(names))
        if unknown:
            raise SweepError("unknown sweep parameter(s): %s" % ", ".join(unknown))
        values = {}
        for f in fields(cls):
            if f.name not in params:
                continue
            v = params[f.name]
            if v is None and f.name in cls._OR_DEFAULT:
                continue
            values[f.name] = v
        values["levels"] = tuple(values["levels"])
        values["load_generators"] = tuple(dict(lg) for lg in values.get("load_generators") or ())
        return cls(**values)

    def __repr__(self):
        shown = ", ".join("%s=%r" % (f.name, getattr(self, f.name)) for f in fields(self)
                          if f.name not in SECRET_PARAMS)
        return "SweepSettings(%s)" % shown
