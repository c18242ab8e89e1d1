# -*- coding: utf-8 -*-
"""The autotuner's candidates, pure Python: SLO classes (MLPerf's latency constraints by model
size), the budget, the knobs, the layouts a GPU count allows, admitted by the capacity planner,
the candidate list (default first, simpler first) and each candidate's vLLM instances.
"""
from __future__ import annotations

import itertools

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service import vllm_capacity_plan as capacity_plan


# ----------------------------------------------------------------------------- SLO classes

# MLPerf Inference (datacenter) latency constraints, p99 in ms: TTFT / TPOT per benchmark
# model. "server" and "interactive" are MLPerf's two LLM scenarios' constraints.
MLPERF_SLOS = {
    "llama3.1-8b": {"server": (2000.0, 100.0), "interactive": (500.0, 30.0)},
    "llama2-70b": {"server": (2000.0, 200.0), "interactive": (450.0, 40.0)},
    "llama3.1-405b": {"server": (6000.0, 175.0), "interactive": (4500.0, 80.0)},
    "deepseek-r1": {"server": (2000.0, 80.0), "interactive": (1500.0, 15.0)},
}
# The size class of a model picks the MLPerf model whose constraints apply.
SIZE_CLASSES = (
    # (name, upper bound of total parameters in billions, MLPerf model)
    ("small", 20.0, "llama3.1-8b"),
    ("medium", 150.0, "llama2-70b"),
    ("large", float("inf"), "llama3.1-405b"),
)
MOE_REASONING_MODEL = "deepseek-r1"


class TuneError(Exception):
    """Bad tuning input; the message names the setting."""


def size_class(params_b=None, moe=False):
    """MLPerf model whose constraints apply to a model of ``params_b`` billion parameters.
    Large MoE models (>= 150 B total) use DeepSeek-R1's constraints."""
    if params_b is None:
        return "llama3.1-8b"
    if moe and params_b >= 150.0:
        return MOE_REASONING_MODEL
    for _name, bound, model in SIZE_CLASSES:
        if params_b < bound:
            return model
    return SIZE_CLASSES[-1][2]


def resolve_slo(slo_class=None, ttft_ms=None, tpot_ms=None, params_b=None, moe=False):
    """The SLO as {'class', 'ttft_ms', 'tpot_ms', 'source'}.

    ``slo_class``: ``mlperf-interactive`` / ``mlperf-server`` (the model's size class picks the
    MLPerf model), ``mlperf-<scenario>:<mlperf model>`` (e.g. ``mlperf-server:llama2-70b``), or
    ``custom`` / None with ``ttft_ms`` and/or ``tpot_ms``. Explicit values override a class's.
    """
    for name, v in (("ttft_ms", ttft_ms), ("tpot_ms", tpot_ms)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0):
            raise TuneError("slo %s must be a positive number of milliseconds, got %r" % (name, v))
    if slo_class in (None, "", "custom"):
        if ttft_ms is None and tpot_ms is None:
            raise TuneError("slo: give slo_class (mlperf-interactive, mlperf-server, "
                            "mlperf-<scenario>:<model>) or custom ttft_ms and/or tpot_ms")
        return {"class": "custom", "ttft_ms": ttft_ms, "tpot_ms": tpot_ms,
                "source": "custom values"}
    name, _sep, model = str(slo_class).partition(":")
    scenario = name[len("mlperf-"):] if name.startswith("mlperf-") else None
    if scenario not in ("interactive", "server"):
        raise TuneError("slo_class %r is not one of custom, mlperf-interactive, mlperf-server "
                        "(optionally :<model>, one of %s)"
                        % (slo_class, ", ".join(sorted(MLPERF_SLOS))))
    if model and model not in MLPERF_SLOS:
        raise TuneError("slo_class %r: MLPerf model %r is not one of %s"
                        % (slo_class, model, ", ".join(sorted(MLPERF_SLOS))))
    model = model or size_class(params_b, moe)
    t, p = MLPERF_SLOS[model][scenario]
    return {"class": "mlperf-%s:%s" % (scenario, model),
            "ttft_ms": float(ttft_ms) if ttft_ms is not None else t,
            "tpot_ms": float(tpot_ms) if tpot_ms is not None else p,
            "source": "MLPerf Inference %s constraints of %s (TTFT/TPOT p99)" % (scenario, model)}


def scale_slo(slo, factor):
    """The SLO with both limits multiplied by ``factor`` (a CPU host serves ~100x slower than
    the GPUs MLPerf's constraints are written for; the report states the factor)."""
    out = dict(slo)
    for k in ("ttft_ms", "tpot_ms"):
        if out.get(k) is not None:
            out[k] = round(out[k] * factor, 3)
    if factor != 1:
        out["scaled_by"] = factor
    return out


