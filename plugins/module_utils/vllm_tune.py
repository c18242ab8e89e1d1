"""The autotuner's logic, pure Python: SLO classes, the budget, candidate
enumeration admitted by the capacity planner, the search (``screen``: one knob at a time from the
default, the winners' combination, then halving among the leaders; or successive halving over
every candidate; early stop at saturation), scoring from the sweep's levels, the correctness gate's comparison, noise-aware
ranking with ties broken towards the simpler layout, and the write-back document.

Nothing here talks to a host: the orchestrator (``vllm_deploy.tune``) serves each candidate
through the normal service path, measures it with the sweep and hands the results to
:class:`Search`, which decides what runs next.
"""
from __future__ import absolute_import, division, print_function

import itertools
import math

from ansible_collections.vllm_ops.deploy.plugins.module_utils import capacity_plan
from ansible_collections.vllm_ops.deploy.plugins.module_utils import sweep_compare

__metaclass__ = type

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


# ----------------------------------------------------------------------------- scoring

def score(levels, gpus=1):
    """Headline of one candidate's sweep (levels = the sweep's per-level summaries; for a
    multi-instance candidate, levels whose counters are summed over its instances):
    goodput = the highest output tok/s of requests meeting every SLO at a level whose p99
    meets the SLO, and the highest concurrency that meets it."""
    best, best_c, met = 0.0, None, []
    for lv in levels:
        if (lv.get("slo") or {}).get("met"):
            met.append(lv["concurrency"])
            g = (lv.get("goodput") or {}).get("output_tok_s") or 0.0
            if g > best:
                best, best_c = g, lv["concurrency"]
    return {"goodput_tok_s": round(best, 3), "goodput_level": best_c,
            "highest_level_meeting_slo": max(met) if met else None,
            "goodput_tok_s_per_gpu": round(best / float(max(gpus, 1)), 3)}


def combine_instances(per_instance):
    """Levels of several instances measured at the same time, level by level: rates and
    goodput summed, SLO met only if met by every instance, latency p99 the worst, TPOT p50
    the mean. Concurrency is the total over instances."""
    if len(per_instance) == 1:
        return per_instance[0]
    out = []
    for group in zip(*per_instance):
        met = all((lv.get("slo") or {}).get("met") for lv in group)
        breaks = [b for lv in group for b in (lv.get("slo") or {}).get("breaks", [])]
        good = [lv.get("goodput") or {} for lv in group]

        def worst(key, q):
            vals = [(lv.get(key) or {}).get(q) for lv in group]
            vals = [v for v in vals if v is not None]
            return max(vals) if vals else None

        precs = [((lv.get("precision") or {}).get("output_tok_s") or {}) for lv in group]
        prec = None
        if all(p.get("value") is not None and p.get("ci_high") is not None for p in precs):
            half = math.sqrt(sum((p["ci_high"] - p["value"]) ** 2 for p in precs))
            val = sum(p["value"] for p in precs)
            dfs = [p.get("df") for p in precs if p.get("df")]
            prec = {"value": val, "ci_low": val - half, "ci_high": val + half,
                    "confidence": precs[0].get("confidence") or 0.95,
                    "df": min(dfs) if dfs else None}
        tp50 = [(lv.get("tpot_ms") or {}).get("p50") for lv in group]
        tp50 = [v for v in tp50 if v is not None]
        out.append({
            "concurrency": sum(lv["concurrency"] for lv in group),
            "output_tok_s": round(sum(lv.get("output_tok_s") or 0 for lv in group), 3),
            "total_tok_s": round(sum(lv.get("total_tok_s") or 0 for lv in group), 3),
            "requests_failed": sum(lv.get("requests_failed") or 0 for lv in group),
            "requests_in_window": sum(lv.get("requests_in_window") or 0 for lv in group),
            "ttft_ms": {"p99": worst("ttft_ms", "p99")},
            "tpot_ms": {"p99": worst("tpot_ms", "p99"),
                        "p50": round(sum(tp50) / len(tp50), 3) if tp50 else None},
            "goodput": {"output_tok_s": round(sum(g.get("output_tok_s") or 0 for g in good), 3),
                        "request_s": round(sum(g.get("request_s") or 0 for g in good), 4)},
            "slo": {"met": met, "breaks": breaks},
            "precision": {"output_tok_s": prec},
        })
    return out


