"""vLLM service instances on one host: resolve each instance's settings, render its command
line and environment, and refuse layouts that cannot run, before anything changes.

An instance is one vLLM server = one systemd unit ``vllm-<name>.service`` with its own port,
GPU set (CUDA_VISIBLE_DEVICES), model profile and arguments. ``resolve_instances`` takes the
instance list given by the user (empty = one instance built from the role's defaults), the
role's defaults, the profile loader (or a dict of raw profiles) and what is known about the
host (GPU count and memory, model limits read from config.json), and returns the resolved
instances plus every refusal found, each naming the variable and the numbers:

* unknown keys, bad names, names or ports used twice;
* an unknown profile (listing the known ones);
* overlapping GPU sets (cuda_visible_devices) between any two instances, whatever their
  profile; between GPU instances an instance without CUDA_VISIBLE_DEVICES uses every GPU, so
  it overlaps any other GPU instance;
* tensor x pipeline x data above the GPUs the instance may use (its set, else the host's);
* GPU indices the host does not have; a GPU profile on a host without GPUs;
* max_model_len above the model's limit, derived from its config.json (and
  tokenizer_config.json) the way vLLM derives it (model_max_len);
* conflicting flags, secrets in args/env, invalid profiles (from vllm_profile).

Pure Python (no Ansible, no I/O: the profile loader is passed in); secrets are not handled
here (they go straight into the 0600 environment file).
"""
from __future__ import annotations

import re

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profile_schema import (
    ProfileError, _check_secrets_in_args, parse_flags, render_argv, resolve_profile, validate_env)

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
ENTRYPOINT = ["-m", "vllm.entrypoints.openai.api_server"]
INSTANCE_KEYS = ("name", "port", "host", "profile", "profile_overrides", "model_dir",
                 "served_model_name", "args", "extra_args", "env", "cuda_visible_devices")
REQUIRED_INSTANCE_KEYS = ("name", "port")


def dict_loader(profiles):
    """A profile loader over a dict {name: raw profile}: load(name, overrides) returns the
    profile merged with the overrides and validated (as the collection's file loader does)."""
    def load(name, overrides=None):
        if name not in profiles:
            raise ProfileError("unknown vllm_service profile %r; known profiles: %s"
                               % (name, ", ".join(sorted(profiles))))
        return resolve_profile(profiles[name], name, overrides)
    return load


def parse_gpu_set(text):
    """'0,1,2,3' -> [0, 1, 2, 3]; '' or None -> None (all GPUs). Raises ValueError."""
    if text is None:
        return None
    text = str(text).strip()
    if not text:
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError("%r is not a comma-separated list of GPU indices" % text)
        idx = int(part)
        if idx in out:
            raise ValueError("GPU %d is listed twice in %r" % (idx, text))
        out.append(idx)
    return out


# The keys vLLM (0.32, ModelArchConfigConvertor.derive_max_model_len_and_key) reads the
# model's length from, the smallest one present winning; RoPE types whose max_position_embeddings
# is already scaled (the factor is not applied again).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")
ROPE_PRESCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0)


def _rope_params(cfg):
    params = cfg.get("rope_parameters")
    if not isinstance(params, dict):
        params = cfg.get("rope_scaling")  # the legacy key transformers converts
    if not isinstance(params, dict) or not params:
        return []
    nested = [p for p in params.values() if isinstance(p, dict)]
    if nested and len(nested) == len(params):  # one set per layer type
        return [p for p in nested if p]
    return [params]


def model_max_len(config, tokenizer_config=None):
    """The longest max_model_len vLLM accepts for a parsed config.json (and the model's
    tokenizer_config.json), derived as vLLM 0.32 does (_get_and_verify_max_len): the smallest
    of the length keys of the text config (model_max_length wins when set), capped by the
    tokenizer's model_max_length, times the RoPE scaling factor unless the RoPE type is
    already scaled (yarn, llama3, longrope, ...) or the model is a Gemma 3. None when the
    config names no length (vLLM then assumes 2048 and only warns)."""
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    found = [text[k] for k in MAX_LEN_KEYS if _number(text.get(k))]
    if not found:
        return None
    derived = min(found)
    if _number(text.get("model_max_length")):
        derived = text["model_max_length"]
    if isinstance(tokenizer_config, dict) and _number(tokenizer_config.get("model_max_length")):
        derived = min(derived, tokenizer_config["model_max_length"])
    params = _rope_params(text) or _rope_params(config)
    model_type = str(config.get("model_type") or "")
    if params and "gemma3" not in model_type:
        factor = 1.0
        for rp in params:
            kind = rp.get("rope_type", rp.get("type"))
            if kind not in ROPE_PRESCALED:
                factor = rp.get("factor", factor)
        if not _number(factor):
            factor = 1.0
        derived = derived * factor
    return int(derived)


