"""Model profiles for the vLLM service: validate, merge overrides and user additions, render
the argv.

A profile is a plain dict: one YAML file per model in the collection's profiles/ directory (or
in a directory of vllm_deploy_profile_dirs), the profile's keys at the top of the file. The
collection's one loader, plugins/plugin_utils/service/profiles.py (behind the lookup
vllm_ops.deploy.vllm_profile and the filter vllm_ops.deploy.vllm_resolve_instances), reads the
file and calls ``resolve_profile`` here: the profile merged with its overrides, then validated.
This module checks a profile's shape, merges the user's extra args / env, and renders the final
argument list for ``python -m vllm.entrypoints.openai.api_server`` as a list (no shell, no
quoting). Pure Python, no I/O.

Flags that the renderer owns (model, served name, host, port, parallel sizes, limits) must not
appear in a profile's or the user's args; the same flag given twice with different values is
refused rather than silently resolved. Secrets (HF token, API key) never belong in a profile:
they travel through the service's 0600 EnvironmentFile.
"""
from __future__ import annotations

import copy
import re

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.secrets import SECRET_NAME

ENTRYPOINT = ["-m", "vllm.entrypoints.openai.api_server"]

REQUIRED_KEYS = ("name", "description", "model", "parallel", "args", "env", "gpu",
                 "kv_cache_dtype", "max_model_len", "gpu_memory_utilization", "source", "notes")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")

# Flags the renderer sets from profile keys / call arguments -> where to set them instead.
OWNED_FLAGS = {
    "--model": "the model directory argument",
    "--served-model-name": "model.served_model_name",
    "--host": "the host argument",
    "--port": "the port argument",
    "--tensor-parallel-size": "parallel.tensor",
    "--pipeline-parallel-size": "parallel.pipeline",
    "--data-parallel-size": "parallel.data",
    "--enable-expert-parallel": "parallel.expert_parallel",
    "--max-model-len": "max_model_len",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--api-key": "the API key secret (EnvironmentFile VLLM_API_KEY)",
    "--hf-token": "the HF token secret (EnvironmentFile HF_TOKEN)",
}
SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size",
               "-dp": "--data-parallel-size"}
SECRET_ENV = SECRET_NAME  # the collection's list of secret names
SECRET_VALUE = re.compile(r"(\bhf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_-]{16,})")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ProfileError(Exception):
    """An invalid profile, unknown profile name, or conflicting arguments."""


# ----------------------------------------------------------------------------- overrides

def merge_overrides(base, overrides):
    """Recursive dict merge (``overrides`` wins; lists are replaced, not appended), like
    Ansible's combine(recursive=true). Returns a new dict."""
    out = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def resolve_profile(raw, name, overrides=None, where="profile_overrides"):
    """The profile ``name`` as used: ``raw`` (the file's content) merged with ``overrides``,
    then validated. Raises ProfileError naming the profile and the bad key."""
    if not isinstance(raw, dict):
        raise ProfileError("profile %s must be a mapping of the profile's keys, got %s"
                           % (name, type(raw).__name__))
    if overrides is not None and not isinstance(overrides, dict):
        raise ProfileError("%s for profile %s must be a mapping, got %r"
                           % (where, name, overrides))
    if "name" in (overrides or {}) and overrides["name"] != name:
        raise ProfileError("%s cannot rename profile %s (name: %r)"
                           % (where, name, overrides["name"]))
    return validate_profile(merge_overrides(raw, overrides), name)


# ----------------------------------------------------------------------------- validation

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _check_secrets_in_args(args, where):
    for item in args:
        if SECRET_VALUE.search(item):
            raise ProfileError("%s contains what looks like a token or key (%s...): secrets go "
                               "through the service's EnvironmentFile, never in args"
                               % (where, item[:6]))


def validate_env(env, where="env"):
    """Check an env mapping: names are valid, values are strings or numbers, no secrets.
    Returns a new dict with string values."""
    if not isinstance(env, dict):
        raise ProfileError("%s must be a mapping of NAME: value, got %s"
                           % (where, type(env).__name__))
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise ProfileError("%s: %r is not a valid environment variable name" % (where, key))
        if SECRET_ENV.search(key):
            raise ProfileError("%s: %s looks like a secret; secrets go through the service's "
                               "secret variables (0600 EnvironmentFile), not profiles or extra "
                               "env" % (where, key))
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ProfileError("%s.%s must be a string or a number (quote booleans), got %r"
                               % (where, key, value))
        value = str(value)
        if "\n" in value or "\x00" in value:
            raise ProfileError("%s.%s contains a newline or NUL" % (where, key))
        if SECRET_VALUE.search(value):
            raise ProfileError("%s.%s looks like it holds a token or key" % (where, key))
        out[key] = value
    return out