# ----------------------------------------------------------------------------- budget

def check_budget(minutes=None, candidates=None):
    """{'minutes': float|None, 'candidates': int|None}; at least one must be set."""
    if minutes is None and candidates is None:
        raise TuneError("budget: set minutes and/or candidates")
    if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, (int, float))
                                or minutes <= 0):
        raise TuneError("budget minutes must be a positive number, got %r" % (minutes,))
    if candidates is not None and (isinstance(candidates, bool) or not isinstance(candidates, int)
                                   or candidates < 1):
        raise TuneError("budget candidates must be a positive integer, got %r" % (candidates,))
    return {"minutes": minutes, "candidates": candidates}


# ----------------------------------------------------------------------------- candidates

# Engine knobs the tuner knows and how each reaches vLLM. None as a value = vLLM's default
# (the flag is left out).
KNOBS = {
    "max-num-seqs": {"type": int},
    "max-num-batched-tokens": {"type": int},
    "kv-cache-memory-bytes": {"type": int},
    "kv-cache-dtype": {"type": str},
    "attention-backend": {"type": str},
    "cudagraph-mode": {"type": str},     # --compilation-config '{"cudagraph_mode": ...}'
    "hf-overrides": {"type": str},       # JSON; used by the tests to break outputs on purpose
}
NCCL_PROFILES = ("latency", "throughput")


def check_knobs(knobs):
    """{knob: [values]} with known knobs and typed values (None = vLLM's default)."""
    if not isinstance(knobs, dict):
        raise TuneError("knobs must be a mapping of knob name to allowed values, got %r"
                        % (knobs,))
    out = {}
    for name, values in knobs.items():
        if name not in KNOBS:
            raise TuneError("knob %r is not one of %s" % (name, ", ".join(sorted(KNOBS))))
        if not isinstance(values, (list, tuple)) or not values:
            raise TuneError("knob %s: give a non-empty list of allowed values, got %r"
                            % (name, values))
        typ = KNOBS[name]["type"]
        for v in values:
            if v is not None and (isinstance(v, bool) or not isinstance(v, typ)):
                raise TuneError("knob %s: value %r is not %s (or null for vLLM's default)"
                                % (name, v, typ.__name__))
            if typ is int and v is not None and v < 1:
                raise TuneError("knob %s: value %r must be >= 1" % (name, v))
        if len(set(values)) != len(values):
            raise TuneError("knob %s: values repeat: %r" % (name, values))
        out[name] = list(values)
    return out


def knob_args(knobs):
    """vLLM arguments for one knob assignment {name: value}; None values are left out."""
    args = []
    for name in sorted(knobs):
        v = knobs[name]
        if v is None:
            continue
        if name == "cudagraph-mode":
            args += ["--compilation-config", '{"cudagraph_mode": "%s"}' % v]
        else:
            args += ["--" + name, str(v)]
    return args


def layout_id(layout):
    s = "tp%d" % layout["tensor_parallel"]
    if layout.get("expert_parallel"):
        s += "+ep"
    if layout.get("data_parallel", 1) > 1:
        s += "-dp%d" % layout["data_parallel"]
    if layout.get("instances", 1) > 1:
        s = "%dx%s" % (layout["instances"], s)
    if layout.get("nccl_profile"):
        s += "-nccl:%s" % layout["nccl_profile"]
    return s


def candidate_id(layout, knobs):
    parts = [layout_id(layout)] + ["%s=%s" % (k, knobs[k]) for k in sorted(knobs)
                                   if knobs[k] is not None]
    return " ".join(parts)


def enumerate_layouts(gpu_count, tensor_parallel=None, expert_parallel=None, data_parallel=None,
                      instances=None, nccl_profiles=None, has_experts=False):
    """Every layout {tensor_parallel, expert_parallel, data_parallel, instances, nccl_profile}
    that fits the host's GPU count, over the user-allowed values (defaults: TP powers of two up
    to the GPU count, EP on and off for MoE models, DP 1, instances 1 and 2, no NCCL choice).
    On a CPU host (gpu_count 0) only the number of instances varies."""
    if gpu_count == 0:
        inst = instances or [1, 2]
        return [{"tensor_parallel": 1, "expert_parallel": False, "data_parallel": 1,
                 "instances": n, "nccl_profile": None} for n in inst]
    tps = tensor_parallel or [t for t in (1, 2, 4, 8, 16) if t <= gpu_count]
    eps = expert_parallel if expert_parallel is not None else ([False, True] if has_experts
                                                               else [False])
    dps = data_parallel or [1]
    insts = instances or [1, 2]
    nccls = nccl_profiles or [None]
    for p in nccls:
        if p is not None and p not in NCCL_PROFILES:
            raise TuneError("nccl profile %r is not one of %s" % (p, ", ".join(NCCL_PROFILES)))
    out = []
    for tp, ep, dp, n, nccl in itertools.product(tps, eps, dps, insts, nccls):
        if tp * dp * n > gpu_count:
            continue
        if nccl is not None and tp * dp == 1:
            continue  # one GPU per instance: no collectives, the NCCL profile changes nothing
        out.append({"tensor_parallel": tp, "expert_parallel": ep, "data_parallel": dp,
                    "instances": n, "nccl_profile": nccl})
    return out


