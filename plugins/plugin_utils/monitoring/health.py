# -*- coding: utf-8 -*-
"""Checks of a running monitoring stack: the metric names the rules and dashboard use against a
server's /metrics, Prometheus' target and rule health, the DCGM exporter's counters file.
"""
from __future__ import annotations

import re

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.settings import (
    DCGM_FIELDS, M_E2E, M_GEN_TOKENS, M_ITL, M_KV_USAGE, M_PREEMPTIONS, M_PREFIX_HITS,
    M_PREFIX_QUERIES, M_PROMPT_TOKENS, M_QUEUE, M_RUNNING, M_SUCCESS, M_TPOT, M_TTFT, M_WAITING,
    R_ACTIVE, R_DURATION, R_PROCESSED, R_REQUESTS, R_WORKER_HEALTH)


def dcgm_counters_csv():
    lines = ["# Written by vllm-deploy (vllm_monitoring): the DCGM fields its rules and "
             "dashboard use.", "# Format: DCGM field, Prometheus metric type, help message"]
    lines += ["%s, %s, %s" % f for f in DCGM_FIELDS]
    return "\n".join(lines) + "\n"


def metric_names():
    """The vLLM metric names the rules and the dashboard use (histograms without _bucket)."""
    return [M_RUNNING, M_WAITING, M_KV_USAGE, M_GEN_TOKENS, M_PROMPT_TOKENS, M_SUCCESS,
            M_PREEMPTIONS, M_PREFIX_HITS, M_PREFIX_QUERIES, M_TTFT, M_TPOT, M_ITL, M_E2E,
            M_QUEUE]


def router_metric_names():
    """The router metrics the dashboard uses that exist once the router routed a request
    (the retry counters appear only with a retry; the dashboard reads them as 0 until then)."""
    return [R_REQUESTS, R_PROCESSED, R_WORKER_HEALTH, R_ACTIVE, R_DURATION]


def missing_metrics(metrics_text, names=None):
    """Names of metric_names() absent from a /metrics page (histograms: their _bucket)."""
    present = set()
    for line in (metrics_text or "").splitlines():
        if line and not line.startswith("#"):
            present.add(re.split(r"[{ ]", line, 1)[0])
    out = []
    for name in names or metric_names():
        if name not in present and name + "_bucket" not in present:
            out.append(name)
    return out


def target_key(job, host, instance):
    return "%s/%s/%s" % (job, host, instance)


def target_health(active_targets, expected_keys):
    """From /api/v1/targets' activeTargets: the expected targets not (yet) up, each as
    'job/host/instance: health (last error)'; [] when all are up."""
    seen = {}
    for t in active_targets or []:
        lab = t.get("labels") or {}
        key = target_key(lab.get("job"), lab.get("host"), lab.get("instance"))
        seen[key] = t
    out = []
    for key in expected_keys or []:
        t = seen.get(key)
        if t is None:
            out.append("%s: not loaded yet" % key)
        elif t.get("health") != "up":
            out.append("%s: %s%s" % (key, t.get("health") or "unknown",
                                     " (%s)" % t["lastError"] if t.get("lastError") else ""))
    return out


def rule_health(groups, wanted_groups):
    """From /api/v1/rules' groups: problems of the wanted rule groups ([] = every rule of
    them evaluated without error)."""
    by_name = dict((g.get("name"), g) for g in groups or [])
    out = []
    for name in wanted_groups or []:
        g = by_name.get(name)
        if g is None:
            out.append("rule group %s: not loaded yet" % name)
            continue
        for r in g.get("rules") or []:
            if r.get("health") != "ok":
                out.append("%s %s: %s%s" % (name, r.get("name"), r.get("health") or "unknown",
                                            " (%s)" % r["lastError"] if r.get("lastError")
                                            else ""))
    return out
