# -*- coding: utf-8 -*-
"""The rule files: recording rules carrying each instance's stored benchmark results and SLOs,
and the alert rules (instance down, KV cache, waiting requests, latency over the SLO,
preemptions, GPU temperature).
"""
from __future__ import annotations

import re

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.settings import (
    BENCH_MEASURED_AT, BENCH_PEAK, BENCH_PEAK_CONCURRENCY, BENCH_SINGLE, BENCH_SLO_CONCURRENCY,
    BENCH_SLO_TOK_S, DCGM_JOB, M_KV_USAGE, M_PREEMPTIONS, M_TPOT, M_TTFT, M_WAITING, NODE_JOB,
    SLO_TPOT, SLO_TTFT, timestamp, VLLM_JOB)


# --- rules ----------------------------------------------------------------------------------

def _measured_instance(h):
    """The instance the stored sweep measured (by the port of its base_url), else the first."""
    params = (h["results"] or {}).get("parameters") or {}
    m = re.search(r":([0-9]+)", str(params.get("base_url") or "").split("//", 1)[-1])
    if m:
        for inst in h["instances"]:
            if str(inst.get("port")) == m.group(1):
                return inst
    return h["instances"][0] if h["instances"] else None


def _fmt(value):
    """A number as a PromQL literal (no exponent surprises, no trailing zeros)."""
    text = ("%.6f" % float(value)).rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def _measured_instances(h):
    """[(instance, stored record)] of the host's instances that have a stored sweep: one per
    instance from ``vllm_benchmark_results.instances`` (results per instance), else the
    single top-level record of an older file, matched to its instance by the port of its
    base_url (else the first instance)."""
    results = h["results"] or {}
    per_instance = results.get("instances")
    if isinstance(per_instance, dict):
        return [(inst, per_instance[inst["name"]]) for inst in h["instances"]
                if isinstance(per_instance.get(inst["name"]), dict)]
    inst = _measured_instance(h)
    return [(inst, results)] if inst is not None and results.get("headline") else []


def _capacity_rules(rules, host, inst, results):
    """Append the recording rules of one instance's stored sweep; return what they carry."""
    head = results.get("headline") or {}
    if not head:
        return None
    labels = {"host": host, "instance": inst["name"],
              "model": inst.get("served_model_name") or "",
              "profile": inst.get("profile") or "none"}
    knee = head.get("knee") or {}
    cap = {"instance": inst["name"]}

    def add(record, value, extra=None):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            lab = dict(labels)
            lab.update(extra or {})
            rules.append({"record": record, "expr": "vector(%s)" % _fmt(value),
                          "labels": lab})
            cap[record.split(":", 1)[1]] = value

    peak_level = knee.get("max_throughput_level", head.get("peak_level"))
    add(BENCH_PEAK, knee.get("max_output_tok_s", head.get("peak_output_tok_s")),
        {"concurrency": str(peak_level)} if peak_level is not None else None)
    add(BENCH_PEAK_CONCURRENCY, peak_level)
    add(BENCH_SINGLE, head.get("single_stream_tok_s"))
    slo_level = knee.get("highest_level_meeting_slo")
    add(BENCH_SLO_CONCURRENCY, slo_level)
    for lv in results.get("levels") or []:
        if slo_level is not None and lv.get("concurrency") == slo_level:
            add(BENCH_SLO_TOK_S, lv.get("output_tok_s"), {"concurrency": str(slo_level)})
    add(BENCH_MEASURED_AT, timestamp(results.get("measured_at")))
    return cap