def admit(layouts, model_config=None, weights_bytes=None, gpu_memory_bytes=None,
          max_model_len=None, kv_cache_dtype="auto", gpu_memory_utilization=0.9,
          hf_quant_config=None, reserve_bytes=capacity_plan.DEFAULT_RESERVE_BYTES):
    """Split layouts into (admitted, refused) with the capacity planner. Each instance of a
    layout gets tp*dp GPUs. Refused entries carry the planner's reasons; admitted ones its
    plan summary. CPU layouts (no GPU memory given) are admitted unplanned, said so."""
    admitted, refused = [], []
    for lay in layouts:
        if not gpu_memory_bytes:
            admitted.append(dict(lay, plan=None,
                                 plan_note="CPU host: the GPU capacity planner does not apply; "
                                           "instances share the host's cores and memory"))
            continue
        per = lay["tensor_parallel"] * lay["data_parallel"]
        try:
            p = capacity_plan.plan(
                model_config, weights_bytes, gpu_memory_bytes, per,
                tensor_parallel=lay["tensor_parallel"], data_parallel=lay["data_parallel"],
                expert_parallel=lay["expert_parallel"], kv_cache_dtype=kv_cache_dtype,
                gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                hf_quant_config=hf_quant_config, reserve_bytes=reserve_bytes, strict=False)
        except capacity_plan.PlanError as exc:
            refused.append(dict(lay, id=layout_id(lay), reasons=exc.refusals))
            continue
        if p.refusals:
            refused.append(dict(lay, id=layout_id(lay), reasons=list(p.refusals)))
        else:
            admitted.append(dict(lay, plan={
                "weights_per_gpu_gib": round(p.weights_per_gpu_bytes / float(capacity_plan.GIB), 2),
                "kv_capacity_tokens": p.kv_capacity_tokens_total,
                "max_concurrency": p.max_concurrency_total,
                "warnings": list(p.warnings)}))
    return admitted, refused


def complexity(cand):
    """Sort key, smaller = simpler/cheaper: GPUs used, instances, TP, EP, DP, knobs set away
    from vLLM's defaults, an NCCL profile chosen."""
    lay = cand["layout"]
    gpus = lay["tensor_parallel"] * lay["data_parallel"] * lay["instances"]
    nondefault = sum(1 for v in cand["knobs"].values() if v is not None)
    return (gpus, lay["instances"], lay["tensor_parallel"], bool(lay["expert_parallel"]),
            lay["data_parallel"], nondefault, lay.get("nccl_profile") or "", cand["id"])


def build_candidates(admitted, knobs, default_layout=None, max_candidates=None, pinned=None):
    """Candidates = admitted layouts x knob products. The default candidate (``default_layout``
    or the simplest admitted layout, every knob at vLLM's default) is always first and always
    kept. With ``max_candidates``, the rest are taken round-robin over layouts so every layout
    is represented before any gets a second knob set. ``pinned`` ids are always kept (the
    tests' deliberately wrong candidate, a named correctness reference). Returns
    (kept, dropped_ids)."""
    knobs = check_knobs(knobs or {})
    names = sorted(knobs)
    combos = [dict(zip(names, vals)) for vals in itertools.product(*[knobs[n] for n in names])]
    if not combos:
        combos = [{}]
    by_layout = []
    for lay in admitted:
        lay_clean = {k: lay[k] for k in ("tensor_parallel", "expert_parallel", "data_parallel",
                                         "instances", "nccl_profile")}
        by_layout.append([{"id": candidate_id(lay_clean, c), "layout": lay_clean, "knobs": c,
                           "plan": lay.get("plan"), "plan_note": lay.get("plan_note")}
                          for c in combos])
    flat = [c for group in by_layout for c in group]
    if not flat:
        return [], []
    default_knobs = dict((n, None) for n in names)
    if default_layout is None:
        default_layout = min(flat, key=complexity)["layout"]
    default = None
    for c in flat:
        if c["layout"] == default_layout and c["knobs"] == default_knobs:
            default = c
    if default is None:  # the defaults are not among the allowed values: add them
        lay = dict(default_layout)
        default = {"id": candidate_id(lay, default_knobs), "layout": lay,
                   "knobs": default_knobs, "plan": None, "plan_note": None}
    default = dict(default, default=True)
    rest = []
    for round_ in itertools.zip_longest(*by_layout):
        rest += [c for c in round_ if c is not None and c["id"] != default["id"]]
    pinned = set(pinned or [])
    kept = [default] + [c for c in rest if c["id"] in pinned]
    others = [c for c in rest if c["id"] not in pinned]
    room = None if max_candidates is None else max(0, max_candidates - len(kept))
    kept += others if room is None else others[:room]
    dropped = [] if room is None else [c["id"] for c in others[room:]]
    return kept, dropped


