"""Filters of the vllm_router role: the router's plan for one host (the logic and its unit
tests: plugins/plugin_utils/service/router.py)."""
from __future__ import annotations

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service import router as _router


def vllm_router_plan(instances, settings):
    """Which instances stand behind the host's router, its argv and every refusal
    ({'enabled', 'errors', 'workers', 'model', 'url', 'argv', 'metrics_url', 'unit'})."""
    return _router.router_plan(instances, settings)


class FilterModule(object):
    def filters(self):
        return {"vllm_router_plan": vllm_router_plan}