def goodput_measurement(levels, goodput, level):
    """The goodput at ``level`` as a measurement for sweep_compare: the level's batch-means
    interval of output tok/s (from the request log) scaled to the goodput, or None when the
    sweep gave none."""
    for lv in levels or []:
        if lv.get("concurrency") != level:
            continue
        p = (lv.get("precision") or {}).get("output_tok_s") or {}
        v = p.get("value")
        if not v or p.get("ci_low") is None or p.get("ci_high") is None or not goodput:
            return None
        k = goodput / float(v)
        return {"value": goodput, "ci_low": max(p["ci_low"] * k, 1e-9), "ci_high": p["ci_high"] * k,
                "confidence": p.get("confidence") or 0.95, "df": p.get("df")}
    return None


def spread(values):
    """Relative spread of repeated measurements: (max - min) / mean (0 for one value)."""
    vals = [float(v) for v in values if v is not None]
    if len(vals) < 2:
        return None
    mean = sum(vals) / len(vals)
    return (max(vals) - min(vals)) / mean if mean > 0 else None


def compare(a, b, noise):
    """Noise-aware verdict of goodput ``a`` against ``b``: ratio a/b and 'better' / 'worse' /
    'tie' where the ratio is within ``noise`` (relative spread) of 1. This is the verdict form
    of the shared comparison (ratio + interval + verdict)."""
    if b <= 0:
        return {"ratio": None, "verdict": "better" if a > 0 else "tie", "noise": noise}
    r = a / float(b)
    lo, hi = r * (1 - noise), r * (1 + noise)
    verdict = "tie" if lo <= 1.0 <= hi else ("better" if r > 1 else "worse")
    return {"ratio": round(r, 4), "interval": [round(lo, 4), round(hi, 4)],
            "verdict": verdict, "noise": round(noise, 4)}


# ----------------------------------------------------------------------------- correctness

def gate(reference_result, result, reference_id, thresholds=None):
    """The correctness gate of one candidate: vllm_correctness.compare_outputs of its greedy
    outputs against the reference candidate's (token match rate, prefix match, top-1 logprob
    gap, thresholds), with the reference named."""
    from ansible_collections.vllm_ops.deploy.plugins.module_utils import vllm_correctness
    out = vllm_correctness.compare_outputs(result, reference_result, thresholds)
    out = dict((k, v) for k, v in out.items() if k != "per_prompt")
    out["reference"] = reference_id
    return out


# ----------------------------------------------------------------------------- the search

def halving_rounds(n, base_duration_s, eta=2, max_rounds=3, min_survivors=2):
    """The successive-halving schedule for ``n`` candidates: [(survivors, window_s), ...],
    window multiplied by ``eta`` each round, survivors divided by it, down to
    ``min_survivors`` (the leaders measured longest; their repeats give the noise)."""
    if n < 1:
        return []
    rounds, k, w = [], n, float(base_duration_s)
    for _i in range(max_rounds):
        rounds.append((k, w))
        if k <= min_survivors:
            break
        k = max(min_survivors, int(math.ceil(k / float(eta))))
        w *= eta
    return rounds


STRATEGIES = ("auto", "screen", "halving", "grid")
# auto screens when screening serves at most this fraction of what the other search would
# serve (every candidate, or the candidate budget when that is smaller)
SCREEN_FRACTION = 0.75
LAYOUT_KNOB = "layout"


def _dims(cand, default):
    """The 'knobs' in which ``cand`` differs from ``default``: ``layout`` (TP/EP/DP, instances,
    NCCL profile together: one knob whose values are the admitted layouts) and each engine
    knob set to another value, as [(knob, value)] in a fixed order (layout first)."""
    out = []
    if cand["layout"] != default["layout"]:
        out.append((LAYOUT_KNOB, layout_id(cand["layout"])))
    for k in sorted(set(cand["knobs"]) | set(default["knobs"])):
        if cand["knobs"].get(k) != default["knobs"].get(k):
            out.append((k, cand["knobs"].get(k)))
    return out