def base_env(home):
    """Caches on persistent storage the service user can write; the service never downloads."""
    return {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "XDG_CACHE_HOME": home + "/.cache",
        "HF_HOME": home + "/.cache/huggingface",
        "VLLM_CACHE_ROOT": home + "/.cache/vllm",
        "TRITON_CACHE_DIR": home + "/.cache/triton",
        "TORCHINDUCTOR_CACHE_DIR": home + "/.cache/torchinductor",
        "FLASHINFER_WORKSPACE_BASE": home + "/.cache",
        "VLLM_NO_USAGE_STATS": "1",
    }


def _plain_argv(python, model_dir, name, host, port, args):
    return [python] + ENTRYPOINT + ["--model", model_dir, "--served-model-name", name,
                                    "--host", host, "--port", str(port)] + list(args)


# Without a profile the user's args may set parallel sizes and limits; only what the role sets
# itself and the secrets are refused.
PLAIN_OWNED = ("--model", "--served-model-name", "--host", "--port", "--api-key", "--hf-token")


def _validate_plain_args(args, where):
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ProfileError("%s must be a list of strings, got %r" % (where, args))
    _check_secrets_in_args(args, where)
    for flag, _value, _raw in parse_flags(args, where):
        if flag in PLAIN_OWNED:
            raise ProfileError("%s must not set %s (the role sets it; secrets go through the "
                               "0600 environment file)" % (where, flag))
    for a in args:
        if "\n" in a or "\x00" in a:
            raise ProfileError("%s item %r contains a newline or NUL" % (where, a))


def _max_len_from_args(args):
    for flag, value, _raw in parse_flags(args, "args"):
        if flag == "--max-model-len" and value is not None and value.isdigit():
            return int(value)
    return None


