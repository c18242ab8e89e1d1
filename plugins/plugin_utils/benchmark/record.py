"""What a throughput sweep's result belongs to: one instance's configuration and its
fingerprint (controller side, for the vllm_benchmark role through the filters
vllm_ops.deploy.vllm_benchmark_config and vllm_ops.deploy.vllm_benchmark_fingerprint).

A stored result is reused only when the instance's configuration is unchanged: its rendered
argv and environment (variables whose name looks like a secret are left out, by name), its
resolved model profile (the profile file merged with its overrides), the model, the weights,
the vLLM version and the sweep settings. Switching a host from one profile to another (even
one with the same served model name) or changing one override therefore measures again.
"""
from __future__ import annotations

import hashlib
import json
import re

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.secrets import (
    SECRET_NAME_PATTERN)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark.report import compact_level

# Environment variables never hashed (nor shown in provenance): the names of secrets.
SECRET_ENV = SECRET_NAME_PATTERN

# The sweep settings that change what is measured.
SWEEP_KEYS = ("levels", "input_len", "output_len", "duration_s", "slo_ttft_ms", "slo_tpot_ms",
              "saturation_threshold", "stop_on_saturation", "chunk_usage")
# Sweep settings added later, hashed only when they differ from their default (the
# fingerprints of results measured with the default stay what they were).
OPTIONAL_SWEEP_KEYS = {"prompt_format": "token_ids"}


class BenchmarkError(ValueError):
    """A target or settings the fingerprint cannot be built from."""


def public_env(env, pattern=None):
    """``env`` without the variables whose name matches ``pattern`` (default SECRET_ENV)."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise BenchmarkError("an instance's env must be a mapping, got %r" % (env,))
    rx = re.compile(pattern or SECRET_ENV)
    return dict((str(k), str(v)) for k, v in sorted(env.items()) if not rx.search(str(k)))


def instance_config(target, sweep, context=None, pattern=None):
    """The configuration a result belongs to.

    target: one instance as vllm_service publishes it (vllm_service_endpoints: name, model,
        argv, env, profile, profile_config, model_dir).
    sweep: the sweep settings (SWEEP_KEYS).
    context: what else the server's speed depends on (vllm version, weights size).
    """
    if not isinstance(target, dict) or not target.get("name"):
        raise BenchmarkError("a benchmark target needs a name, got %r" % (target,))
    missing = [k for k in SWEEP_KEYS if k not in (sweep or {})]
    if missing:
        raise BenchmarkError("sweep settings lack %s" % ", ".join(missing))
    argv = target.get("argv") or []
    if not isinstance(argv, list):
        raise BenchmarkError("instance %s: argv must be a list, got %r" % (target["name"], argv))
    config = {
        "instance": str(target["name"]),
        "model": str(target.get("model") or ""),
        "model_dir": str(target.get("model_dir") or ""),
        "argv": [str(a) for a in argv],
        "env": public_env(target.get("env"), pattern),
        "profile": str(target.get("profile") or ""),
        "profile_config": target.get("profile_config") or {},
        "sweep": dict((k, sweep[k]) for k in SWEEP_KEYS),
    }
    for key, default in OPTIONAL_SWEEP_KEYS.items():
        if (sweep or {}).get(key) not in (None, default):
            config["sweep"][key] = sweep[key]
    if not config["argv"]:  # an endpoint vllm_service does not describe: its URL is all we know
        config["url"] = str(target.get("url") or "")
    config.update(dict((str(k), v) for k, v in sorted((context or {}).items())))
    return config


def fingerprint(config):
    """16 hex digits of the sha256 of the configuration as canonical JSON."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


# --- the record stored per instance (vllm_benchmark_results.instances.<name>) ----------------
# Keys of a record's provenance, in the order they are written.
PROVENANCE_KEYS = ("host", "instance", "unit", "url", "load_generator", "load_generators",
                   "model", "model_dir", "profile", "vllm_version", "torch_version", "argv",
                   "env", "gpus", "report_dir")


def build_record(sweep, target, config, fingerprint_, context):
    """The record of one instance's sweep, as the vllm_benchmark role stores it in host_vars
    and every reader (vllm_deploy's results, the monitoring rules, the reports) reads it.

    sweep: the vllm_sweep module's facts; target: the instance as vllm_service publishes it
    (name, url, model, unit, gpus); config: instance_config(); fingerprint_: its fingerprint;
    context: {host, load_generator, load_generators, torch_version, gpus (the host's
    gpu_facts GPUs), report_dir, measured_at, levels (the levels asked for)}."""
    context = context or {}
    ran = [lv.get("concurrency") for lv in sweep.get("levels") or []]
    asked = [int(c) for c in context.get("levels") or []]
    gpus = context.get("gpus") or []
    if target.get("gpus") is not None:
        gpus = [g for g in gpus if g.get("index") in target["gpus"]]
    prov = {
        "host": context.get("host"),
        "instance": target.get("name"),
        "unit": target.get("unit") or "",
        "url": target.get("url"),
        "load_generator": context.get("load_generator"),
        "load_generators": list(context.get("load_generators") or []),
        "model": target.get("model"),
        "model_dir": config.get("model_dir"),
        "profile": config.get("profile"),
        "vllm_version": config.get("vllm"),
        "torch_version": context.get("torch_version") or "",
        "argv": config.get("argv"),
        "env": config.get("env"),
        "gpus": [g.get("name") for g in gpus],
        "report_dir": context.get("report_dir") or "",
    }
    return {
        "fingerprint": fingerprint_,
        "measured_at": context.get("measured_at"),
        "provenance": dict((k, prov[k]) for k in PROVENANCE_KEYS),
        "parameters": sweep.get("parameters"),
        "headline": sweep.get("headline"),
        "stop_reason": sweep.get("stop_reason"),
        "stopped_early": len(ran) < len(asked),
        "levels_not_run": [c for c in asked if c not in ran],
        "levels": [compact_level(lv) for lv in sweep.get("levels") or []],
    }


def instance_records(results):
    """{instance name: record} of a host's ``vllm_benchmark_results``: its ``instances``; a file
    written before instances were swept one by one holds one record, named after the instance
    of its provenance, else ``main``. {} when there is no result."""
    if not isinstance(results, dict):
        return {}
    per = results.get("instances")
    if isinstance(per, dict) and per:
        return dict((str(k), v) for k, v in per.items() if isinstance(v, dict))
    if "levels" not in results:
        return {}
    name = (results.get("provenance") or {}).get("instance") or "main"
    return {str(name): results}
