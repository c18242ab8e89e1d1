"""vllm_deploy.tune(): find the fastest correct serving layout of one host under a latency SLO.

Each candidate is served through the normal service path (the playbook vllm_ops.deploy.tune:
the vllm_service role with the candidate's instances, readiness included) and measured with the
sweep, all its instances at once; the search (``strategy``: screening one knob at a time, then
successive halving among the leaders, or successive halving over every candidate, or the grid;
early stop at saturation and at the first SLO break) lives in plugins/plugin_utils/tune/search.py. vLLM's compile caches
(torch.compile / inductor / triton under the service user's ~/.cache) are kept between restarts:
they belong to the service home, which no candidate touches.

At the end the host's own configuration (the inventory's) is served again, unless apply=True:
then the winner's instances are written into host_vars/<host>/vllm_tune.yml (next to the
ranked table, the winner and the evidence) and served. A later deploy serves the winner too,
since that file is part of the inventory.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional

import yaml

from .errors import UsageError, VllmDeployError
from .runner import inventory_dirs, project_root, run_playbook

TUNE_FILE = "vllm_tune.yml"


def _mods():
    root = project_root()
    import sys
    coll = os.path.join(root, "collections")
    if coll not in sys.path:
        sys.path.insert(0, coll)
    from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import search as vt
    from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import report as rep
    from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profiles import load_profile
    return vt, rep, load_profile


class TuneResult(dict):
    """The write-back document (dict) plus .reports (paths) and .path (host_vars file)."""

    @property
    def winner(self):
        return self.get("winner")


def tune(inventory, host: str, *, profile: str, slo_class: Optional[str] = None,
         ttft_ms: Optional[float] = None, tpot_ms: Optional[float] = None, slo_scale: float = 1.0,
         params_b: Optional[float] = None, moe: bool = False,
         budget_minutes: Optional[float] = None, budget_candidates: Optional[int] = None,
         knobs: Optional[Dict[str, List[Any]]] = None, instances: Optional[List[int]] = None,
         tensor_parallel: Optional[List[int]] = None, expert_parallel: Optional[List[bool]] = None,
         data_parallel: Optional[List[int]] = None, nccl_profiles: Optional[List[str]] = None,
         gpu_count: int = 0, gpu_memory_mib: Optional[int] = None,
         model_config: Optional[str] = None, weights_bytes: Optional[int] = None,
         max_model_len: Optional[int] = None,
         levels=(1, 2, 4, 8), base_window_s: float = 3.0, eta: int = 2, max_rounds: int = 3,
         input_len: int = 32, output_len: int = 32, port: int = 8000, listen_host: Optional[str] = None,
         reference: Optional[str] = None, min_match: float = 0.9,
         max_logprob_gap: Optional[float] = None, pinned: Optional[List[str]] = None,
         dummy_weights: bool = False, apply: bool = False, restore: bool = True,
         grid: bool = False, strategy: str = "auto", plan_only: bool = False, report_dir: Optional[str] = None,
         profile_overrides: Optional[Dict[str, Any]] = None,
         extra_args: Optional[List[str]] = None,
         extravars: Optional[Dict[str, Any]] = None,
         on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
         log: Optional[Callable[[str], None]] = None) -> TuneResult:
    """Tune ``host`` of ``inventory``; returns the write-back document (see vllm_tune.yml).

    ``profile_overrides`` / ``extra_args``: the host's own vllm_service_profile_overrides and
    vllm_service_extra_args (e.g. ``--load-format dummy``), kept in every candidate.

    ``plan_only=True`` returns the candidates and the planner's refusals without serving.
    ``strategy``: ``screen`` (one knob changed from the default at a time, then the combination
    of the winners, then successive halving among the leaders), ``halving`` (successive halving
    over every candidate), ``grid`` (every candidate over every level with the longest window:
    the auto_tune-style baseline of the benchmark; ``grid=True`` is the same) or ``auto``
    (screen when it serves clearly fewer candidates than halving would; see
    vllm_tune.choose_strategy).
    """
    vt, rep, load_profile = _mods()
    say = log or (lambda msg: None)
    try:
        slo = vt.resolve_slo(slo_class, ttft_ms, tpot_ms, params_b=params_b, moe=moe)
        if slo_scale != 1.0:
            slo = vt.scale_slo(slo, slo_scale)
        budget = vt.check_budget(budget_minutes, budget_candidates)
        knobs = vt.check_knobs(knobs or {})
        if grid:
            strategy = "grid"
        if strategy not in vt.STRATEGIES:
            raise vt.TuneError("strategy %r is not one of %s"
                               % (strategy, ", ".join(vt.STRATEGIES)))
    except vt.TuneError as exc:
        raise UsageError(str(exc)) from None
    levels = sorted(int(x) for x in levels)
    if not levels or levels[0] < 1:
        raise UsageError("levels must be positive integers, got %r" % (levels,))
    prof = load_profile(profile, overrides=profile_overrides or None)
    cfg = None
    if model_config:
        with open(model_config) as f:
            cfg = json.load(f)

    has_experts = bool(cfg and vt.capacity_plan.architecture(cfg)["experts"])
    layouts = vt.enumerate_layouts(gpu_count, tensor_parallel, expert_parallel, data_parallel,
                                   instances, nccl_profiles, has_experts=has_experts)
    if gpu_count and cfg is None:
        raise UsageError("a GPU host needs model_config (the model's config.json) for the "
                         "capacity planner")
    if gpu_count and not weights_bytes:  # estimated layer by layer from config.json
        weights_bytes = vt.capacity_plan.estimate_weights_bytes(cfg)
    admitted, refused = vt.admit(layouts, cfg, weights_bytes,
                                 (gpu_memory_mib or 0) * 1024 * 1024 if gpu_count else None,
                                 max_model_len=max_model_len or prof.get("max_model_len"))
    for r in refused:
        say("refused %s: %s" % (r["id"], "; ".join(r["reasons"])))
    prof_par = prof["parallel"]
    default_layout = {"tensor_parallel": prof_par["tensor"], "expert_parallel":
                      bool(prof_par["expert_parallel"]), "data_parallel": prof_par["data"],
                      "instances": 1, "nccl_profile": None}
    if not any(all(a[k] == default_layout[k] for k in default_layout) for a in admitted):
        default_layout = None
    every, _none = vt.build_candidates(admitted, knobs, default_layout=default_layout,
                                       pinned=pinned)
    strategy, strategy_reason = vt.choose_strategy(strategy, every, budget["candidates"])
    say("strategy: %s" % strategy_reason)
    if strategy == "screen":  # screening picks what it serves; the budget caps it there
        cands, dropped = every, []
    else:
        cands, dropped = vt.build_candidates(admitted, knobs, default_layout=default_layout,
                                             max_candidates=budget["candidates"], pinned=pinned)
    if not cands:
        raise UsageError("no candidate layout is admitted on %s: %s"
                         % (host, "; ".join("%s: %s" % (r["id"], r["reasons"][0]) for r in refused)))
    say("%d candidates (%d not measured: budget), %d layouts refused"
        % (len(cands), len(dropped), len(refused)))
    grid = strategy == "grid"

    if plan_only:  # what would be measured, what the planner refuses; nothing runs
        plan = None
        if strategy == "screen":
            dflt, singles, count = vt.screening_plan(cands)
            plan = {"default": dflt["id"], "singles": [c["id"] for c in singles],
                    "serves_at_most": count}
        return TuneResult({"host": host, "slo": slo, "budget": budget,
                           "strategy": strategy, "strategy_reason": strategy_reason,
                           "screening_plan": plan,
                           "candidates": [{"id": c["id"], "default": bool(c.get("default")),
                                           "plan": c.get("plan"), "note": c.get("plan_note")}
                                          for c in cands],
                           "refused": [{"id": r["id"], "reasons": r["reasons"]} for r in refused],
                           "not_measured": dropped})

    started_units: set = set()
    runs: List[Dict[str, Any]] = []
    points: Dict[str, Any] = {}
    outputs: Dict[str, Any] = {}
    t_start = time.time()
    base_ev = dict(extravars or {})
    base_ev.update({"vllm_tune_host": host, "vllm_service_profile": profile})

    def serve_vars(cand):
        insts = vt.service_instances(cand, prof, port, host=listen_host,
                                     base_overrides=profile_overrides,
                                     base_extra_args=extra_args)
        names = {i["name"] for i in insts}
        stop = sorted("vllm-%s.service" % n for n in started_units - names)
        return insts, stop

    def measure(cand, window, lv):
        insts, stop = serve_vars(cand)
        ev = dict(base_ev, vllm_service_instances=insts, vllm_tune_stop_units=stop,
                  vllm_tune_levels=lv, vllm_tune_duration_s=window,
                  vllm_tune_input_len=input_len, vllm_tune_output_len=output_len,
                  vllm_tune_slo_ttft_ms=slo.get("ttft_ms") or 0,
                  vllm_tune_slo_tpot_ms=slo.get("tpot_ms") or 0,
                  vllm_tune_stop_on_saturation=not grid)
        t0 = time.time()
        runner, collector, _info = run_playbook("vllm_ops.deploy.tune", inventory, limit=host,
                                                extravars=ev, on_event=on_event)
        started_units.update(i["name"] for i in insts)
        for s in stop:
            started_units.discard(s[len("vllm-"):-len(".service")])
        elapsed = time.time() - t0
        facts = collector.facts.get(host, {})
        m = facts.get("vllm_tune_measurement")
        run = {"candidate": cand["id"], "window_s": window, "levels": lv,
               "elapsed_s": round(elapsed, 1), "rc": runner.rc}
        runs.append(run)
        if runner.rc != 0 or not isinstance(m, dict):
            fails = collector.failures_for(host)
            why = fails[0].describe() if fails else "run failed (rc %s)" % runner.rc
            run["error"] = why[:500]
            say("%s: failed: %s" % (cand["id"], why[:200]))
            return {"levels": [], "elapsed_s": elapsed, "error": why[:500], "correctness": None}
        combined = vt.combine_instances(m["levels"])
        points[cand["id"]] = (cand["layout"]["tensor_parallel"] * cand["layout"]["data_parallel"]
                              * cand["layout"]["instances"], combined)
        outs = m.get("correctness")
        outputs.setdefault(cand["id"], outs)
        run["stop_reasons"] = m.get("stop_reasons")
        sc = vt.score(combined)
        say("%s window %.1fs levels %s: goodput %.1f tok/s at C=%s (%.0fs)"
            % (cand["id"], window, lv, sc["goodput_tok_s"], sc["goodput_level"], elapsed))
        return {"levels": combined, "elapsed_s": elapsed, "correctness": outs}

    ref_holder: Dict[str, Any] = {}

    def gate(cand, outs):
        if "id" not in ref_holder:
            if reference is None or reference == cand["id"]:
                ref_holder.update(id=cand["id"], outputs=outs)
        if "id" not in ref_holder:  # a named reference not measured yet: compare later
            return None
        thresholds = {"min_token_match_rate": min_match}
        if max_logprob_gap is not None:
            thresholds["max_logprob_gap_max"] = max_logprob_gap
        from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_correctness import (
            DEFAULT_THRESHOLDS)
        return vt.gate(ref_holder["outputs"], outs, ref_holder["id"],
                       dict(DEFAULT_THRESHOLDS, **thresholds))

    order = list(cands)
    if reference is not None:
        named = [c for c in order if c["id"] == reference]
        if not named:
            raise UsageError("reference %r is not among the candidates: %s"
                             % (reference, ", ".join(c["id"] for c in order)))
        order = named + [c for c in order if c["id"] != reference]

    final_insts = None
    search = None
    try:
        if grid:
            search = vt.Search(order, measure, levels, base_window_s=base_window_s * eta ** (max_rounds - 1),
                               eta=eta, max_rounds=1, budget=budget, clock=time.time, gate=gate)
        else:
            search = vt.Search(order, measure, levels, base_window_s=base_window_s, eta=eta,
                               max_rounds=max_rounds, budget=budget, clock=time.time, gate=gate,
                               strategy=strategy, pinned=pinned)
        results = search.run()
        decision_s = round(time.time() - t_start, 1)
        table, decision = vt.rank(results)
        vs = vt.versus_default(table)
        win = next((r for r in table if r["rank"] == 1), None)
        if apply and win is not None:
            final_insts = [dict(i, profile=profile) for i in
                           vt.service_instances(results[win["id"]]["candidate"], prof, port,
                                                host=listen_host,
                                                base_overrides=profile_overrides,
                                                base_extra_args=extra_args)]
    finally:
        if restore or apply:
            # the role keeps the units of the configuration it serves out of this list
            stop = sorted("vllm-%s.service" % n for n in started_units)
            ev = dict(extravars or {}, vllm_tune_host=host, vllm_tune_stop_units=stop,
                      vllm_tune_measure=False)
            if apply and final_insts:
                ev["vllm_service_instances"] = final_insts
                ev["vllm_service_profile"] = profile
            if started_units:
                runner, collector, _info = run_playbook("vllm_ops.deploy.tune", inventory,
                                                        limit=host, extravars=ev,
                                                        on_event=on_event)
                if runner.rc != 0:
                    fails = collector.failures_for(host)
                    raise VllmDeployError(
                        "%s: serving the %s configuration again failed: %s"
                        % (host, "winner's" if apply else "inventory's",
                           fails[0].describe() if fails else "rc %s" % runner.rc))
    not_measured = [{"id": d, "reason": "not measured (budget: at most %s candidates)"
                     % budget["candidates"]} for d in dropped] + \
        [dict(n) for n in search.not_measured]
    evidence = {"runs": runs, "search_log": search.log, "measured_s": round(search.measured_s, 1),
                "decision_wall_s": decision_s, "mode": "grid" if grid else "search",
                "strategy": strategy, "strategy_reason": strategy_reason,
                "screening": search.screening, "candidates_served": len(results),
                "reference": ref_holder.get("id"), "levels": levels,
                "base_window_s": base_window_s, "eta": eta, "max_rounds": max_rounds}
    doc = vt.tune_document(host, slo, budget, [{"id": r["id"], "reasons": r["reasons"]}
                                               for r in refused],
                           not_measured, table, decision, vs, evidence, applied=bool(apply and win),
                           dummy_weights=dummy_weights)
    pts = rep.pareto_points(points)
    out = TuneResult(doc)
    base = inventory_dirs(inventory)[0]
    rdir = report_dir or os.path.join(base, "reports", host, "tune",
                                      time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    out.reports = rep.write_reports(rdir, doc, pts)
    path = os.path.join(base, "host_vars", host, TUNE_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = {"vllm_tune": doc}
    if apply and final_insts:
        body["vllm_service_instances"] = final_insts
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("---\n# Written by vllm_deploy.tune(): the ranked candidates, the winner and the "
                "evidence.\n# vllm_service_instances is here only when the winner was applied.\n")
        yaml.safe_dump(body, f, sort_keys=False, width=1000)
    os.replace(tmp, path)
    out.path = path
    return out
