# -*- coding: utf-8 -*-
"""The Grafana dashboard (panels over the vLLM, node and DCGM metrics, the benchmark's recording
rules beside the live figures) and Grafana's provisioning files.
"""
from __future__ import annotations

import re

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.settings import (
    BENCH_PEAK, BENCH_PEAK_CONCURRENCY, BENCH_SLO_CONCURRENCY, M_E2E, M_GEN_TOKENS, M_ITL,
    M_KV_USAGE, M_PREEMPTIONS, M_PREFIX_HITS, M_PREFIX_QUERIES, M_PROMPT_TOKENS, M_QUEUE,
    M_RUNNING, M_SUCCESS, M_TPOT, M_TTFT, M_WAITING, R_ACTIVE, R_DURATION, R_PROCESSED, R_REQUESTS,
    R_RETRIES, R_RETRIES_EXHAUSTED, R_WORKER_HEALTH, SLO_TPOT, SLO_TTFT, VLLM_JOB)


# --- the Grafana dashboard --------------------------------------------------------------------

DASHBOARD_UID = "vllm-deploy"
DS = {"type": "prometheus", "uid": "${datasource}"}
_F = '{host=~"$host", instance=~"$instance"}'
_H = '{host=~"$host"}'
RI = "$__rate_interval"


def _q(metric, q):
    return ("histogram_quantile(%s, sum by (host, instance, le) (rate(%s_bucket%s[%s])))"
            % (q, metric, _F, RI))


def _rate(metric, by="host, instance"):
    return "sum by (%s) (rate(%s%s[%s]))" % (by, metric, _F, RI)


def _zero_when_absent(expr):
    """A per-host counter rate that reads 0 while the counter does not exist yet (the router
    creates its retry counters at the first retry): 0 for each host whose router is scraped."""
    return "%s or sum by (host) (0 * %s%s)" % (expr, R_ACTIVE, _H)