def screening_plan(candidates):
    """The screening order: the default, then every candidate that changes one knob from it
    (the layout first, then the engine knobs by name, each knob's values in candidate
    order), and the number of candidates screening serves at most (+1 for the combination
    of the winners when two or more knobs vary). Returns (default, singles, count)."""
    default = next((c for c in candidates if c.get("default")), candidates[0])
    singles = [c for c in candidates if c is not default and len(_dims(c, default)) == 1]
    order = [LAYOUT_KNOB] + sorted(default["knobs"])
    singles.sort(key=lambda c: order.index(_dims(c, default)[0][0]))
    knobs = set(_dims(c, default)[0][0] for c in singles)
    return default, singles, 1 + len(singles) + (1 if len(knobs) >= 2 else 0)


def choose_strategy(strategy, candidates, budget_candidates=None):
    """(strategy, reason): ``auto`` becomes ``screen`` when screening serves at most
    SCREEN_FRACTION of the candidates halving would serve in its first round (all of them,
    or the candidate budget when smaller), else ``halving``."""
    if strategy not in STRATEGIES:
        raise TuneError("strategy %r is not one of %s" % (strategy, ", ".join(STRATEGIES)))
    n = len(candidates)
    if strategy != "auto":
        return strategy, "%s (asked for)" % strategy
    _d, _s, count = screening_plan(candidates) if candidates else (None, [], 0)
    served = min(n, budget_candidates) if budget_candidates else n
    if n and count <= SCREEN_FRACTION * served:
        return "screen", ("auto: screening serves at most %d of the %d candidates (%d would be "
                          "served by halving's first round)" % (count, n, served))
    return "halving", ("auto: screening would serve %d candidates, not few enough against the "
                       "%d of halving's first round (of %d)" % (count, served, n))