def benchmark_rules(hosts, settings):
    """Recording rules: the SLO of every host (recorded by its sweep, else the default) and
    the stored sweep's capacity numbers, so dashboards and alerts compare live traffic with
    measured capacity. Returns (rules document, summary per host)."""
    rules = []
    summary = []
    for h in hosts:
        results = h["results"] or {}
        params = results.get("parameters") or {}
        slo = {}
        for key, record, name in (("slo_ttft_ms", SLO_TTFT, "ttft"),
                                  ("slo_tpot_ms", SLO_TPOT, "tpot")):
            recorded = params.get(key)
            if isinstance(recorded, (int, float)) and not isinstance(recorded, bool) \
                    and recorded > 0:
                value, source = float(recorded), "benchmark"
            else:
                value = float(h["overrides"].get("default_" + key, settings["default_" + key]))
                source = "default"
            slo[name] = {"ms": value, "source": source}
            rules.append({"record": record, "expr": "vector(%s)" % _fmt(value / 1000.0),
                          "labels": {"host": h["host"], "source": source}})
        entry = {"host": h["host"], "slo": slo, "capacity": None, "capacities": []}
        for inst, record in _measured_instances(h):
            cap = _capacity_rules(rules, h["host"], inst, record)
            if cap is not None:
                entry["capacities"].append(cap)
        entry["capacity"] = entry["capacities"][0] if entry["capacities"] else None
        summary.append(entry)
    return {"groups": [{"name": "vllm-deploy-benchmark", "rules": rules}]}, summary


def _sel(job=None, extra=""):
    parts = []
    if job:
        parts.append('job="%s"' % job)
    if extra:
        parts.append(extra)
    return "{%s}" % ", ".join(parts) if parts else ""


