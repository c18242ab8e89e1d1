# -*- coding: utf-8 -*-
"""The autotuner's orchestration: find the fastest correct serving layout of one host under a
latency SLO.

Each candidate is served through the normal service path (the playbook vllm_ops.deploy.tune: the
vllm_service role with the candidate's instances, readiness included) and measured with the
sweep, all its instances at once; the search (search.py) decides what runs next. vLLM's compile
caches (torch.compile / inductor / triton under the service user's ~/.cache) are kept between
restarts: they belong to the service home, which no candidate touches.

At the end the host's own configuration (the inventory's) is served again, unless ``apply``:
then the winner's instances are written into host_vars/<host>/vllm_tune.yml (next to the
ranked table, the winner and the evidence) and served. A later deploy serves the winner too,
since that file is part of the inventory.

:class:`Tuner` runs nothing itself: ``play(extravars)`` runs the tune playbook for the host and
returns ``{"rc", "facts", "failure"}`` (the vllm_deploy API passes one over ansible-runner).
"""
from __future__ import annotations

import json
import os
import time

import yaml

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service import (
    vllm_capacity_plan as capacity_plan)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_correctness import (
    DEFAULT_THRESHOLDS)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import check_levels
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profiles import (
    load_profile)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import journal as jr
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import report as rep
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune import search as vt

TUNE_FILE = "vllm_tune.yml"
TuneError = vt.TuneError


class TuneServeError(TuneError):
    """Serving the host's configuration again (or the winner's) failed after the search."""


# The tuner's settings and their defaults (vllm_deploy.tune() documents each).
DEFAULTS = {
    "slo_class": None, "ttft_ms": None, "tpot_ms": None, "slo_scale": 1.0, "params_b": None,
    "moe": False, "budget_minutes": None, "budget_candidates": None, "knobs": None,
    "instances": None, "tensor_parallel": None, "expert_parallel": None, "data_parallel": None,
    "nccl_profiles": None, "gpu_count": 0, "gpu_memory_mib": None, "model_config": None,
    "weights_bytes": None, "max_model_len": None, "levels": (1, 2, 4, 8),
    "base_window_s": 3.0, "eta": 2, "max_rounds": 3, "input_len": 32, "output_len": 32,
    "port": 8000, "listen_host": None, "reference": None, "min_match": 0.9,
    "max_logprob_gap": None, "pinned": None, "dummy_weights": False, "apply": False,
    "restore": True, "grid": False, "strategy": "auto", "profile_overrides": None,
    "extra_args": None, "extravars": None, "resume": None, "reference_every": 0,
    "min_lifetimes": 5, "also_slos": None,
}