def validate_args(args, where="args"):
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ProfileError("%s must be a list of strings, got %r" % (where, args))
    for a in args:
        if "\n" in a or "\x00" in a:
            raise ProfileError("%s item %r contains a newline or NUL" % (where, a))
    _check_secrets_in_args(args, where)
    for flag, _value, _raw in parse_flags(args, where):
        if flag in OWNED_FLAGS:
            raise ProfileError("%s must not set %s; set it through %s"
                               % (where, flag, OWNED_FLAGS[flag]))
    return list(args)


def validate_profile(profile, name=None):
    """Raise ProfileError naming the first bad key; return the profile unchanged."""
    label = "profile %s" % (name or (profile.get("name") if isinstance(profile, dict) else "?"))
    if not isinstance(profile, dict):
        raise ProfileError("%s must be a mapping, got %s" % (label, type(profile).__name__))
    missing = [k for k in REQUIRED_KEYS if k not in profile]
    if missing:
        raise ProfileError("%s is missing keys: %s" % (label, ", ".join(missing)))
    if name is not None and profile["name"] != name:
        raise ProfileError("%s: name is %r, expected %r" % (label, profile["name"], name))
    for key in ("name", "description", "notes"):
        if not isinstance(profile[key], str) or not profile[key].strip():
            raise ProfileError("%s: %s must be a non-empty string" % (label, key))

    model = profile["model"]
    if not isinstance(model, dict):
        raise ProfileError("%s: model must be a mapping" % label)
    for key in ("repo_id", "served_model_name"):
        if not isinstance(model.get(key), str) or not model[key].strip():
            raise ProfileError("%s: model.%s must be a non-empty string" % (label, key))
    if "revision" not in model or not (model["revision"] is None
                                       or isinstance(model["revision"], str)):
        raise ProfileError("%s: model.revision must be a string or null (unpinned)" % label)

    par = profile["parallel"]
    if not isinstance(par, dict):
        raise ProfileError("%s: parallel must be a mapping" % label)
    for key in ("tensor", "pipeline", "data"):
        if not _is_int(par.get(key)) or par[key] < 1:
            raise ProfileError("%s: parallel.%s must be an integer >= 1, got %r"
                               % (label, key, par.get(key)))
    if not isinstance(par.get("expert_parallel"), bool):
        raise ProfileError("%s: parallel.expert_parallel must be true or false" % label)

    validate_args(profile["args"], "%s: args" % label)
    validate_env(profile["env"], "%s: env" % label)

    gpu = profile["gpu"]
    if not isinstance(gpu, dict):
        raise ProfileError("%s: gpu must be a mapping" % label)
    for key in ("required", "verified"):
        if not isinstance(gpu.get(key), bool):
            raise ProfileError("%s: gpu.%s must be true or false" % (label, key))
    if not _is_int(gpu.get("min_count")) or gpu["min_count"] < 0:
        raise ProfileError("%s: gpu.min_count must be an integer >= 0" % label)
    mem = gpu.get("min_memory_gib")
    if isinstance(mem, bool) or not isinstance(mem, (int, float)) or mem < 0:
        raise ProfileError("%s: gpu.min_memory_gib must be a number >= 0" % label)
    validated = gpu.get("validated_on")
    if not isinstance(validated, list) or not all(isinstance(v, str) for v in validated):
        raise ProfileError("%s: gpu.validated_on must be a list of strings" % label)
    world = par["tensor"] * par["pipeline"] * par["data"]
    if gpu["required"]:
        if gpu["min_count"] < world:
            raise ProfileError("%s: gpu.min_count %d is below tensor %d x pipeline %d x data "
                               "%d = %d" % (label, gpu["min_count"], par["tensor"],
                                            par["pipeline"], par["data"], world))
    elif world != 1 or par["expert_parallel"]:
        raise ProfileError("%s: a profile without GPUs must use tensor/pipeline/data 1 and no "
                           "expert parallel" % label)

    if profile["kv_cache_dtype"] not in KV_CACHE_DTYPES:
        raise ProfileError("%s: kv_cache_dtype %r is not one of %s"
                           % (label, profile["kv_cache_dtype"], ", ".join(KV_CACHE_DTYPES)))
    mml = profile["max_model_len"]
    if mml is not None and (not _is_int(mml) or mml < 1):
        raise ProfileError("%s: max_model_len must be an integer >= 1 or null" % label)
    util = profile["gpu_memory_utilization"]
    if util is not None and (isinstance(util, bool) or not isinstance(util, (int, float))
                             or not 0 < util <= 1):
        raise ProfileError("%s: gpu_memory_utilization must be in (0, 1] or null, got %r"
                           % (label, util))
    src = profile["source"]
    if not isinstance(src, list) or not src or not all(
            isinstance(u, str) and u.startswith(("https://", "http://")) for u in src):
        raise ProfileError("%s: source must be a non-empty list of http(s) URLs" % label)
    return profile