# (title, unit, description, [(expr, legend)], needs) -- grouped in rows. needs: False (every
# host), True (a GPU: the DCGM exporter), "router" (vLLM's router on the host).
PANELS = [
    ("Traffic and measured capacity", [
        ("Output tokens/s: live and measured peak", "short",
         "Generated tokens per second per instance (vllm:generation_tokens_total), prompt "
         "tokens per second, and the peak output tok/s the stored benchmark sweep measured "
         "for that instance (dashed: where the sweep saturated).",
         [(_rate(M_GEN_TOKENS), "{{host}}/{{instance}} output"),
          (_rate(M_PROMPT_TOKENS), "{{host}}/{{instance}} prompt"),
          (BENCH_PEAK + _F, "{{host}}/{{instance}} measured peak (c={{concurrency}})")], False),
        ("Capacity used (live output tok/s / measured peak)", "percentunit",
         "Live output tokens per second divided by the benchmark's peak: near 100% the "
         "instance runs at the throughput where the sweep saturated.",
         [("%s / on (host, instance) %s" % (_rate(M_GEN_TOKENS), BENCH_PEAK + _F),
           "{{host}}/{{instance}}")], False),
        ("Finished requests/s by reason", "reqps",
         "Requests finished per second, by finish reason (stop, length, abort, error).",
         [(_rate(M_SUCCESS, "host, instance, finished_reason"),
           "{{host}}/{{instance}} {{finished_reason}}")], False),
    ]),
    ("Latency (from the server's histograms)", [
        ("TTFT p50 / p90 / p99", "s",
         "Time to first token (vllm:time_to_first_token_seconds) at p50, p90 and p99 over "
         "the rate window, with the host's TTFT SLO (recorded by the benchmark, else the "
         "default).",
         [(_q(M_TTFT, 0.5), "{{host}}/{{instance}} p50"),
          (_q(M_TTFT, 0.9), "{{host}}/{{instance}} p90"),
          (_q(M_TTFT, 0.99), "{{host}}/{{instance}} p99"),
          (SLO_TTFT + _H, "{{host}} SLO ({{source}})")], False),
        ("TPOT p50 / p90 / p99", "s",
         "Time per output token per request (vllm:request_time_per_output_token_seconds), "
         "with the host's TPOT SLO.",
         [(_q(M_TPOT, 0.5), "{{host}}/{{instance}} p50"),
          (_q(M_TPOT, 0.9), "{{host}}/{{instance}} p90"),
          (_q(M_TPOT, 0.99), "{{host}}/{{instance}} p99"),
          (SLO_TPOT + _H, "{{host}} SLO ({{source}})")], False),
        ("ITL p50 / p90 / p99", "s",
         "Inter-token latency: gaps between streamed tokens "
         "(vllm:inter_token_latency_seconds).",
         [(_q(M_ITL, 0.5), "{{host}}/{{instance}} p50"),
          (_q(M_ITL, 0.9), "{{host}}/{{instance}} p90"),
          (_q(M_ITL, 0.99), "{{host}}/{{instance}} p99")], False),
        ("End-to-end latency and queue time", "s",
         "Request latency end to end (p50, p99) and time spent waiting in the queue (p99).",
         [(_q(M_E2E, 0.5), "{{host}}/{{instance}} e2e p50"),
          (_q(M_E2E, 0.99), "{{host}}/{{instance}} e2e p99"),
          (_q(M_QUEUE, 0.99), "{{host}}/{{instance}} queue p99")], False),
    ]),
    ("Scheduler and KV cache", [
        ("Running and waiting requests", "short",
         "Requests in the running batch and waiting in the queue, with the concurrency of "
         "the sweep's peak and the highest concurrency that met the SLO (when one was set).",
         [("sum by (host, instance) (%s%s)" % (M_RUNNING, _F), "{{host}}/{{instance}} running"),
          ("sum by (host, instance) (%s%s)" % (M_WAITING, _F), "{{host}}/{{instance}} waiting"),
          (BENCH_PEAK_CONCURRENCY + _F, "{{host}}/{{instance}} measured peak concurrency"),
          (BENCH_SLO_CONCURRENCY + _F, "{{host}}/{{instance}} highest concurrency meeting the SLO")],
         False),
        ("KV-cache usage", "percentunit",
         "Fraction of the KV cache in use (vllm:kv_cache_usage_perc, 1 = full); the "
         "VLLMKVCacheNearlyFull alert fires above its threshold.",
         [("max by (host, instance) (%s%s)" % (M_KV_USAGE, _F), "{{host}}/{{instance}}")],
         False),
        ("Prefix-cache hit rate", "percentunit",
         "Prompt tokens served from the prefix cache divided by the tokens looked up "
         "(vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total).",
         [("%s / %s" % (_rate(M_PREFIX_HITS), _rate(M_PREFIX_QUERIES)),
           "{{host}}/{{instance}}")], False),
        ("Preemptions/s", "short",
         "Requests preempted per second (KV cache exhausted; they are recomputed later).",
         [(_rate(M_PREEMPTIONS), "{{host}}/{{instance}}")], False),
    ]),
    ("GPUs (DCGM exporter)", [
        ("GPU utilisation", "percent",
         "Busy time of each GPU (DCGM_FI_DEV_GPU_UTIL).",
         [("DCGM_FI_DEV_GPU_UTIL" + _H, "{{host}} GPU {{gpu}}")], True),
        ("GPU memory used", "percentunit",
         "Framebuffer memory used / total of each GPU (vLLM reserves "
         "gpu_memory_utilization of it at start).",
         [("DCGM_FI_DEV_FB_USED%s / (DCGM_FI_DEV_FB_USED%s + DCGM_FI_DEV_FB_FREE%s)"
           % (_H, _H, _H), "{{host}} GPU {{gpu}}")], True),
        ("GPU temperature", "celsius",
         "Temperature of each GPU (DCGM_FI_DEV_GPU_TEMP); GPUTemperatureHigh fires above "
         "its threshold.",
         [("DCGM_FI_DEV_GPU_TEMP" + _H, "{{host}} GPU {{gpu}}")], True),
    ]),
    ("Router (vLLM's router, the host's front door)", [
        ("Router requests/s, retries and failures", "reqps",
         "Requests the router answered per second by route (vllm_router_requests_total), the "
         "retries it made on another attempt (vllm_router_retries_total) and the requests "
         "that failed after every retry (vllm_router_retries_exhausted_total).",
         [("sum by (host, route) (rate(%s%s[%s]))" % (R_REQUESTS, _H, RI), "{{host}} {{route}}"),
          (_zero_when_absent("sum by (host) (rate(%s%s[%s]))" % (R_RETRIES, _H, RI)),
           "{{host}} retries"),
          (_zero_when_absent("sum by (host) (rate(%s%s[%s]))" % (R_RETRIES_EXHAUSTED, _H, RI)),
           "{{host}} failed after retries")], "router"),
        ("Requests/s routed to each instance", "reqps",
         "Requests the router sent to each instance (vllm_router_processed_requests_total): "
         "how its policy spreads the load.",
         [("sum by (host, worker) (rate(%s%s[%s]))" % (R_PROCESSED, _H, RI),
           "{{host}} {{worker}}")], "router"),
        ("Instances in the router and their health", "short",
         "Instances the router lists (vllm_router_active_workers) and each one's health as its "
         "checks see it (vllm_router_worker_health, 1 = healthy); a rolling change takes one "
         "out and puts it back.",
         [("max by (host) (%s%s)" % (R_ACTIVE, _H), "{{host}} instances listed"),
          ("max by (host, worker) (%s%s)" % (R_WORKER_HEALTH, _H), "{{host}} {{worker}} healthy")],
         "router"),
        ("Router request duration p50 / p99", "s",
         "Time from the router receiving a request to its answer "
         "(vllm_router_generate_duration_seconds): the instance's latency plus the router's.",
         [("histogram_quantile(0.5, sum by (host, le) (rate(%s_bucket%s[%s])))" % (R_DURATION, _H, RI),
           "{{host}} p50"),
          ("histogram_quantile(0.99, sum by (host, le) (rate(%s_bucket%s[%s])))" % (R_DURATION, _H, RI),
           "{{host}} p99")], "router"),
    ]),
    ("Hosts and scraping", [
        ("Host CPU busy", "percentunit",
         "Share of CPU time not idle per host (node exporter).",
         [('1 - avg by (host) (rate(node_cpu_seconds_total{mode="idle", host=~"$host"}[%s]))'
           % RI, "{{host}}")], False),
        ("Host memory available", "percentunit",
         "MemAvailable / MemTotal per host (node exporter).",
         [("node_memory_MemAvailable_bytes%s / node_memory_MemTotal_bytes%s" % (_H, _H),
           "{{host}}")], False),
        ("Scrape targets up", "short",
         "1 when Prometheus scraped the target at its last attempt (vLLM instances, node "
         "exporters, DCGM exporters, Prometheus itself).",
         [("up" + _H, "{{job}} {{host}} {{instance}}")], False),
    ]),
]