class Tuner(object):
    """One tuning run of ``host`` with ``profile``; ``settings`` are DEFAULTS' names."""

    def __init__(self, host, profile, play, log=None, journal=None, **settings):
        unknown = sorted(set(settings) - set(DEFAULTS))
        if unknown:
            raise TuneError("unknown tune setting(s): %s" % ", ".join(unknown))
        self.host, self.profile, self.play = host, profile, play
        self.say = log or (lambda msg: None)
        self.journal = journal  # a JSON-lines file: one line per measurement, as it is taken
        self.o = dict(DEFAULTS, **settings)
        self.started_units = set()
        self.runs, self.points, self.outputs, self.ref = [], {}, {}, {}
        self.resumed = None
        self.prepare()

    # --- what would be measured --------------------------------------------------------
    def prepare(self):
        """Check the settings and build the candidates (raises TuneError naming a setting)."""
        o = self.o
        self.slo = vt.resolve_slo(o["slo_class"], o["ttft_ms"], o["tpot_ms"],
                                  params_b=o["params_b"], moe=o["moe"])
        if o["slo_scale"] != 1.0:
            self.slo = vt.scale_slo(self.slo, o["slo_scale"])
        self.other_slos = self._other_slos()
        # what the sweep judges each request by: name -> the limits the class sets
        self.other_limits = dict(
            (name, dict((k, other[k]) for k in ("ttft_ms", "tpot_ms") if other.get(k) is not None))
            for name, other in self.other_slos.items())
        self.budget = vt.check_budget(o["budget_minutes"], o["budget_candidates"])
        knobs = vt.check_knobs(o["knobs"] or {})
        strategy = "grid" if o["grid"] else o["strategy"]
        if strategy not in vt.STRATEGIES:
            raise TuneError("strategy %r is not one of %s" % (strategy, ", ".join(vt.STRATEGIES)))
        for name in ("max_rounds", "input_len", "output_len", "eta", "reference_every"):
            v = o[name]
            least = {"eta": 2, "reference_every": 0}.get(name, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise TuneError("%s must be an integer >= %d, got %r" % (name, least, v))
        ml = o["min_lifetimes"]
        if isinstance(ml, bool) or not isinstance(ml, (int, float)) or ml < 0:
            raise TuneError("min_lifetimes must be a number >= 0 (0: the window only), got %r"
                            % (ml,))
        if o["reference_every"] and strategy != "grid":
            raise TuneError("reference_every measures the default between the grid's candidates: "
                            "it needs strategy grid, got %r" % strategy)
        try:
            self.levels = sorted(check_levels(list(o["levels"] or []), coerce=True))
        except (TypeError, ValueError) as exc:
            raise TuneError(str(exc))
        self.prof = load_profile(self.profile, overrides=o["profile_overrides"] or None)
        cfg = None
        if o["model_config"]:
            with open(o["model_config"]) as f:
                cfg = json.load(f)
        has_experts = bool(cfg and capacity_plan.architecture(cfg)["experts"])
        layouts = vt.enumerate_layouts(o["gpu_count"], o["tensor_parallel"], o["expert_parallel"],
                                       o["data_parallel"], o["instances"], o["nccl_profiles"],
                                       has_experts=has_experts)
        if o["gpu_count"] and cfg is None:
            raise TuneError("a GPU host needs model_config (the model's config.json) for the "
                            "capacity planner")
        weights_bytes = o["weights_bytes"]
        if o["gpu_count"] and not weights_bytes:  # estimated layer by layer from config.json
            weights_bytes = capacity_plan.estimate_weights_bytes(cfg)
        admitted, self.refused = vt.admit(
            layouts, cfg, weights_bytes,
            (o["gpu_memory_mib"] or 0) * 1024 * 1024 if o["gpu_count"] else None,
            max_model_len=o["max_model_len"] or self.prof.get("max_model_len"))
        for r in self.refused:
            self.say("refused %s: %s" % (r["id"], "; ".join(r["reasons"])))
        par = self.prof["parallel"]
        default_layout = {"tensor_parallel": par["tensor"], "expert_parallel":
                          bool(par["expert_parallel"]), "data_parallel": par["data"],
                          "instances": 1, "nccl_profile": None}
        if not any(all(a[k] == default_layout[k] for k in default_layout) for a in admitted):
            default_layout = None
        every, _none = vt.build_candidates(admitted, knobs, default_layout=default_layout,
                                           pinned=o["pinned"])
        self.strategy, self.strategy_reason = vt.choose_strategy(strategy, every,
                                                                 self.budget["candidates"])
        self.say("strategy: %s" % self.strategy_reason)
        if self.strategy == "screen":  # screening picks what it serves; the budget caps it there
            self.cands, self.dropped = every, []
        else:
            self.cands, self.dropped = vt.build_candidates(
                admitted, knobs, default_layout=default_layout,
                max_candidates=self.budget["candidates"], pinned=o["pinned"])
        if not self.cands:
            raise TuneError("no candidate layout is admitted on %s: %s" % (
                self.host, "; ".join("%s: %s" % (r["id"], r["reasons"][0]) for r in self.refused)))
        self.say("%d candidates (%d not measured: budget), %d layouts refused"
                 % (len(self.cands), len(self.dropped), len(self.refused)))
        self.grid = self.strategy == "grid"
        if o["resume"] is not None:
            paths = [o["resume"]] if isinstance(o["resume"], str) else o["resume"]
            if not isinstance(paths, (list, tuple)) or not paths or \
                    not all(isinstance(p, str) and p for p in paths):
                raise TuneError("resume must be the path(s) of earlier runs' measurement journals "
                                "(or their report directories), got %r" % (o["resume"],))
            dflt = next((c for c in self.cands if c.get("default")), None)
            if dflt is None:
                raise TuneError("resume: vLLM's defaults are not among the candidates, so "
                                "nothing can anchor the journal's measurements")
            if o["reference"] not in (None, dflt["id"]):
                raise TuneError("resume: the reference must be the default (%s), got %r: the "
                                "default is measured first" % (dflt["id"], o["reference"]))
            self.resumed = jr.Resumed(paths, self.cands, self.settings(), self.say)

    def _other_slos(self):
        """``also_slos``: the SLO classes the same measurements are also ranked under, each
        resolved like ``slo_class`` (the model's size class, ``slo_scale``): name -> SLO."""
        o, out = self.o, {}
        also = o["also_slos"]
        if also is None:
            return out
        if isinstance(also, str) or not isinstance(also, (list, tuple)) or \
                not all(isinstance(c, str) and c for c in also):
            raise TuneError("also_slos must be a list of SLO classes (mlperf-interactive, "
                            "mlperf-server, mlperf-<scenario>:<model>), got %r" % (also,))
        for cls in also:
            if cls == "custom":
                raise TuneError("also_slos: %r: only the run's own SLO can be custom "
                                "(ttft_ms, tpot_ms)" % cls)
            slo = vt.resolve_slo(cls, params_b=o["params_b"], moe=o["moe"])
            if o["slo_scale"] != 1.0:
                slo = vt.scale_slo(slo, o["slo_scale"])
            if slo["class"] == self.slo["class"] or slo["class"] in out:
                raise TuneError("also_slos: %s is already %s" % (
                    slo["class"], "the run's own SLO" if slo["class"] == self.slo["class"]
                    else "listed"))
            out[slo["class"]] = slo
        return out

    def settings(self):
        """The settings a measurement depends on besides its candidate, window and levels
        (journal.SETTINGS): a journal written with others cannot be resumed."""
        o = self.o
        return {"profile": self.profile, "input_len": o["input_len"],
                "output_len": o["output_len"], "slo": self.slo,
                "profile_overrides": o["profile_overrides"] or None,
                "extra_args": list(o["extra_args"] or []) or None,
                "min_lifetimes": o["min_lifetimes"]}

    def plan(self):
        """What would be measured and what the planner refuses; nothing runs."""
        plan = None
        if self.strategy == "screen":
            dflt, singles, count = vt.screening_plan(self.cands)
            plan = {"default": dflt["id"], "singles": [c["id"] for c in singles],
                    "serves_at_most": count}
        return {"host": self.host, "slo": self.slo, "budget": self.budget,
                "strategy": self.strategy, "strategy_reason": self.strategy_reason,
                "screening_plan": plan,
                "candidates": [{"id": c["id"], "default": bool(c.get("default")),
                                "plan": c.get("plan"), "note": c.get("plan_note")}
                               for c in self.cands],
                "refused": [{"id": r["id"], "reasons": r["reasons"]} for r in self.refused],
                "not_measured": self.dropped}

    # --- serving and measuring ---------------------------------------------------------
    def _instances(self, cand):
        o = self.o
        return vt.service_instances(cand, self.prof, o["port"], host=o["listen_host"],
                                    base_overrides=o["profile_overrides"],
                                    base_extra_args=o["extra_args"])

    def measure(self, cand, window, lv):
        """Serve ``cand`` and sweep it over ``lv`` with ``window`` seconds per level."""
        o, slo = self.o, self.slo
        insts = self._instances(cand)
        names = {i["name"] for i in insts}
        stop = sorted("vllm-%s.service" % n for n in self.started_units - names)
        ev = dict(o["extravars"] or {})
        ev.update({"vllm_tune_host": self.host, "vllm_service_profile": self.profile,
                   "vllm_service_instances": insts, "vllm_tune_stop_units": stop,
                   "vllm_tune_levels": lv, "vllm_tune_duration_s": window,
                   "vllm_tune_min_lifetimes": o["min_lifetimes"],
                   "vllm_tune_input_len": o["input_len"], "vllm_tune_output_len": o["output_len"],
                   "vllm_tune_slo_ttft_ms": slo.get("ttft_ms") or 0,
                   "vllm_tune_slo_tpot_ms": slo.get("tpot_ms") or 0,
                   "vllm_tune_also_slos": self.other_limits,
                   "vllm_tune_stop_on_saturation": not self.grid})
        t0 = time.time()
        res = self.play(ev)
        self.started_units.update(i["name"] for i in insts)
        for s in stop:
            self.started_units.discard(s[len("vllm-"):-len(".service")])
        elapsed = time.time() - t0
        m = (res.get("facts") or {}).get("vllm_tune_measurement")
        run = {"candidate": cand["id"], "window_s": window, "levels": lv,
               "elapsed_s": round(elapsed, 1), "rc": res["rc"]}
        self.runs.append(run)
        if res["rc"] != 0 or not isinstance(m, dict):
            why = res.get("failure") or "run failed (rc %s)" % res["rc"]
            run["error"] = why[:500]
            self.say("%s: failed: %s" % (cand["id"], why[:200]))
            self._record(cand, run, None, None)
            return {"levels": [], "elapsed_s": elapsed, "error": why[:500], "correctness": None}
        combined = vt.combine_instances(m["levels"])
        if self.resumed is not None and cand.get("default"):
            self.resumed.measured_default(window, lv, combined)
        lay = cand["layout"]
        self.points[cand["id"]] = (lay["tensor_parallel"] * lay["data_parallel"]
                                   * lay["instances"], combined)
        outs = m.get("correctness")
        self.outputs.setdefault(cand["id"], outs)
        if m.get("measure_s") is not None:  # the rest of the play served the candidate
            run["measure_s"] = round(float(m["measure_s"]), 1)
            run["serve_s"] = round(max(elapsed - run["measure_s"], 0.0), 1)
        run["stop_reasons"] = m.get("stop_reasons")
        run["through"] = m.get("through")  # the router at the total concurrency, or the instances
        sc = vt.score(combined)
        split = (": serve %.0fs, measure %.0fs" % (run["serve_s"], run["measure_s"])
                 if "serve_s" in run else "")
        self.say("%s window %.1fs levels %s: goodput %.1f tok/s at C=%s (%.0fs%s)%s"
                 % (cand["id"], window, lv, sc["goodput_tok_s"], sc["goodput_level"], elapsed,
                    split, self._other_scores(combined)))
        self._record(cand, run, sc, combined, outs)
        out = {"levels": combined, "elapsed_s": elapsed, "correctness": outs}
        if "serve_s" in run:
            out.update(serve_s=run["serve_s"], measure_s=run["measure_s"])
        return out

    def _other_scores(self, levels):
        """'; under NAME: goodput G at C=L' for each other SLO, for the run's log."""
        out = []
        for name in sorted(self.other_slos):
            judged = vt.under_slo(levels, name)
            if judged is None:
                out.append("; under %s: not judged" % name)
                continue
            sc = vt.score(judged)
            out.append("; under %s: goodput %.1f tok/s at C=%s"
                       % (name, sc["goodput_tok_s"], sc["goodput_level"]))
        return "".join(out)

    def recall(self, cand, window, lv):
        """A resumed run: the journal's measurement of ``cand`` (anchored on the default
        measured in this run), or None when it must be served."""
        m = self.resumed.recall(cand, window, lv) if self.resumed is not None else None
        if m is None:
            return None
        anchor = m["resumed"]["anchor"]
        lay = cand["layout"]
        self.points[cand["id"]] = (lay["tensor_parallel"] * lay["data_parallel"]
                                   * lay["instances"], m["levels"])
        self.outputs.setdefault(cand["id"], m["correctness"])
        self.runs.append({"candidate": cand["id"], "window_s": window, "levels": lv,
                          "elapsed_s": m["elapsed_s"], "rc": 0,
                          "resumed_from": m["resumed"]["from"],
                          "measured_at": m["resumed"]["measured_at"],
                          "anchor_factor": anchor["overall"]["factor"] if anchor else None})
        sc = vt.score(m["levels"])
        self.say("%s window %.1fs levels %s: goodput %.1f tok/s at C=%s (from the journal, "
                 "measured %s; %s%s)" % (
                     cand["id"], window, lv, sc["goodput_tok_s"], sc["goodput_level"],
                     m["resumed"]["measured_at"],
                     ("anchored on the default: x%.3f" % anchor["overall"]["factor"]) if anchor
                     else "not anchored: the journal has no default measured with this window "
                          "and these levels",
                     "" if m["correctness"] is not None else "; no outputs in the journal, "
                     "correctness not checked"))
        return m

    def _record(self, cand, run, sc, combined, outputs=None):
        """Append one measurement to the journal at once, so that a run stopped before its end
        (interrupted, out of time) keeps what it measured, and a later run can resume from it;
        the write-back summarises them."""
        if self.journal:
            jr.append(self.journal, jr.record(cand, run, sc, combined, outputs, self.settings()))

    def gate(self, cand, outs):
        """The correctness gate: ``cand``'s outputs against the reference's."""
        o = self.o
        if "id" not in self.ref:
            if o["reference"] is None or o["reference"] == cand["id"]:
                self.ref.update(id=cand["id"], outputs=outs)
        if "id" not in self.ref:  # a named reference not measured yet: compare later
            return None
        thresholds = {"min_token_match_rate": o["min_match"]}
        if o["max_logprob_gap"] is not None:
            thresholds["max_logprob_gap_max"] = o["max_logprob_gap"]
        return vt.gate(self.ref["outputs"], outs, self.ref["id"],
                       dict(DEFAULT_THRESHOLDS, **thresholds))

    def _restore(self, final_insts):
        """Serve the inventory's configuration again (or the winner's, with apply)."""
        o = self.o
        if not (o["restore"] or o["apply"]) or not self.started_units:
            return
        # the role keeps the units of the configuration it serves out of this list
        stop = sorted("vllm-%s.service" % n for n in self.started_units)
        ev = dict(o["extravars"] or {}, vllm_tune_host=self.host, vllm_tune_stop_units=stop,
                  vllm_tune_measure=False)
        if o["apply"] and final_insts:
            ev["vllm_service_instances"] = final_insts
            ev["vllm_service_profile"] = self.profile
        res = self.play(ev)
        if res["rc"] != 0:
            raise TuneServeError("%s: serving the %s configuration again failed: %s" % (
                self.host, "winner's" if o["apply"] else "inventory's",
                res.get("failure") or "rc %s" % res["rc"]))

    def run(self):
        """Search, rank, serve the inventory's (or the winner's) configuration again; returns
        (the write-back document, the Pareto points, the winner's instances or None)."""
        o = self.o
        order = list(self.cands)
        if self.resumed is not None:  # the default first: the journal's anchor
            order.sort(key=lambda c: not c.get("default"))
        if o["reference"] is not None:
            named = [c for c in order if c["id"] == o["reference"]]
            if not named:
                raise TuneError("reference %r is not among the candidates: %s"
                                % (o["reference"], ", ".join(c["id"] for c in order)))
            order = named + [c for c in order if c["id"] != o["reference"]]
        t_start = time.time()
        final_insts, search = None, None
        try:
            if self.grid:
                search = vt.Search(order, self.measure, self.levels,
                                   base_window_s=o["base_window_s"] * o["eta"] ** (o["max_rounds"] - 1),
                                   eta=o["eta"], max_rounds=1, budget=self.budget, clock=time.time,
                                   gate=self.gate, recall=self.recall, bracket=True,
                                   reference_every=o["reference_every"])
            else:
                search = vt.Search(order, self.measure, self.levels,
                                   base_window_s=o["base_window_s"], eta=o["eta"],
                                   max_rounds=o["max_rounds"], budget=self.budget,
                                   clock=time.time, gate=self.gate, strategy=self.strategy,
                                   pinned=o["pinned"], recall=self.recall)
            results = search.run()
            decision_s = round(time.time() - t_start, 1)
            drift = search.drift
            floor = drift["spread"] if drift else None
            table, decision = vt.rank(results, noise_floor=floor)
            vs = vt.versus_default(table)
            others = vt.rank_other_slos(results, self.other_slos, noise_floor=floor)
            win = next((r for r in table if r["rank"] == 1), None)
            if o["apply"] and win is not None:
                final_insts = [dict(i, profile=self.profile) for i in
                               self._instances(results[win["id"]]["candidate"])]
        finally:
            self._restore(final_insts)
        not_measured = [{"id": d, "reason": "not measured (budget: at most %s candidates)"
                         % self.budget["candidates"]} for d in self.dropped] + \
            [dict(n) for n in search.not_measured]
        evidence = {"runs": self.runs, "search_log": search.log,
                    "measured_s": round(search.measured_s, 1), "decision_wall_s": decision_s,
                    "mode": "grid" if self.grid else "search", "strategy": self.strategy,
                    "strategy_reason": self.strategy_reason, "screening": search.screening,
                    "candidates_served": len(results), "reference": self.ref.get("id"),
                    "levels": self.levels, "base_window_s": o["base_window_s"], "eta": o["eta"],
                    "max_rounds": o["max_rounds"],
                    "resumed": self.resumed.evidence() if self.resumed is not None else None,
                    "drift": dict((k, v) for k, v in search.drift.items() if k != "last_sweep")
                    if search.drift else None}
        doc = vt.tune_document(self.host, self.slo, self.budget,
                               [{"id": r["id"], "reasons": r["reasons"]} for r in self.refused],
                               not_measured, table, decision, vs, evidence,
                               applied=bool(o["apply"] and win),
                               dummy_weights=o["dummy_weights"], other_slos=others)
        return doc, rep.pareto_points(self.points), final_insts


JOURNAL_FILE = jr.JOURNAL_FILE


# The reports' root in the inventory directory, the same as vllm_benchmark_report_root's
# default: hidden, because Ansible given the inventory directory reads every other file in it
# as an inventory source.
REPORTS_DIR = ".reports"


def report_dir_for(inventory_dir, host):
    """Where a run's reports and its measurement journal go: <inventory>/.reports/<host>/tune/
    <the run's start time, UTC>."""
    return os.path.join(inventory_dir, REPORTS_DIR, host, "tune",
                        time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))


def write_back(inventory_dir, host, doc, points, final_insts=None, report_dir=None):
    """The reports (under ``report_dir``, default :func:`report_dir_for`) and
    host_vars/<host>/vllm_tune.yml (the document; the winner's instances when applied).
    Returns (report paths, the host_vars file)."""
    rdir = report_dir or report_dir_for(inventory_dir, host)
    reports = rep.write_reports(rdir, doc, points)
    if os.path.exists(os.path.join(rdir, JOURNAL_FILE)):
        reports["measurements"] = os.path.join(rdir, JOURNAL_FILE)
    path = os.path.join(inventory_dir, "host_vars", host, TUNE_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = {"vllm_tune": doc}
    if final_insts:
        body["vllm_service_instances"] = final_insts
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("---\n# Written by vllm_deploy.tune(): the ranked candidates, the winner and the "
                "evidence.\n# vllm_service_instances is here only when the winner was applied.\n")
        yaml.safe_dump(body, f, sort_keys=False, width=1000)
    os.replace(tmp, path)
    return reports, path
