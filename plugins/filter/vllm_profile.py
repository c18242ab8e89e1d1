"""Filters over plugins/module_utils/vllm_profile.py (profile validation, argv rendering).

Controller-side plugins cannot import the repo's module_utils as ansible.module_utils.*,
so the file is loaded by path; the logic (and its unit tests) stays in module_utils.
"""
from __future__ import annotations

import importlib.util
import os

from ansible.errors import AnsibleFilterError

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "module_utils", "vllm_profile.py")
_spec = importlib.util.spec_from_file_location("_vllm_deploy_vllm_profile", _PATH)
_vp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_vp)


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


class FilterModule(object):
    def filters(self):
        return {"vllm_profile_argv": vllm_profile_argv, "vllm_profile_env": vllm_profile_env}