def dashboard(title="vLLM (vllm-deploy)"):
    """The Grafana dashboard (JSON model, schemaVersion 39), provisioned as a file."""
    panels = []
    pid = 1
    y = 0
    for row_title, row in PANELS:
        panels.append({"id": pid, "type": "row", "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid += 1
        y += 1
        for n, (ptitle, unit, desc, targets, needs) in enumerate(row):
            x = 0 if n % 2 == 0 else 12
            panels.append({
                "id": pid, "type": "timeseries", "title": ptitle, "description": desc,
                "datasource": DS,
                "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": unit, "custom": {"lineWidth": 1}},
                                "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi", "sort": "desc"}},
                "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr,
                             "legendFormat": legend, "range": True}
                            for i, (expr, legend) in enumerate(targets)],
                # vllm-deploy's tests read this: DCGM panels need a GPU host to return data,
                # router panels a host with vLLM's router.
                "vllm_deploy": {"requires_gpu": needs is True,
                                "requires": "gpu" if needs is True else (needs or "")},
            })
            pid += 1
            if x == 12:
                y += 8
        if len(row) % 2:
            y += 8

    def var(name, label, query):
        return {"name": name, "label": label, "type": "query", "datasource": DS,
                "definition": query, "query": {"query": query, "refId": name},
                "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*",
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                "sort": 1}

    return {
        "uid": DASHBOARD_UID, "title": title, "tags": ["vllm", "vllm-deploy"],
        "description": "vLLM instances deployed by vllm-deploy: traffic against the "
                       "benchmark's measured capacity, latency percentiles, scheduler, KV "
                       "cache, GPUs and hosts.",
        "editable": True, "graphTooltip": 1, "refresh": "30s", "schemaVersion": 39,
        "version": 1, "timezone": "browser", "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            var("host", "Host", 'label_values(up{job="%s"}, host)' % VLLM_JOB),
            var("instance", "Instance",
                'label_values(up{job="%s", host=~"$host"}, instance)' % VLLM_JOB),
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def dashboard_queries(dash):
    """Every query of a dashboard: [{panel, ref, expr, requires_gpu, requires}] (requires: "",
    "gpu" or "router"), template variables' label_values() selectors included (as panel
    'variable <name>')."""
    out = []
    for p in (dash or {}).get("panels") or []:
        for t in p.get("targets") or []:
            meta = p.get("vllm_deploy") or {}
            out.append({"panel": p.get("title"), "ref": t.get("refId"), "expr": t.get("expr"),
                        "requires_gpu": bool(meta.get("requires_gpu")),
                        "requires": meta.get("requires")
                        or ("gpu" if meta.get("requires_gpu") else "")})
    for v in ((dash or {}).get("templating") or {}).get("list") or []:
        m = re.match(r"^label_values\((.*),\s*(\w+)\)$", str(v.get("definition") or ""))
        if m:
            out.append({"panel": "variable %s" % v["name"], "ref": m.group(2),
                        "expr": m.group(1), "requires_gpu": False, "requires": ""})
    return out


def substitute(expr, rate_interval="1m", variables=None):
    """A dashboard query as Prometheus runs it: Grafana's variables replaced ($host and
    $instance by '.*' = All, $__rate_interval by rate_interval)."""
    values = {"host": ".*", "instance": ".*"}
    values.update(variables or {})
    out = expr.replace("$__rate_interval", rate_interval)
    for name in sorted(values, key=len, reverse=True):
        out = out.replace("${%s}" % name, values[name]).replace("$" + name, values[name])
    return out


def grafana_datasource(url):
    return {"apiVersion": 1, "datasources": [{
        "name": "vllm-deploy Prometheus", "uid": "vllm-deploy-prometheus", "type": "prometheus",
        "access": "proxy", "url": url, "isDefault": False, "editable": False}]}


def grafana_dashboards_provider(path):
    return {"apiVersion": 1, "providers": [{
        "name": "vllm-deploy", "folder": "vllm-deploy", "type": "file",
        "disableDeletion": False, "allowUiUpdates": False, "updateIntervalSeconds": 60,
        "options": {"path": path, "foldersFromFilesStructure": False}}]}