def resolve_instances(instances, defaults, profiles, gpu_count=None, model_limits=None):
    """Resolve and check the instances of one host.

    instances: list of dicts (keys INSTANCE_KEYS; name and port required); empty -> one
        instance from ``defaults``.
    defaults: dict with the role-level values: name, port, host, profile, profile_overrides,
        model_dir, served_model_name, args, extra_args, env, cuda_visible_devices, python, home.
    profiles: the profile loader, load(name, overrides) -> the merged, validated profile
        (raises ProfileError), or a dict {profile name: raw profile} (see dict_loader).
    gpu_count: GPUs on the host (None = unknown, e.g. GPU facts not gathered).
    model_limits: {model_dir: max_position_embeddings} for the model dirs whose config.json
        could be read.

    Returns (resolved instances, errors). Each error names the instance, the variable and the
    numbers.
    """
    model_limits = model_limits or {}
    load = profiles if callable(profiles) else dict_loader(profiles)
    errors = []
    if instances is None:
        instances = []
    if not isinstance(instances, list) or not all(isinstance(i, dict) for i in instances):
        return [], ["vllm_service_instances must be a list of mappings, got %r" % (instances,)]
    explicit = bool(instances)
    if not instances:
        instances = [{"name": defaults.get("name"), "port": defaults.get("port")}]

    resolved = []
    for pos, raw in enumerate(instances):
        label = "vllm_service_instances[%d]" % pos
        unknown = sorted(set(raw) - set(INSTANCE_KEYS))
        if unknown:
            errors.append("%s: unknown keys %s (allowed: %s)"
                          % (label, ", ".join(unknown), ", ".join(INSTANCE_KEYS)))
            continue
        missing = [k for k in REQUIRED_INSTANCE_KEYS if raw.get(k) in (None, "")]
        if missing:
            errors.append("%s: %s required" % (label, " and ".join(missing)))
            continue
        inst = dict((k, defaults.get(k)) for k in INSTANCE_KEYS if k not in ("name", "port"))
        inst.update(raw)

        def var(key, pos=pos, raw=raw):
            """The variable a setting came from: the instance's key, else the role's."""
            if explicit and key in raw:
                return "vllm_service_instances[%d].%s" % (pos, key)
            return "vllm_service_instance" if key == "name" else "vllm_service_" + key

        name = str(inst["name"])
        label = "instance %s" % name
        if not NAME.match(name):
            errors.append("%s: name must match %s (it becomes the unit vllm-<name>.service; %s)"
                          % (label, NAME.pattern, var("name")))
            continue
        try:
            port = int(inst["port"])
        except (TypeError, ValueError):
            errors.append("%s: port %r (%s) is not an integer" % (label, inst["port"], var("port")))
            continue
        if not 1 <= port <= 65535:
            errors.append("%s: port %d (%s) is outside 1..65535" % (label, port, var("port")))
            continue
        model_dir = inst.get("model_dir") or ""
        if not str(model_dir).startswith("/"):
            errors.append("%s: model_dir %r (%s) must be an absolute path on the host"
                          % (label, model_dir, var("model_dir")))
            continue
        try:
            gpus = parse_gpu_set(inst.get("cuda_visible_devices"))
        except ValueError as e:
            errors.append("%s: cuda_visible_devices (%s): %s" % (label, var("cuda_visible_devices"), e))
            continue

        args = list(inst.get("args") or []) + list(inst.get("extra_args") or [])
        profile_name = inst.get("profile") or ""
        profile = None
        stage = "%s, %s" % (var("profile"), var("profile_overrides"))  # named in an error
        try:
            if profile_name:
                profile = load(profile_name, inst.get("profile_overrides") or {})
            stage = "%s, %s" % (var("args"), var("extra_args"))
            served = (inst.get("served_model_name")
                      or (profile["model"]["served_model_name"] if profile else "")
                      or str(model_dir).rstrip("/").rsplit("/", 1)[-1])
            if profile:
                argv = render_argv(profile, model_dir, inst["host"], port,
                                   python=defaults["python"], served_model_name=served,
                                   extra_args=args)
            else:
                _validate_plain_args(args, "%s: args" % label)
                argv = _plain_argv(defaults["python"], model_dir, served, inst["host"], port,
                                   args)
            env = base_env(defaults["home"])
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
            stage = "%s, %s" % (var("profile"), var("profile_overrides"))
            env.update(validate_env((profile or {}).get("env") or {}, "profile env"))
            stage = var("env")
            env.update(validate_env(dict(inst.get("env") or {}), "env"))
        except ProfileError as e:
            errors.append("%s: %s (%s)" % (label, e, stage))
            continue

        par = (profile or {}).get("parallel") or {"tensor": 1, "pipeline": 1, "data": 1,
                                                  "expert_parallel": False}
        world = par["tensor"] * par["pipeline"] * par["data"]
        gpu_required = bool(profile and profile["gpu"]["required"])
        max_len = profile["max_model_len"] if profile else _max_len_from_args(args)
        resolved.append({
            "name": name,
            "unit": "vllm-%s.service" % name,
            "port": port,
            "host": inst["host"],
            "url": "http://%s:%d" % ("127.0.0.1" if inst["host"] in ("0.0.0.0", "::")
                                     else inst["host"], port),
            "served_model_name": served,
            "profile": profile_name,
            "profile_config": profile,
            "model_dir": model_dir,
            "argv": argv,
            "env": env,
            "gpus": gpus,
            "gpu_required": gpu_required,
            "parallel": par,
            "world_size": world,
            "max_model_len": max_len,
            "gpu_memory_utilization": (profile or {}).get("gpu_memory_utilization"),
            "kv_cache_dtype": (profile or {}).get("kv_cache_dtype") or "auto",
            "min_gpu_memory_gib": (profile or {}).get("gpu", {}).get("min_memory_gib", 0),
            "verified": (profile or {}).get("gpu", {}).get("verified", True),
        })

    errors.extend(check_instances(resolved, gpu_count, model_limits))
    return resolved, errors


