"""Filters of the vllm_router role: the router's plan for one host (the logic and its unit
tests: plugins/plugin_utils/service/router.py)."""
from __future__ import annotations

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service import router as _router


def vllm_router_plan(instances, settings):
    """Which instances stand behind the host's router, its argv and every refusal
    ({'enabled', 'errors', 'workers', 'model', 'url', 'argv', 'metrics_url', 'unit'})."""
    return _router.router_plan(instances, settings)


def vllm_router_rolling(transition, instances, plan, live_urls=None, host_ports=None):
    """Whether vllm_service's transition rolls through the router one instance at a time
    ({'roll': [names], 'reason'})."""
    return _router.rolling(transition, instances, plan, live_urls, host_ports)


def vllm_requests_in_flight(metrics_text):
    """Running plus waiting requests of a vLLM instance, from its /metrics text (None: no
    such gauge in it)."""
    return _router.requests_in_flight(metrics_text)


class FilterModule(object):
    def filters(self):
        return {"vllm_router_plan": vllm_router_plan,
                "vllm_router_rolling": vllm_router_rolling,
                "vllm_requests_in_flight": vllm_requests_in_flight}
