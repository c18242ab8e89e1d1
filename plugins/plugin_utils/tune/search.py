# -*- coding: utf-8 -*-
"""The autotuner's search, pure Python: ``screen`` (one knob at a time from the default, the
winners' combination, then halving among the leaders), successive halving over every candidate,
or the grid; early stop at saturation and at the first SLO break.

Nothing here talks to a host: the tuner (tuner.py) serves each candidate through the normal
service path, measures it with the sweep and hands the results to :class:`Search`, which
decides what runs next. The candidates are built in candidates.py and ranked in ranking.py;
their names are imported here too.
"""
from __future__ import annotations

import math

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune.candidates import (
    admit, build_candidates, candidate_id, check_budget, check_knobs, enumerate_layouts,
    grid_minutes, knob_args, layout_id, resolve_slo, scale_slo, service_instances, TuneError)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune.ranking import (
    _reason, combine_instances, compare, decide, gate, goodput_measurement, rank,
    rank_other_slos, score, spread, tune_document, under_slo, versus_default)

__all__ = (
    "admit", "build_candidates", "check_budget", "check_knobs", "choose_strategy",
    "combine_instances", "compare", "decide", "enumerate_layouts", "gate", "grid_minutes",
    "halving_rounds", "knob_args", "layout_id", "rank", "rank_other_slos", "resolve_slo",
    "scale_slo", "score", "screening_plan", "Search", "service_instances", "spread",
    "STRATEGIES", "tune_document", "TuneError", "under_slo", "versus_default")


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
    ``recall(candidate, window_s, levels)``, when given, returns an earlier run's measurement
    in ``measure``'s form (a resumed run) or None; a recalled candidate is not served.
    ``bracket`` (the grid): once every candidate is measured, the default is measured again
    with the same window and levels; the time its first measurement took is kept back from
    the minutes budget for it (no other candidate starts once only that time is left), so a
    budget that stops the grid still leaves the bracket; ``drift`` then holds both
    goodputs and their relative spread, the host's own drift over the run, which the ranking
    takes as the noise of every candidate measured once (:func:`rank`'s ``noise_floor``).
    """

    def __init__(self, candidates, measure, levels, base_window_s=3.0, eta=2, max_rounds=3,
                 budget=None, clock=None, gate=None, strategy="halving", pinned=None,
                 noise_floor=0.1, recall=None, bracket=False, reference_every=0):
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
        self.recall = recall
        self.bracket = bracket
        self.reference_every = int(reference_every or 0)
        self._since_reference = 0  # candidates served since the default was last measured
        self._references = []      # the default's goodput each time it was measured again
        self.drift = None       # the default measured first and last (bracket)
        self.results = {}  # id -> {'rounds': [...], ...}
        self.log = []
        self.measured_s = 0.0
        self.not_measured = []  # [{'id', 'reason', 'layout', 'knobs'}] (screen, minutes budget)
        self.screening = None   # what screening decided (screen)
        self._serving = None
        self._stopped = False

    def _over_budget(self, t0, keep_s=0.0):
        mins = self.budget.get("minutes")
        return mins is not None and self.clock is not None and \
            (self.clock() - t0) + keep_s >= mins * 60.0

    def _bracket_reserve(self, cand):
        """Seconds kept back for the bracket before ``cand`` starts, once the default was
        served in this run (0 otherwise): its first measurement's time, or, once another
        candidate was served after it, its measuring time plus the longest restart served
        since. The default is served first, often by an engine's cold start (compile and JIT
        caches empty), which a restart for the bracket does not pay again."""
        if not self.bracket or cand.get("default"):
            return 0.0
        default = next((c for c in self.candidates if c.get("default")), None)
        res = self.results.get(default["id"]) if default else None
        if not res or res["rounds"][0].get("resumed") or not self._qualified(default["id"]):
            return 0.0
        first = res["rounds"][0]
        restarts = [r["serve_s"] for cid, other in self.results.items() if cid != default["id"]
                    for r in other["rounds"] if not r.get("resumed") and r.get("serve_s") is not None]
        if restarts and first.get("measure_s") is not None:
            return min(float(first.get("elapsed_s") or 0.0),
                       float(first["measure_s"]) + max(restarts))
        return float(first.get("elapsed_s") or 0.0)

    def run(self):
        t0 = self.clock() if self.clock else 0.0
        if self.strategy == "screen":
            return self._screen(t0)
        schedule = halving_rounds(len(self.candidates), self.base_window_s, self.eta,
                                  self.max_rounds)
        self._halving(list(self.candidates), schedule, 0, t0)
        self._list_unserved()
        if self.bracket:
            self._measure_default_again(t0)
        return self.results

    def _measure_default_again(self, t0, last=True):
        """The grid's bracket: the default measured again after the other candidates (``last``)
        or between them (``reference_every``), with its first round's window and levels; every
        such goodput and the first give the drift."""
        default = next((c for c in self.candidates if c.get("default")), None)
        res = self.results.get(default["id"]) if default else None
        if res is None or len(self.results) < 2 or not self._qualified(default["id"]) or \
                self._serving is default:  # nothing was served after it
            return
        if self._over_budget(t0, 0.0 if last else self._bracket_reserve({})):
            if last:
                self.log.append("the default was not measured again: the minutes budget of %s "
                                "was reached" % self.budget.get("minutes"))
            return
        first = res["rounds"][0]
        m = self.measure(default, first["window_s"], first["levels"])
        self._serving = default
        self._since_reference = 0
        self.measured_s += m.get("elapsed_s") or 0.0
        if m.get("error"):
            self.log.append("the default's measurement again failed: %s" % m["error"])
            return
        lay = default["layout"]
        gpus = max(1, lay["tensor_parallel"] * lay["data_parallel"] * lay["instances"])
        now = score(m["levels"], gpus)
        a, b = first["score"]["goodput_tok_s"], now["goodput_tok_s"]
        self._references.append({"at_s": round(self.clock() - t0, 1) if self.clock else None,
                                 "after": len(self.results) - 1, "goodput_tok_s": b})
        self.log.append("the default again%s: goodput %.1f tok/s (first %.1f, drift %s)"
                        % (", last" if last else " (after %d candidates)" % (len(self.results) - 1),
                           b, a, "%+.1f %%" % (100 * (b / a - 1)) if a else "n/a"))
        if not last:
            return
        vals = [a] + [r["goodput_tok_s"] for r in self._references]
        self.drift = {"candidate": default["id"], "first": first["score"], "last": now,
                      "ratio": round(b / a, 4) if a else None,
                      "spread": round(spread(vals), 4) if a and all(vals) else None,
                      "references": list(self._references),
                      "last_sweep": m["levels"], "elapsed_s": m.get("elapsed_s")}

    def _list_unserved(self):
        """The candidates the minutes budget stopped before they were served, each listed in
        ``not_measured`` with that reason: a ranking of the others must not read as if these
        had been measured and lost."""
        if not self._stopped:
            return
        listed = {n["id"] for n in self.not_measured}
        for c in self.candidates:
            if c["id"] not in self.results and c["id"] not in listed:
                self.not_measured.append({"id": c["id"], "layout": c["layout"],
                                          "knobs": c["knobs"], "reason": self._budget_reason()})

    def _budget_reason(self):
        return "not measured (minutes budget of %s reached)" % self.budget.get("minutes")

    # -- the two phases ----------------------------------------------------------------------

    def _measure_one(self, cand, rnd, window, t0):
        """Measure ``cand`` in round ``rnd`` (0-based); False when the minutes budget stops."""
        keep = self._bracket_reserve(cand)
        if self._over_budget(t0, keep):
            self.log.append("budget of %s min reached before %s (round %d)%s"
                            % (self.budget.get("minutes"), cand["id"], rnd + 1,
                               "; %.0f s kept for measuring the default again" % keep
                               if keep else ""))
            self._stopped = True
            return False
        levels = self.levels
        prev = (self.results.get(cand["id"]) or {}).get("rounds")
        if prev:
            peak = prev[-1]["score"]["goodput_level"]
            per = peak // cand["layout"]["instances"] if peak else self.levels[0]
            levels = [lv for lv in self.levels if lv <= 2 * per] or self.levels[:1]
        m = self.recall(cand, window, levels) if self.recall else None
        if m is None:
            m = self.measure(cand, window, levels)
            self._serving = cand
            self._since_reference = 0 if cand.get("default") else self._since_reference + 1
            self.measured_s += m.get("elapsed_s") or 0.0
        res = self.results.setdefault(cand["id"], {"candidate": cand, "rounds": []})
        lay = cand["layout"]
        gpus = max(1, lay["tensor_parallel"] * lay["data_parallel"] * lay["instances"])
        res["rounds"].append({"round": rnd + 1, "window_s": window, "levels": levels,
                              "sweep": m["levels"], "score": score(m["levels"], gpus),
                              "elapsed_s": m.get("elapsed_s")})
        for k in ("serve_s", "measure_s"):
            if m.get(k) is not None:
                res["rounds"][-1][k] = m[k]
        if m.get("resumed"):
            res["rounds"][-1]["resumed"] = True
        if m.get("correctness") is not None and "correctness" not in res:
            res["correctness"] = m["correctness"]
            if self.gate:
                res["gate"] = self.gate(cand, m["correctness"])
        if m.get("error"):
            res["error"] = m["error"]
        self.log.append("round %d: %s -> goodput %.1f tok/s (window %.1fs, levels %s)%s"
                        % (rnd + 1, cand["id"], res["rounds"][-1]["score"]["goodput_tok_s"],
                           window, levels, " (from the resumed journal)" if m.get("resumed")
                           else ""))
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
            for i, cand in enumerate(alive):
                if not self._measure_one(cand, offset + rnd, window, t0):
                    return
                if self.bracket and self.reference_every and i + 1 < len(alive) and \
                        self._since_reference >= self.reference_every:
                    self._measure_default_again(t0, last=False)

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
            return self._budget_reason()
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