def check_instances(resolved, gpu_count=None, model_limits=None):
    """Cross-instance and host checks on resolved instances; returns a list of errors."""
    model_limits = model_limits or {}
    errors = []
    by_name, by_port = {}, {}
    for inst in resolved:
        if inst["name"] in by_name:
            errors.append("instances %s and %s have the same name: unit %s would be written "
                          "twice" % (by_name[inst["name"]], inst["name"], inst["unit"]))
        by_name.setdefault(inst["name"], inst["name"])
        if inst["port"] in by_port:
            errors.append("instances %s and %s both use port %d; give each its own port"
                          % (by_port[inst["port"]], inst["name"], inst["port"]))
        by_port.setdefault(inst["port"], inst["name"])

    gpu_insts = [i for i in resolved if i["gpu_required"]]
    for inst in gpu_insts:
        label = "instance %s (profile %s)" % (inst["name"], inst["profile"])
        par = inst["parallel"]
        layout = "tensor %d x pipeline %d x data %d = %d GPUs" % (
            par["tensor"], par["pipeline"], par["data"], inst["world_size"])
        if gpu_count is not None and gpu_count == 0:
            errors.append("%s needs %s but the host has no GPU" % (label, layout))
            continue
        if inst["gpus"] is not None:
            if gpu_count is not None:
                missing = [g for g in inst["gpus"] if g >= gpu_count]
                if missing:
                    errors.append("%s: cuda_visible_devices %s names GPU %s but the host has "
                                  "%d GPUs (0..%d)" % (label, ",".join(map(str, inst["gpus"])),
                                                       ",".join(map(str, missing)), gpu_count,
                                                       gpu_count - 1))
            if inst["world_size"] > len(inst["gpus"]):
                errors.append("%s: %s but cuda_visible_devices %s gives it %d"
                              % (label, layout, ",".join(map(str, inst["gpus"])),
                                 len(inst["gpus"])))
        elif gpu_count is not None and inst["world_size"] > gpu_count:
            errors.append("%s: %s but the host has %d GPUs" % (label, layout, gpu_count))

    # Overlapping GPU sets are refused whatever the profile: two instances that name the same
    # GPU in cuda_visible_devices would share it (a CPU profile only means vLLM may not use it).
    for a_pos, a in enumerate(resolved):
        for b in resolved[a_pos + 1:]:
            if a["gpus"] is None or b["gpus"] is None:
                # no set = every GPU: it overlaps when that instance uses GPUs and the other
                # one uses GPUs or names some
                all_gpus = a if a["gpus"] is None else b
                other = b if all_gpus is a else a
                if all_gpus["gpu_required"] and (other["gpu_required"] or other["gpus"] is not None):
                    errors.append("instances %s and %s both use GPUs and %s sets no "
                                  "cuda_visible_devices (= every GPU): give each instance its "
                                  "own GPU set" % (a["name"], b["name"],
                                                   a["name"] if a["gpus"] is None else b["name"]))
                continue
            shared = sorted(set(a["gpus"]) & set(b["gpus"]))
            if shared:
                errors.append("instances %s (GPUs %s) and %s (GPUs %s) share GPU %s"
                              % (a["name"], ",".join(map(str, a["gpus"])), b["name"],
                                 ",".join(map(str, b["gpus"])), ",".join(map(str, shared))))

    for inst in resolved:
        limit = model_limits.get(inst["model_dir"])
        allow_long = str((inst.get("env") or {}).get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "")) in ("1", "true")
        if limit and inst["max_model_len"] and inst["max_model_len"] > limit and not allow_long:
            errors.append("instance %s: max_model_len %d is above the model's limit %d "
                          "(derived from %s/config.json as vLLM derives it; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
                          "in the instance's env lifts the limit)"
                          % (inst["name"], inst["max_model_len"], limit, inst["model_dir"]))
    return errors


def gpu_memory_mib(gpu_facts, gpus=None):
    """Smallest memory_total_mib among the instance's GPUs (all when gpus is None); None when
    the facts do not list them."""
    listed = [g for g in (gpu_facts or {}).get("gpus") or [] if isinstance(g, dict)]
    if gpus is not None:
        listed = [g for g in listed if g.get("index") in gpus]
    values = [g.get("memory_total_mib") for g in listed
              if isinstance(g.get("memory_total_mib"), int)]
    return min(values) if values else None
