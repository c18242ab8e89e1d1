# -*- coding: utf-8 -*-
"""Scoring and ranking of the autotuner's candidates, pure Python: the goodput of a candidate's
sweep (instances combined), noise-aware comparison (the statistics library's intervals, else
the spread of repeats), the correctness gate against the reference, the ranked table with ties
broken towards the simpler layout, and the write-back document.
"""
from __future__ import annotations

import math

from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats import compare as sweep_compare
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune.candidates import (
    complexity, knob_args)


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
        row = {
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
        }
        names = set.intersection(*[set(lv.get("by_slo") or ()) for lv in group])
        if names:
            row["by_slo"] = dict((name, _combine_verdicts([lv["by_slo"][name] for lv in group]))
                                 for name in sorted(names))
        out.append(row)
    return out


def _combine_verdicts(parts):
    """One other SLO's goodput and verdict over instances measured at the same time: goodput
    summed, met only if met by every instance."""
    good = [p.get("goodput") or {} for p in parts]
    return {"goodput": {"output_tok_s": round(sum(g.get("output_tok_s") or 0 for g in good), 3),
                        "request_s": round(sum(g.get("request_s") or 0 for g in good), 4)},
            "slo": {"met": all((p.get("slo") or {}).get("met") for p in parts),
                    "breaks": [b for p in parts for b in (p.get("slo") or {}).get("breaks", [])]}}


def under_slo(levels, name):
    """A sweep's levels as they stand under the other SLO ``name`` (the sweep's ``by_slo``):
    its goodput and verdict in place of the run's own; None when a level was not judged by it
    (a journal written without it)."""
    out = []
    for lv in levels or []:
        other = (lv.get("by_slo") or {}).get(name)
        if other is None:
            return None
        out.append(dict(lv, goodput=other.get("goodput"), slo=other.get("slo")))
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
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.service import vllm_correctness
    out = vllm_correctness.compare_outputs(result, reference_result, thresholds)
    out = dict((k, v) for k, v in out.items() if k != "per_prompt")
    out["reference"] = reference_id
    return out


def _reason(v):
    """One line for a decide() verdict (sweep_compare's reason, or the spread's ratio)."""
    if v.get("reason"):
        return v["reason"]
    return "ratio %s, %s within a spread of %.0f %%" % (
        v.get("ratio"), v.get("verdict"), 100 * (v.get("noise") or 0))


def rank(results, default_noise=0.1, noise_floor=None):
    """The ranked table: qualified candidates by their latest (longest-window) goodput, then
    the disqualified ones. Noise per candidate = the spread of its goodput over rounds (window
    length normalised away by rates), at least ``default_noise`` when it has one round. The
    winner must beat the runner-up beyond the larger of the two noises; otherwise it is a tie
    and the simpler/cheaper candidate of the tied group wins. ``noise_floor`` (the host's
    drift over the run, measured on the default) is the least noise of every candidate: a
    difference within it is a tie whatever the intervals say."""
    rows = []
    for cid, res in results.items():
        rounds = res["rounds"]
        goods = [r["score"]["goodput_tok_s"] for r in rounds]
        noise = spread(goods)
        if noise_floor is not None:
            noise = max(noise or 0.0, noise_floor)
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
    winner is the default or ties with it, 'nothing to compare' when nothing else qualified."""
    win = next((r for r in table if r["rank"] == 1), None)
    dflt = next((r for r in table if r["default"]), None)
    if win is None or dflt is None:
        return {"ratio": None, "verdict": "no default measured" if win else "no winner"}
    if win["id"] == dflt["id"]:
        if not any(not r["default"] and not r["disqualified"] for r in table):
            # nothing else qualified (the budget ran out, or every other candidate failed):
            # the default won by default, not by comparison
            return {"ratio": 1.0, "default": dflt["id"], "winner": win["id"],
                    "verdict": "nothing to compare: no other candidate was measured and "
                               "qualified (see not_measured and the disqualified)"}
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


def rank_other_slos(results, others, noise_floor=None):
    """The same measurements ranked under each other SLO (``others``: name -> its limits):
    per name, the SLO, the ranked rows (id, goodput and the levels that meet it, the
    interval, why a candidate is out), the decision and the winner against the default. A
    candidate whose measurement was not judged by that SLO (taken from a journal written
    without it) is left out and named. The search itself followed the run's own SLO: what
    was served and how often is the same for every SLO here."""
    out = {}
    for name, limits in sorted((others or {}).items()):
        judged, unjudged = {}, []
        for cid, res in results.items():
            lay = res["candidate"]["layout"]
            gpus = max(1, lay["tensor_parallel"] * lay["data_parallel"] * lay["instances"])
            rounds = []
            for r in res["rounds"]:
                levels = under_slo(r.get("sweep"), name)
                if levels is None:
                    break
                rounds.append(dict(r, sweep=levels, score=score(levels, gpus)))
            if len(rounds) != len(res["rounds"]) or not rounds:
                unjudged.append(cid)
                continue
            judged[cid] = dict(res, rounds=rounds)
        table, decision = rank(judged, noise_floor=noise_floor) if judged else ([], None)
        keep = ("id", "default", "rank", "goodput_tok_s", "goodput_level",
                "highest_level_meeting_slo", "interval", "noise", "disqualified")
        out[name] = {"slo": dict(limits, **{"class": name}),
                     "ranked": [dict((k, r[k]) for k in keep) for r in table],
                     "decision": decision,
                     "versus_default": versus_default(table) if table else None,
                     "not_judged": sorted(unjudged)}
    return out


def tune_document(host, slo, budget, refused, dropped, table, decision, vs_default, evidence,
                  applied=False, dummy_weights=False, other_slos=None):
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
        "other_slos": other_slos or {},
    }