def alert_rules(settings):
    """The alert rules (thresholds and `for` durations from the settings)."""
    s = settings
    lat = s["alert_latency_window"]
    v = _sel(VLLM_JOB)

    def quantile(metric, q=0.99):
        return ("histogram_quantile(%s, sum by (host, instance, le) (rate(%s_bucket%s[%s])))"
                % (q, metric, v, lat))

    def slo_value(record):
        return ('{{ with printf "%s{host=\'%%s\'}" $labels.host | query }}'
                '{{ . | first | value | humanizeDuration }}{{ end }}' % record)

    rules = [
        {"alert": "VLLMInstanceDown",
         "expr": "up%s == 0" % v,
         "for": s["alert_instance_down_for"],
         "labels": {"severity": "critical"},
         "annotations": {
             "summary": "vLLM instance {{ $labels.instance }} on {{ $labels.host }} is down",
             "description": ("Prometheus could not scrape {{ $labels.instance }} "
                             "({{ $labels.model }}, profile {{ $labels.profile }}) on "
                             "{{ $labels.host }} for %s: the server is stopped, crashed or "
                             "still loading. Check systemctl status vllm-{{ $labels.instance }}"
                             " and its journal." % s["alert_instance_down_for"])}},
        {"alert": "VLLMKVCacheNearlyFull",
         "expr": "max by (host, instance) (%s%s) > %s" % (M_KV_USAGE, v,
                                                          _fmt(s["alert_kv_cache_usage_threshold"])),
         "for": s["alert_kv_cache_for"],
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "KV cache of {{ $labels.instance }} on {{ $labels.host }} is "
                        "{{ $value | humanizePercentage }} full",
             "description": ("KV-cache usage above %s%% for %s: new requests queue and running "
                             "ones get preempted. Lower the concurrency, raise "
                             "gpu_memory_utilization or add an instance."
                             % (_fmt(s["alert_kv_cache_usage_threshold"] * 100),
                                s["alert_kv_cache_for"]))}},
        {"alert": "VLLMWaitingRequestsGrowing",
         "expr": ("sum by (host, instance) (%s%s) > %d and sum by (host, instance) "
                  "(deriv(%s%s[%s])) > 0" % (M_WAITING, v, s["alert_waiting_requests_min"],
                                             M_WAITING, v, s["alert_waiting_window"])),
         "for": s["alert_waiting_for"],
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "{{ $value }} requests waiting on {{ $labels.instance }} "
                        "({{ $labels.host }}) and the queue grows",
             "description": ("More than %d requests waiting and the queue grew over %s, for %s:"
                             " the offered load is above what the instance serves."
                             % (s["alert_waiting_requests_min"], s["alert_waiting_window"],
                                s["alert_waiting_for"]))}},
        {"alert": "VLLMTTFTAboveSLO",
         "expr": "%s > on (host) group_left () %s" % (quantile(M_TTFT), SLO_TTFT),
         "for": s["alert_latency_for"],
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "TTFT p99 of {{ $labels.instance }} on {{ $labels.host }} is "
                        "{{ $value | humanizeDuration }}, above its SLO",
             "description": ("TTFT p99 over %s above the SLO %s (%s: recorded by the "
                             "benchmark for this host, else vllm_monitoring_default_slo_ttft_ms)"
                             " for %s." % (lat, slo_value(SLO_TTFT), SLO_TTFT,
                                           s["alert_latency_for"]))}},
        {"alert": "VLLMTPOTAboveSLO",
         "expr": "%s > on (host) group_left () %s" % (quantile(M_TPOT), SLO_TPOT),
         "for": s["alert_latency_for"],
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "TPOT p99 of {{ $labels.instance }} on {{ $labels.host }} is "
                        "{{ $value | humanizeDuration }}, above its SLO",
             "description": ("TPOT p99 over %s above the SLO %s (%s: recorded by the "
                             "benchmark for this host, else vllm_monitoring_default_slo_tpot_ms)"
                             " for %s." % (lat, slo_value(SLO_TPOT), SLO_TPOT,
                                           s["alert_latency_for"]))}},
        {"alert": "VLLMPreempting",
         "expr": "sum by (host, instance) (rate(%s%s[%s])) > 0" % (M_PREEMPTIONS, v, lat),
         "for": s["alert_preemptions_for"],
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "{{ $labels.instance }} on {{ $labels.host }} preempts requests",
             "description": ("Requests were preempted (KV cache exhausted) continuously for %s;"
                             " they are recomputed, which costs throughput and latency."
                             % s["alert_preemptions_for"])}},
        {"alert": "NodeExporterDown",
         "expr": "up%s == 0" % _sel(NODE_JOB),
         "for": s["alert_instance_down_for"],
         "labels": {"severity": "warning"},
         "annotations": {"summary": "node exporter on {{ $labels.host }} is down",
                         "description": "Host metrics of {{ $labels.host }} are missing."}},
        {"alert": "DCGMExporterDown",
         "expr": "up%s == 0" % _sel(DCGM_JOB),
         "for": s["alert_instance_down_for"],
         "labels": {"severity": "warning"},
         "annotations": {"summary": "DCGM exporter on {{ $labels.host }} is down",
                         "description": "GPU metrics (and the GPU alerts) of {{ $labels.host }}"
                                        " are missing."}},
        {"alert": "GPUTemperatureHigh",
         "expr": "DCGM_FI_DEV_GPU_TEMP > %s" % _fmt(s["alert_gpu_temp_c"]),
         "for": s["alert_gpu_temp_for"],
         "labels": {"severity": "warning"},
         "annotations": {
             "summary": "GPU {{ $labels.gpu }} on {{ $labels.host }} at {{ $value }} C",
             "description": "GPU temperature above %s C for %s: check cooling; the GPU "
                            "throttles." % (_fmt(s["alert_gpu_temp_c"]), s["alert_gpu_temp_for"])}},
        {"alert": "GPUXidError",
         "expr": "DCGM_FI_DEV_XID_ERRORS > 0",
         "labels": {"severity": "critical"},
         "annotations": {
             "summary": "XID {{ $value }} on GPU {{ $labels.gpu }} of {{ $labels.host }}",
             "description": "The driver reported XID error {{ $value }} (see NVIDIA's XID "
                            "catalogue): 48/63/64/74/79/94/95 usually mean the GPU or the "
                            "server must be reset."}},
    ]
    return {"groups": [{"name": "vllm-deploy-alerts", "rules": rules}]}