class Search:
    """The search over candidates, by ``strategy``:

    * ``halving`` (successive halving): round 1 measures every candidate with a short window;
      later rounds re-measure the leaders with longer windows.
    * ``screen``: round 1 measures the default and every candidate that changes ONE knob from
      it (the layout counts as one knob: TP/EP/DP, instances and NCCL profile vary together
      over the admitted layouts, with the engine knobs at their defaults), then the
      combination of each knob's winning value -- a value wins only when it beats the default
      beyond the noise (:func:`decide`, i.e. sweep_compare on the request-log intervals) --
      then successive halving among the leaders (the default, the combination, the best
      single change) from the second round on. Candidates never served are listed in
      ``not_measured`` with the reason (a knob's value that did not beat the default).
    * ``grid``: every candidate once, over every level, no early stop (the baseline): give
      ``max_rounds=1`` and the longest window.

    ``measure(candidate, window_s, levels)`` serves the candidate, sweeps it (stopping at
    saturation or the first SLO break) and returns {'levels': [...], 'correctness': {...} or
    None, 'elapsed_s': float}. Re-measured candidates are swept only up to twice the level
    where they peaked. The default candidate (``default: True``) is measured again in every
    round while it qualifies, so the winner is compared with it at the same window length;
    each round starts with the candidate still serving from the round before (no restart).
    ``clock()`` gives seconds (for the minutes budget); ``budget['candidates']`` caps the
    candidates the screen strategy serves (the other strategies get a list already cut).
    """

    def __init__(self, candidates, measure, levels, base_window_s=3.0, eta=2, max_rounds=3,
                 budget=None, clock=None, gate=None, strategy="halving", pinned=None,
                 noise_floor=0.1):
        self.candidates = list(candidates)
        self.measure = measure
        self.levels = sorted(levels)
        self.base_window_s = base_window_s
        self.eta = eta
        self.max_rounds = max_rounds
        self.budget = budget or {}
        self.clock = clock
        self.gate = gate   # callable(candidate, correctness) -> gate dict
        self.strategy = "halving" if strategy == "grid" else strategy
        if self.strategy not in ("halving", "screen"):
            raise TuneError("Search strategy %r: resolve auto with choose_strategy first"
                            % (strategy,))
        self.pinned = set(pinned or [])
        self.noise_floor = noise_floor
        self.results = {}  # id -> {'rounds': [...], ...}
        self.log = []
        self.measured_s = 0.0
        self.not_measured = []  # [{'id', 'reason', 'layout', 'knobs'}] (screen)
        self.screening = None   # what screening decided (screen)
        self._serving = None
        self._stopped = False

    def _over_budget(self, t0):
        mins = self.budget.get("minutes")
        return mins is not None and self.clock is not None and \
            (self.clock() - t0) >= mins * 60.0

    def run(self):
        t0 = self.clock() if self.clock else 0.0
        if self.strategy == "screen":
            return self._screen(t0)
        schedule = halving_rounds(len(self.candidates), self.base_window_s, self.eta,
                                  self.max_rounds)
        self._halving(list(self.candidates), schedule, 0, t0)
        return self.results

    # -- the two phases ----------------------------------------------------------------------

    def _measure_one(self, cand, rnd, window, t0):
        """Measure ``cand`` in round ``rnd`` (0-based); False when the minutes budget stops."""
        if self._over_budget(t0):
            self.log.append("budget of %s min reached before %s (round %d)"
                            % (self.budget.get("minutes"), cand["id"], rnd + 1))
            self._stopped = True
            return False
        levels = self.levels
        prev = (self.results.get(cand["id"]) or {}).get("rounds")
        if prev:
            peak = prev[-1]["score"]["goodput_level"]
            per = peak // cand["layout"]["instances"] if peak else self.levels[0]
            levels = [lv for lv in self.levels if lv <= 2 * per] or self.levels[:1]
        m = self.measure(cand, window, levels)
        self._serving = cand
        self.measured_s += m.get("elapsed_s") or 0.0
        res = self.results.setdefault(cand["id"], {"candidate": cand, "rounds": []})
        lay = cand["layout"]
        gpus = max(1, lay["tensor_parallel"] * lay["data_parallel"] * lay["instances"])
        res["rounds"].append({"round": rnd + 1, "window_s": window, "levels": levels,
                              "sweep": m["levels"], "score": score(m["levels"], gpus),
                              "elapsed_s": m.get("elapsed_s")})
        if m.get("correctness") is not None and "correctness" not in res:
            res["correctness"] = m["correctness"]
            if self.gate:
                res["gate"] = self.gate(cand, m["correctness"])
        if m.get("error"):
            res["error"] = m["error"]
        self.log.append("round %d: %s -> goodput %.1f tok/s (window %.1fs, levels %s)"
                        % (rnd + 1, cand["id"], res["rounds"][-1]["score"]["goodput_tok_s"],
                           window, levels))
        return True

    def _halving(self, alive, schedule, offset, t0):
        """Successive halving over ``alive`` by ``schedule`` [(survivors, window)], its first
        round numbered ``offset`` + 1; every candidate of the first round is measured."""
        for rnd, (keep, window) in enumerate(schedule):
            if rnd > 0:
                ranked = sorted(alive, key=lambda c: -self._best(c["id"]))
                alive = [c for c in ranked if self._qualified(c["id"])][:keep]
                if len(alive) < 1:
                    break
                # the default goes on into every round (qualified): the winner is compared
                # with it at the same window length, not with its shortest first window
                default = next((c for c in ranked if c.get("default") and self._qualified(c["id"])
                                and c not in alive), None)
                if default is not None:
                    alive.append(default)
            # the candidate still serving from the last round goes first: no restart
            if self._serving is not None and self._serving in alive:
                alive.remove(self._serving)
                alive.insert(0, self._serving)
            for cand in alive:
                if not self._measure_one(cand, offset + rnd, window, t0):
                    return

    def _screen(self, t0):
        cands = self.candidates
        if not cands:
            return self.results
        default, singles, _count = screening_plan(cands)
        cap = self.budget.get("candidates")
        pinned = [c for c in cands if c["id"] in self.pinned and c is not default
                  and c not in singles]
        order = [default] + [c for c in singles if c["id"] in self.pinned] + pinned + \
            [c for c in singles if c["id"] not in self.pinned]
        w0 = self.base_window_s
        served = []
        for cand in order:
            if cap is not None and len(served) >= cap:
                break
            if not self._measure_one(cand, 0, w0, t0):
                break
            served.append(cand)
        # each knob's winner: its best value that beats the default beyond the noise
        winners, verdicts = {}, {}
        dflt_ok = default["id"] in self.results and self._qualified(default["id"])
        for cand in singles:
            if cand not in served:
                continue
            knob, value = _dims(cand, default)[0]
            v = self._versus(cand, default) if dflt_ok and self._qualified(cand["id"]) else None
            verdicts[cand["id"]] = v
            if v is not None and v["verdict"] == "better" and (
                    knob not in winners or self._best(cand["id"]) > self._best(winners[knob]["id"])):
                winners[knob] = cand
        knob_order = [LAYOUT_KNOB] + sorted(default["knobs"])
        for knob in sorted(winners, key=knob_order.index):
            self.log.append("screening: %s=%s beats the default (%s)"
                            % (knob, _dims(winners[knob], default)[0][1],
                               _reason(verdicts[winners[knob]["id"]])))
        combo = None
        if len(winners) >= 2 and not self._stopped:
            lay = winners[LAYOUT_KNOB]["layout"] if LAYOUT_KNOB in winners else default["layout"]
            knobs = dict(default["knobs"])
            for k, c in winners.items():
                if k != LAYOUT_KNOB:
                    knobs[k] = c["knobs"][k]
            combo = next((c for c in cands if c["layout"] == lay and c["knobs"] == knobs), None)
            if combo is None:
                self.log.append("screening: the combination %s is not among the candidates "
                                "(refused by the planner or not allowed)" % candidate_id(lay, knobs))
            elif combo["id"] not in self.results:
                if cap is not None and len(served) >= cap:
                    self.log.append("screening: the combination %s is over the budget of %d "
                                    "candidates" % (combo["id"], cap))
                    combo = None
                elif self._measure_one(combo, 0, w0, t0):
                    served.append(combo)
                else:
                    combo = None
        # the leaders: the default, the combination, the best single change (a winner if any)
        singles_ok = sorted([c for c in singles if c in served and self._qualified(c["id"])],
                            key=lambda c: -self._best(c["id"]))
        best_single = next((c for c in singles_ok if c in winners.values()), None) or \
            (singles_ok[0] if singles_ok else None)
        leaders = [c for c in (default, combo, best_single)
                   if c is not None and c in served and self._qualified(c["id"])]
        self.screening = {
            "default": default["id"], "singles": [c["id"] for c in singles],
            "winners": dict((k, c["id"]) for k, c in winners.items()),
            "combination": combo["id"] if combo else None,
            "leaders": [c["id"] for c in leaders], "served": [c["id"] for c in served]}
        for c in cands:
            if c["id"] in self.results:
                continue
            self.not_measured.append({"id": c["id"], "layout": c["layout"],
                                      "knobs": c["knobs"],
                                      "reason": self._why_not(c, default, winners, served, cap)})
        if self._stopped or self.max_rounds < 2 or len(leaders) < 2:
            return self.results
        schedule = halving_rounds(len(leaders), w0 * self.eta, self.eta, self.max_rounds - 1)
        self._halving(leaders, schedule, 1, t0)
        return self.results

    def _why_not(self, cand, default, winners, served, cap):
        dims = _dims(cand, default)
        if self._stopped:
            return "not measured (minutes budget of %s reached)" % self.budget.get("minutes")
        if len(dims) == 1:
            return "not measured (budget: at most %s candidates)" % cap
        for knob, value in dims:
            single = next((c for c in self.candidates if _dims(c, default) == [(knob, value)]),
                          None)
            if single is None or single not in served:
                continue
            if not self._qualified(single["id"]):
                what = "failed" if self.results[single["id"]].get("error") else "correctness gate"
                return ("not measured (screened out: knob %s's value %s was disqualified on its "
                        "own: %s)" % (knob, value, what))
            if knob not in winners or winners[knob] is not single:
                return ("not measured (screened out: knob %s's value %s did not beat the "
                        "default)" % (knob, value))
        if all(k in winners for k, _v in dims):
            return ("not measured (screened out: a partial combination of winning values; "
                    "the combination of every knob's winner was measured instead)")
        return "not measured (screened out: a knob's value here was not screened (budget))"

    def _versus(self, cand, default):
        """decide() between a candidate's and the default's latest round (the same window)."""
        def row(c):
            res = self.results[c["id"]]
            rounds = res["rounds"]
            last = rounds[-1]["score"]
            noise = spread([r["score"]["goodput_tok_s"] for r in rounds])
            return {"goodput_tok_s": last["goodput_tok_s"], "noise": noise,
                    "_m": goodput_measurement(rounds[-1].get("sweep"), last["goodput_tok_s"],
                                              last["goodput_level"])}
        return decide(row(cand), row(default), self.noise_floor)

    def _qualified(self, cid):
        res = self.results.get(cid) or {}
        return not res.get("error") and (res.get("gate") or {}).get("passed", True)

    def _best(self, cid):
        res = self.results.get(cid)
        if not res:
            return -1.0
        return res["rounds"][-1]["score"]["goodput_tok_s"]


