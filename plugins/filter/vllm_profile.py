"""Filters over plugins/module_utils/vllm_profile.py (profile validation, argv rendering).

Controller-side plugins cannot import the repo's module_utils as ansible.module_utils.*,
so the file is loaded by path; the logic (and its unit tests) stays in module_utils.
"""
from __future__ import annotations

import importlib.util
import os
import sys

from ansible.errors import AnsibleFilterError

_MU = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")


def _load(name, filename):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(_MU, filename))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_vp = _load("_vllm_deploy_vllm_profile", "vllm_profile.py")
_vi = _load("_vllm_deploy_vllm_instances", "vllm_instances.py")


def vllm_profile_argv(profile, model_dir, host, port, python, served_model_name=None,
                      extra_args=None):
    """The vLLM server's argv for a profile (see vllm_profile.render_argv)."""
    try:
        return _vp.render_argv(profile, model_dir, host, int(port), python=python,
                               served_model_name=served_model_name or None,
                               extra_args=list(extra_args or []))
    except _vp.ProfileError as e:
        raise AnsibleFilterError("vllm_service profile %s: %s"
                                 % ((profile or {}).get("name", "?"), e))


def vllm_profile_env(profile, extra_env=None):
    """The profile's environment updated with per-host/group variables (those win)."""
    try:
        merged = _vp.validate_env((profile or {}).get("env") or {}, "profile env")
        merged.update(_vp.validate_env(dict(extra_env or {}), "vllm_service_env"))
        return merged
    except _vp.ProfileError as e:
        raise AnsibleFilterError("vllm_service profile %s: %s"
                                 % ((profile or {}).get("name", "?"), e))


def vllm_service_instances(instances, defaults, profiles, gpu_count=None, model_limits=None):
    """Resolve and check a host's instances (see vllm_instances.resolve_instances).

    Returns {'instances': [...], 'errors': [...]}; the role asserts that errors is empty, so
    every refusal is reported at once, with its numbers, before anything changes."""
    try:
        count = None if gpu_count in (None, "") else int(gpu_count)
    except (TypeError, ValueError):
        raise AnsibleFilterError("vllm_service_instances: gpu_count %r is not an integer"
                                 % (gpu_count,))
    resolved, errors = _vi.resolve_instances(instances, dict(defaults), dict(profiles or {}),
                                             gpu_count=count,
                                             model_limits=dict(model_limits or {}))
    return {"instances": resolved, "errors": errors}


def vllm_model_max_len(config):
    """max_position_embeddings of a parsed config.json (None when it has none)."""
    return _vi.model_max_len(config)


def vllm_gpu_memory_mib(gpu_facts, gpus=None):
    """Smallest memory_total_mib among the given GPU indices of gpu_facts (all when None)."""
    return _vi.gpu_memory_mib(gpu_facts, gpus)


def vllm_service_endpoints(instances, ready_results=None):
    """What other roles need of each instance: url, model, unit, port, ready_after_s."""
    ready = {}
    for res in ready_results or []:
        item = res.get("item") or {}
        ready[item.get("name")] = res.get("elapsed_s")
    return [{"name": i["name"], "url": i["url"], "model": i["served_model_name"],
             "unit": i["unit"], "port": i["port"], "ready_after_s": ready.get(i["name"])}
            for i in instances]


class FilterModule(object):
    def filters(self):
        return {"vllm_profile_argv": vllm_profile_argv, "vllm_profile_env": vllm_profile_env,
                "vllm_service_instances": vllm_service_instances,
                "vllm_model_max_len": vllm_model_max_len,
                "vllm_gpu_memory_mib": vllm_gpu_memory_mib,
                "vllm_service_endpoints": vllm_service_endpoints}
