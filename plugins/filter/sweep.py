"""Filters for the sweep results kept in the inventory (the logic is in
plugins/plugin_utils/sweep_report.py, shared with the reports)."""
from __future__ import annotations

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.sweep_report import compact_level


def vllm_sweep_compact(level):
    """The per-level figures worth keeping in host_vars (the full data goes to reports)."""
    return compact_level(level)


class FilterModule(object):
    def filters(self):
        return {"vllm_sweep_compact": vllm_sweep_compact}