def _reason(v):
    """One line for a decide() verdict (sweep_compare's reason, or the spread's ratio)."""
    if v.get("reason"):
        return v["reason"]
    return "ratio %s, %s within a spread of %.0f %%" % (
        v.get("ratio"), v.get("verdict"), 100 * (v.get("noise") or 0))


def rank(results, default_noise=0.1):
    """The ranked table: qualified candidates by their latest (longest-window) goodput, then
    the disqualified ones. Noise per candidate = the spread of its goodput over rounds (window
    length normalised away by rates), at least ``default_noise`` when it has one round. The
    winner must beat the runner-up beyond the larger of the two noises; otherwise it is a tie
    and the simpler/cheaper candidate of the tied group wins."""
    rows = []
    for cid, res in results.items():
        rounds = res["rounds"]
        goods = [r["score"]["goodput_tok_s"] for r in rounds]
        noise = spread(goods)
        last = rounds[-1]["score"]
        gate = res.get("gate")
        reason = None
        if res.get("error"):
            reason = "failed: %s" % res["error"]
        elif gate is not None and not gate.get("passed"):
            reason = "correctness (reference %s): %s" % (gate.get("reference"),
                                                         "; ".join(gate.get("failures") or []))
        lay = res["candidate"]["layout"]
        meas = goodput_measurement(rounds[-1].get("sweep"), last["goodput_tok_s"],
                                   last["goodput_level"])
        rows.append({
            "id": cid, "default": bool(res["candidate"].get("default")),
            "layout": lay, "knobs": res["candidate"]["knobs"],
            "args": knob_args(res["candidate"]["knobs"]),
            "gpus": lay["tensor_parallel"] * lay["data_parallel"] * lay["instances"],
            "rounds": len(rounds), "window_s": rounds[-1]["window_s"],
            "goodput_tok_s": last["goodput_tok_s"],
            "goodput_tok_s_per_gpu": last["goodput_tok_s_per_gpu"],
            "goodput_level": last["goodput_level"],
            "highest_level_meeting_slo": last["highest_level_meeting_slo"],
            "goodput_by_round": goods, "noise": round(noise, 4) if noise is not None else None,
            "correctness": gate, "disqualified": reason,
            "interval": [round(meas["ci_low"], 3), round(meas["ci_high"], 3)] if meas else None,
            "_m": meas, "_cx": complexity(res["candidate"]),
        })
    ok = sorted([r for r in rows if not r["disqualified"]],
                key=lambda r: (-r["rounds"], -r["goodput_tok_s"], r["_cx"]))
    bad = sorted([r for r in rows if r["disqualified"]], key=lambda r: r["_cx"])
    decision = {"winner": None, "tie": False, "tied_with": [], "verdict": None}
    if ok:
        top = ok[0]
        tied = [top]
        for other in ok[1:]:
            if other["rounds"] != top["rounds"]:
                break
            v = decide(top, other, default_noise)
            if v["verdict"] == "tie":
                tied.append(other)
        if len(tied) > 1:
            simplest = min(tied, key=lambda r: r["_cx"])
            decision = {"winner": simplest["id"], "tie": True,
                        "tied_with": [r["id"] for r in tied if r is not simplest],
                        "verdict": "tie within noise between %s; the simplest/cheapest wins"
                                   % ", ".join(r["id"] for r in tied)}
            ok.remove(simplest)
            ok.insert(0, simplest)
        else:
            runner = ok[1] if len(ok) > 1 else None
            decision = {"winner": top["id"], "tie": False, "tied_with": [],
                        "verdict": ("beats %s beyond the measured noise" % runner["id"])
                        if runner else "the only qualified candidate"}
    table = []
    for i, r in enumerate(ok + bad):
        r = dict(r)
        r.pop("_cx")
        r.pop("_m")
        r["rank"] = i + 1 if not r["disqualified"] else None
        table.append(r)
    return table, decision


