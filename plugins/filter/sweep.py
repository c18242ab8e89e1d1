"""Filters for the sweep results kept in the inventory."""
from __future__ import annotations

_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def vllm_sweep_compact(level):
    """The per-level figures worth keeping in host_vars (the full data goes to reports)."""
    out = {k: level.get(k) for k in ("concurrency", "requests_ok", "requests_failed",
                                      "output_tok_s", "total_tok_s", "request_s",
                                      "achieved_concurrency", "window_s")}
    for key in _LATENCIES:
        stats = level.get(key) or {}
        out[key] = {p: stats.get(p) for p in ("mean", "p50", "p90", "p99") if p in stats}
    flags = []
    if level.get("requests_failed"):
        flags.append("errors")
    if (level.get("output_length") or {}).get("marked"):
        flags.append("length-miss")
    if (level.get("client") or {}).get("client_limited"):
        flags.append("client-limited")
    if (level.get("slo") or {}).get("met") is False:
        flags.append("slo-broken")
    check = level.get("server_check") or {}
    if check.get("match") is False:
        flags.append("server-count-diff")
    out["flags"] = flags
    if level.get("goodput") is not None:
        out["goodput"] = level.get("goodput")
    if level.get("saturation_signal"):
        out["saturation_signal"] = level["saturation_signal"]
    return out


class FilterModule(object):
    def filters(self):
        return {"vllm_sweep_compact": vllm_sweep_compact}
