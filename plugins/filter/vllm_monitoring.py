"""Filters over plugins/plugin_utils/monitoring/plan.py: the monitoring plan (Prometheus
scrape jobs from the inventory, alert and benchmark rules), the Grafana dashboard and its
queries. The logic (and its unit tests) stays in module_utils.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.monitoring import plan as _vm
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profile_schema import ProfileError
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profiles import (
    known_profiles, load_profile)

# Variables read of each vLLM host (nothing else of hostvars is touched; the API key only
# to learn whether one is set).
_HOST_KEYS = (
    "_vllm_service_instances", "vllm_service_instances", "vllm_service_instance",
    "vllm_service_port", "vllm_service_host", "vllm_service_profile",
    "vllm_service_served_model_name", "vllm_service_model_dir", "model_weights_dir",
    "model_weights_name", "vllm_service_api_key", "vllm_benchmark_results", "ansible_host",
    "ansible_facts", "gpu_facts", "vllm_monitoring_scrape_address",
    "vllm_monitoring_node_exporter_listen_address",
    "vllm_monitoring_dcgm_exporter_listen_address", "vllm_monitoring_dcgm_exporter_binary",
    "vllm_monitoring_default_slo_ttft_ms", "vllm_monitoring_default_slo_tpot_ms",
)


def _host_vars(hostvars, host):
    try:
        hv = hostvars[host]
    except KeyError:
        raise AnsibleFilterError("vllm_monitoring: %s is not in the inventory" % host)
    out = {}
    for key in _HOST_KEYS:
        try:
            if key in hv:
                out[key] = hv[key]
        except Exception as e:  # an undefined or failing template in that host's variables
            raise AnsibleFilterError("vllm_monitoring: %s: cannot read %s: %s"
                                     % (host, key, type(e).__name__))
    if "gpu_facts" not in out and isinstance(out.get("ansible_facts"), dict):
        out["gpu_facts"] = out["ansible_facts"].get("gpu_facts")
    out.pop("ansible_facts", None)
    return out


class _Profiles(object):
    """The model profiles (the collection's and vllm_deploy_profile_dirs'), each read by the
    collection's profile loader when first asked for (only hosts whose instances come from
    their inventory variables need one: for the served model name)."""

    def __init__(self, dirs):
        self._dirs = list(dirs or [])
        self._known = None
        self._loaded = {}

    def __contains__(self, name):
        if self._known is None:
            self._known = known_profiles(self._dirs)
        return isinstance(name, str) and name in self._known

    def __getitem__(self, name):
        if name not in self._loaded:
            self._loaded[name] = load_profile(name, None, self._dirs)
        return self._loaded[name]


def vllm_monitoring_host_inputs(hostvars, hosts, profile_dirs=None):
    """[host_input()] of each named host, read from hostvars."""
    profiles = profile_dirs if isinstance(profile_dirs, dict) else _Profiles(profile_dirs)
    try:
        return [_vm.host_input(h, _host_vars(hostvars, h), profiles) for h in hosts or []]
    except (_vm.MonitoringError, ProfileError) as e:
        raise AnsibleFilterError("vllm_monitoring: %s" % e)


def vllm_monitoring_plan(host_inputs, server, settings):
    """The plan (see vllm_monitoring.plan); the role asserts its errors are empty."""
    return _vm.plan(list(host_inputs or []), server, dict(settings or {}))


def vllm_monitoring_dashboard(title):
    return _vm.dashboard(title)


def vllm_monitoring_dashboard_queries(dashboard):
    return _vm.dashboard_queries(dashboard)


def vllm_monitoring_substitute(expr, rate_interval="1m"):
    return _vm.substitute(expr, rate_interval)


def vllm_monitoring_grafana_datasource(url):
    return _vm.grafana_datasource(url)


def vllm_monitoring_grafana_provider(path):
    return _vm.grafana_dashboards_provider(path)


def vllm_monitoring_target_health(active_targets, expected_keys):
    return _vm.target_health(active_targets, expected_keys)


def vllm_monitoring_rule_health(groups, wanted_groups):
    return _vm.rule_health(groups, wanted_groups)


def vllm_monitoring_missing_metrics(metrics_text):
    return _vm.missing_metrics(metrics_text)


def vllm_monitoring_dcgm_counters(_ignored=None):
    return _vm.dcgm_counters_csv()


class FilterModule(object):
    def filters(self):
        return {
            "vllm_monitoring_host_inputs": vllm_monitoring_host_inputs,
            "vllm_monitoring_plan": vllm_monitoring_plan,
            "vllm_monitoring_dashboard": vllm_monitoring_dashboard,
            "vllm_monitoring_dashboard_queries": vllm_monitoring_dashboard_queries,
            "vllm_monitoring_substitute": vllm_monitoring_substitute,
            "vllm_monitoring_grafana_datasource": vllm_monitoring_grafana_datasource,
            "vllm_monitoring_grafana_provider": vllm_monitoring_grafana_provider,
            "vllm_monitoring_dcgm_counters": vllm_monitoring_dcgm_counters,
            "vllm_monitoring_target_health": vllm_monitoring_target_health,
            "vllm_monitoring_rule_health": vllm_monitoring_rule_health,
            "vllm_monitoring_missing_metrics": vllm_monitoring_missing_metrics,
        }
