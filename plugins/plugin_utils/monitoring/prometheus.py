# -*- coding: utf-8 -*-
"""What the role reads of each vLLM host (host_input) and the Prometheus configuration generated
from it: one scrape job per vLLM instance, node and DCGM exporters, the credentials files.
"""
from __future__ import annotations

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring.settings import (
    ANY, DCGM_JOB, LOOPBACK, MonitoringError, NODE_JOB, parse_listen, PROMETHEUS_JOB,
    ROUTER_JOB, safe_name, VLLM_JOB)


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
