"""Filters over plugins/plugin_utils/service/instances.py: resolve and check a host's vLLM
instances, and what other roles need of them. The logic (and its unit tests) is in module_utils."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service import vllm_instance as _hs
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service import instances as _vi
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service import transition as _tx
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profile_schema import ProfileError
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profiles import load_profile


def vllm_resolve_instances(instances, defaults, profile_dirs=None, gpu_count=None,
                           model_limits=None):
    """Resolve and check a host's instances (see vllm_instances.resolve_instances); each
    instance's profile comes from the collection's profile loader (plugin_utils/service/profiles),
    merged with the instance's profile_overrides and validated there.

    Returns {'instances': [...], 'errors': [...]}; the role asserts that errors is empty, so
    every refusal is reported at once, with its numbers, before anything changes."""
    try:
        count = None if gpu_count in (None, "") else int(gpu_count)
    except (TypeError, ValueError):
        raise AnsibleFilterError("vllm_resolve_instances: gpu_count %r is not an integer"
                                 % (gpu_count,))
    dirs = list(profile_dirs or [])

    def load(name, overrides=None):
        return load_profile(name, overrides, dirs)

    try:
        resolved, errors = _vi.resolve_instances(instances, dict(defaults), load,
                                                 gpu_count=count,
                                                 model_limits=dict(model_limits or {}))
    except ProfileError as exc:
        raise AnsibleFilterError("vllm_resolve_instances: %s" % exc)
    return {"instances": resolved, "errors": errors}


def vllm_model_max_len(config, tokenizer_config=None):
    """The longest max_model_len vLLM accepts for a parsed config.json (and tokenizer_config.json),
    derived as vLLM derives it (None when the config names no length)."""
    return _vi.model_max_len(config, tokenizer_config)


def vllm_model_limits(configs, tokenizer_configs=None):
    """{model_dir: limit} for {model_dir: parsed config.json} and {model_dir: parsed
    tokenizer_config.json} (the directories whose config names a length)."""
    toks = dict(tokenizer_configs or {})
    out = {}
    for model_dir, cfg in dict(configs or {}).items():
        limit = _vi.model_max_len(cfg, toks.get(model_dir))
        if limit:
            out[model_dir] = limit
    return out


def vllm_transition_plan(declared, host_instances, changed=None, restart_all=None,
                         remove_undeclared=True, listeners=None, restart=None):
    """What vllm_service's transition does on a host (see plugin_utils/service/transition.plan):
    which instances start, are written, stopped first, removed or kept, what a rollback
    restores, one line per change, and the refusals (ports, GPU sets of kept instances).
    restart: {name: [reasons]} restarts those instances only (new weights in their model_dir)."""
    if not isinstance(declared, list):
        raise AnsibleFilterError("vllm_transition_plan: expected the resolved instances, got %r"
                                 % (declared,))
    return _tx.plan(declared, dict(host_instances or {}), dict(changed or {}),
                    list(restart_all or []), bool(remove_undeclared), dict(listeners or {}),
                    redact=_hs.redact, restart=dict(restart or {}))


def vllm_downtime(ready_at, stopped_at, started, served_before):
    """{instance: seconds its endpoint did not serve, or None for one that did not serve
    before}; ready_at maps each started instance to the controller time it answered."""
    ready = dict((k, float(v)) for k, v in (ready_at or {}).items() if v is not None)
    return _tx.downtime(float(stopped_at), ready, list(started or []), list(served_before or []))


def vllm_gpu_memory_mib(gpu_facts, gpus=None):
    """Smallest memory_total_mib among the given GPU indices of gpu_facts (all when None)."""
    return _vi.gpu_memory_mib(gpu_facts, gpus)


def vllm_instance_endpoints(instances, ready_results=None):
    """What other roles need of each instance: url, model, unit, port, ready_after_s, and the
    configuration it runs (rendered argv, environment, profile name and resolved profile, GPU
    set, model directory) for the benchmark's fingerprint and provenance. No secrets: they are
    never part of an instance's argv or env (refused there; they live in the 0600 file)."""
    ready = {}
    for res in ready_results or []:
        item = res.get("item") or {}
        ready[item.get("name")] = res.get("elapsed_s")
    return [{"name": i["name"], "url": i["url"], "model": i["served_model_name"],
             "unit": i["unit"], "port": i["port"], "ready_after_s": ready.get(i["name"]),
             "argv": list(i["argv"]), "env": dict(i["env"]), "profile": i["profile"],
             "profile_config": i.get("profile_config") or {}, "gpus": i["gpus"],
             "model_dir": i["model_dir"]}
            for i in instances]


def vllm_running_as_declared(declared, host_instances):
    """The declared instances the host already runs exactly as declared (same command line,
    active): what a tag run that skips vllm_service may measure or switch."""
    host = dict(host_instances or {})
    return [d for d in (declared or [])
            if (host.get(d["name"]) or {}).get("argv") == list(d["argv"])
            and (host.get(d["name"]) or {}).get("active_state") == "active"]


class FilterModule(object):
    def filters(self):
        return {"vllm_resolve_instances": vllm_resolve_instances,
                "vllm_model_max_len": vllm_model_max_len,
                "vllm_model_limits": vllm_model_limits,
                "vllm_transition_plan": vllm_transition_plan,
                "vllm_downtime": vllm_downtime,
                "vllm_gpu_memory_mib": vllm_gpu_memory_mib,
                "vllm_instance_endpoints": vllm_instance_endpoints,
                "vllm_running_as_declared": vllm_running_as_declared}