def planner_refusal_examples(model_config, weights_bytes, gpu_memory_bytes, gpu_count,
                             hf_quant_config=None, max_model_len=None):
    """Every pure-TP / TP+EP layout on ``gpu_count`` GPUs with the planner's verdict: the
    'refused layouts for the target models' table of the docs."""
    lays = enumerate_layouts(gpu_count, instances=[1], has_experts=True)
    return admit(lays, model_config, weights_bytes, gpu_memory_bytes, max_model_len=max_model_len,
                 hf_quant_config=hf_quant_config)


# ----------------------------------------------------------------------------- serving

def _replace_flag(args, flag, value):
    """``args`` with ``flag``'s value replaced (flag and value as separate tokens or --f=v);
    None when the flag is not there."""
    out, i, found = [], 0, False
    while i < len(args):
        a = args[i]
        if a == flag and i + 1 < len(args):
            out += [flag, str(value)]
            i += 2
            found = True
            continue
        if a.startswith(flag + "="):
            out.append("%s=%s" % (flag, value))
            found = True
        else:
            out.append(a)
        i += 1
    return out if found else None


def _merge(base, over):
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def service_instances(cand, profile, port, name="main", extra_prefix="tune", host=None,
                      base_overrides=None, base_extra_args=None):
    """vllm_service_instances for a candidate: instance ``name`` on ``port`` and, for more
    instances, ``<extra_prefix>-2``... on the next ports; GPUs split in order (tp*dp each);
    parallel sizes and kv-cache-dtype through profile_overrides; a knob whose flag the
    profile's args set replaces it there (vllm_service refuses a conflicting extra flag); the
    other knobs go to extra_args. ``base_overrides`` / ``base_extra_args``: what the host's
    own configuration sets (vllm_service_profile_overrides / vllm_service_extra_args), which an
    instance's keys would otherwise replace; ``profile`` is the profile with them merged."""
    lay = cand["layout"]
    per = lay["tensor_parallel"] * lay["data_parallel"]
    overrides = {"parallel": {"tensor": lay["tensor_parallel"], "data": lay["data_parallel"],
                              "expert_parallel": bool(lay["expert_parallel"])}}
    args = list(profile.get("args") or [])
    extra = []
    replaced = False
    for knob in sorted(cand["knobs"]):
        v = cand["knobs"][knob]
        if v is None:
            continue
        if knob == "kv-cache-dtype":
            overrides["kv_cache_dtype"] = v
            continue
        flag_args = knob_args({knob: v})
        new = _replace_flag(args, flag_args[0], flag_args[1])
        if new is not None:
            args, replaced = new, True
        else:
            extra += flag_args
    if replaced:
        overrides["args"] = args
    overrides = _merge(base_overrides or {}, overrides)
    extra = list(base_extra_args or []) + extra
    out = []
    gpu = bool(profile.get("gpu", {}).get("required"))
    for i in range(lay["instances"]):
        inst = {"name": name if i == 0 else "%s-%d" % (extra_prefix, i + 1), "port": port + i,
                "profile_overrides": overrides, "extra_args": extra}
        if host:
            inst["host"] = host
        if gpu:
            inst["cuda_visible_devices"] = ",".join(str(g) for g in range(i * per, (i + 1) * per))
        out.append(inst)
    return out


def grid_minutes(n_candidates, levels, window_s, per_candidate_overhead_s):
    """What an auto_tune-style full grid costs: every candidate restarted once and swept over
    every level with the leaders' (longest) window, no early stop. Minutes."""
    return n_candidates * (per_candidate_overhead_s + len(levels) * window_s) / 60.0