# ----------------------------------------------------------------------------- args

def _normalise(flag):
    if flag in SHORT_FLAGS:
        return SHORT_FLAGS[flag], None
    name = "--" + flag.lstrip("-").replace("_", "-")
    if name.startswith("--no-"):
        return "--" + name[5:], "false"
    return name, None


def _is_value(token):
    return not token.startswith("-") or re.match(r"^-\d", token) is not None


def parse_flags(args, where="args"):
    """Split an argv fragment into (normalised flag, value or None, raw tokens) triples.

    ``--a=1``, ``--a 1`` and ``--a_b 1`` are the same flag; ``--no-x`` is flag ``--x`` with
    value 'false'; a flag not followed by a value is a switch (value None)."""
    out, i = [], 0
    while i < len(args):
        token = args[i]
        if not token.startswith("-") or token in ("-", "--"):
            raise ProfileError("%s: %r is not a flag (values must follow their flag)"
                               % (where, token))
        if "=" in token and token.startswith("--"):
            raw_flag, value = token.split("=", 1)
            flag, _neg = _normalise(raw_flag)
            out.append((flag, value, [token]))
            i += 1
            continue
        flag, negated = _normalise(token)
        if negated is not None:
            out.append((flag, negated, [token]))
            i += 1
        elif i + 1 < len(args) and _is_value(args[i + 1]):
            out.append((flag, args[i + 1], [token, args[i + 1]]))
            i += 2
        else:
            out.append((flag, None, [token]))
            i += 1
    return out


def merge_args(profile_args, extra_args=None):
    """Profile args followed by extra args. The same flag with a different value is refused;
    an exact repeat of a profile flag in extra args is dropped."""
    extra_args = extra_args or []
    validate_args(extra_args, "extra args")
    seen = {}
    for flag, value, _raw in parse_flags(profile_args, "profile args"):
        if flag in seen and seen[flag] != value:
            raise ProfileError("profile args set %s twice (%r and %r)"
                               % (flag, seen[flag], value))
        seen[flag] = value
    merged = list(profile_args)
    extra_seen = {}
    for flag, value, raw in parse_flags(extra_args, "extra args"):
        if flag in seen:
            if seen[flag] != value:
                raise ProfileError(
                    "extra args set %s to %r but the profile sets it to %r; remove it from "
                    "extra args or use a profile without it" % (flag, value, seen[flag]))
            continue
        if flag in extra_seen and extra_seen[flag] != value:
            raise ProfileError("extra args set %s twice (%r and %r)"
                               % (flag, extra_seen[flag], value))
        if flag in extra_seen:
            continue
        extra_seen[flag] = value
        merged.extend(raw)
    return merged


def merge_env(profile_env, extra_env=None):
    """Profile env plus extra env (strings). A key set to two different values is refused."""
    base = validate_env(profile_env, "profile env")
    extra = validate_env(extra_env or {}, "extra env")
    for key, value in extra.items():
        if key in base and base[key] != value:
            raise ProfileError("extra env sets %s=%r but the profile sets %r"
                               % (key, value, base[key]))
    merged = dict(base)
    merged.update(extra)
    return merged


def render_argv(profile, model_dir, host, port, python="python", served_model_name=None,
                extra_args=None):
    """The full argv (list of strings, argv[0] = the Python interpreter) for the API server."""
    validate_profile(profile)
    if not isinstance(model_dir, str) or not model_dir:
        raise ProfileError("model_dir must be a non-empty path")
    if not isinstance(host, str) or not host:
        raise ProfileError("host must be a non-empty string")
    if not _is_int(port) or not 1 <= port <= 65535:
        raise ProfileError("port must be an integer in 1..65535, got %r" % (port,))
    par = profile["parallel"]
    argv = [python] + ENTRYPOINT + [
        "--model", model_dir,
        "--served-model-name", served_model_name or profile["model"]["served_model_name"],
        "--host", host,
        "--port", str(port),
        "--tensor-parallel-size", str(par["tensor"]),
        "--pipeline-parallel-size", str(par["pipeline"]),
    ]
    if par["data"] > 1:
        argv += ["--data-parallel-size", str(par["data"])]
    if par["expert_parallel"]:
        argv.append("--enable-expert-parallel")
    if profile["max_model_len"] is not None:
        argv += ["--max-model-len", str(profile["max_model_len"])]
    if profile["gpu_memory_utilization"] is not None:
        argv += ["--gpu-memory-utilization", str(profile["gpu_memory_utilization"])]
    if profile["kv_cache_dtype"] != "auto":
        argv += ["--kv-cache-dtype", profile["kv_cache_dtype"]]
    return argv + merge_args(profile["args"], extra_args)
