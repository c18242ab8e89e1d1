"""The collection's one model-profile loader (controller side).

A profile is one YAML file ``<name>.yml`` holding the profile's keys (see
plugins/plugin_utils/service/profile_schema.py for its shape). Profiles are looked up in the directories
of ``vllm_deploy_profile_dirs`` first (a user's own profiles, e.g. next to the inventory), then
in the collection's ``profiles/`` directory. ``load_profile`` reads the file, merges the
overrides and validates the result, once; the lookup vllm_ops.deploy.vllm_profile (gpu_host) and
the filter vllm_ops.deploy.vllm_resolve_instances (vllm_service, one profile per instance) both
call it, and the Python API lists profile names with ``known_profiles``.
"""
from __future__ import annotations

import glob
import os

import yaml

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profile_schema import (
    ProfileError, resolve_profile)

# plugins/plugin_utils/service/ -> the collection root -> profiles/
COLLECTION_PROFILES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))),
    "profiles")


def search_dirs(dirs=None):
    """The directories searched, in order: the given ones, then the collection's."""
    if dirs is None:
        dirs = []
    if isinstance(dirs, str) or not all(isinstance(d, str) for d in dirs):
        raise ProfileError("vllm_deploy_profile_dirs must be a list of directories, got %r"
                           % (dirs,))
    return [os.path.abspath(d) for d in dirs] + [COLLECTION_PROFILES]


def known_profiles(dirs=None):
    """{profile name: file path} of every profile found (the first directory wins)."""
    out = {}
    for directory in search_dirs(dirs):
        for path in sorted(glob.glob(os.path.join(directory, "*.yml"))):
            out.setdefault(os.path.basename(path)[:-4], path)
    return out


def load_profile(name, overrides=None, dirs=None, variable=None):
    """Profile ``name`` read from its file, merged with ``overrides``, validated. ``variable``
    names the variable that chose the profile, for the messages."""
    what = "%s: " % variable if variable else ""
    if not isinstance(name, str) or not name:
        raise ProfileError("%sa profile name must be a non-empty string, got %r" % (what, name))
    known = known_profiles(dirs)
    if name not in known:
        raise ProfileError("unknown %s %r; known profiles: %s (searched %s)"
                           % (variable or "vLLM profile", name,
                              ", ".join(sorted(known)) or "(none)", ", ".join(search_dirs(dirs))))
    path = known[name]
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError("%scannot read profile %s (%s): %s" % (what, name, path, exc))
    try:
        return resolve_profile(raw, name, overrides)
    except ProfileError as exc:
        raise ProfileError("%s%s (%s)" % (what, exc, path))