def decide(a, b, default_noise=0.1):
    """Is row ``a`` better than row ``b`` beyond the noise? Both with a request-log interval:
    sweep_compare.compare (the whole interval of the ratio must lie above 1), and the spread
    over rounds must not cover the ratio either; otherwise the larger spread over rounds
    (``default_noise`` for a candidate measured once)."""
    n = max(a["noise"] if a["noise"] is not None else default_noise,
            b["noise"] if b["noise"] is not None else default_noise)
    spread_v = compare(a["goodput_tok_s"], b["goodput_tok_s"], n)
    ma, mb = a.get("_m"), b.get("_m")
    if ma and mb and a["goodput_tok_s"] > 0 and b["goodput_tok_s"] > 0:
        v = sweep_compare.compare(ma, mb)
        v = {"ratio": round(v["ratio"], 4), "interval": [round(x, 4) for x in v["ratio_ci"]],
             "verdict": v["verdict"], "reason": v["reason"], "method": "sweep_compare"}
        if (a["noise"] is not None or b["noise"] is not None) and spread_v["verdict"] == "tie":
            v["verdict"] = "tie"
            v["reason"] += "; the spread over rounds (%.1f %%) covers it" % (100 * n)
        return v
    spread_v["method"] = "spread over rounds"
    return spread_v


def versus_default(table, noise_floor=0.1):
    """Winner vs the default candidate: goodput ratio and verdict; 'default is best' when the
    winner is the default or ties with it."""
    win = next((r for r in table if r["rank"] == 1), None)
    dflt = next((r for r in table if r["default"]), None)
    if win is None or dflt is None:
        return {"ratio": None, "verdict": "no default measured" if win else "no winner"}
    if win["id"] == dflt["id"]:
        return {"ratio": 1.0, "verdict": "the default is already best",
                "default": dflt["id"], "winner": win["id"]}
    v = decide(dict(win, _m=_interval_m(win)), dict(dflt, _m=_interval_m(dflt)), noise_floor)
    v.update({"default": dflt["id"], "winner": win["id"]})
    if v["verdict"] != "better":
        v["verdict"] = "tie within noise: the default is as good (%s)" % v["verdict"]
    return v


def _interval_m(row):
    iv = row.get("interval")
    if not iv or not row["goodput_tok_s"]:
        return None
    return {"value": row["goodput_tok_s"], "ci_low": iv[0], "ci_high": iv[1], "confidence": 0.95}


def tune_document(host, slo, budget, refused, dropped, table, decision, vs_default, evidence,
                  applied=False, dummy_weights=False):
    """The write-back: host_vars/<host>/vllm_tune.yml's ``vllm_tune`` mapping."""
    gate_note = ("dummy weights: the gate compares layouts with each other only, not model "
                 "quality" if dummy_weights else
                 "real weights (or the CPU tiny model): outputs compared with the reference")
    win = next((r for r in table if r["rank"] == 1), None)
    return {
        "host": host, "slo": slo, "budget": budget,
        "winner": ({"id": win["id"], "layout": win["layout"], "knobs": win["knobs"],
                    "args": win["args"], "goodput_tok_s": win["goodput_tok_s"]}
                   if win else None),
        "decision": decision, "versus_default": vs_default,
        "ranked": table, "refused": refused, "not_measured": dropped,
        "correctness_note": gate_note, "applied": bool(applied), "evidence": evidence,
    }


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
