# -*- coding: utf-8 -*-
"""The gated upgrade's decision, pure Python: is a new vLLM pin as fast and as
correct as the one serving?

Nothing here measures: the role (roles/vllm_install/tasks/gate.yml) sweeps the current and the
candidate version with ``vllm_ops.deploy.vllm_sweep`` and decodes the same greedy prompts with
``vllm_ops.deploy.vllm_correctness`` (reference = the current version's outputs), then hands the
results here. The comparison is ``sweep_compare.compare_levels`` (the shared noise-aware
comparison): a level is ``worse`` only when the whole interval of candidate/current output tok/s
lies below ``1 - tolerance``.

``decide(candidate_levels, current_levels, correctness, coherence, tolerance_pct,
min_token_match, override=False, current_after_levels=None)`` returns ``accepted``,
``verdict`` (``accept``, ``reject`` or ``override``), ``reasons`` (why it rejects; empty when
it accepts), ``speed_only`` (it rejects on speed alone), ``rows`` (one per level: current and
candidate tok/s with intervals, ratio and its interval, verdict) and ``correctness`` (the
figures). ``current_after_levels`` is the current version measured again after the candidate
(the role does that when the first decision rejects on speed alone): the spread between the
current version's two measurements is the host's own drift over the gate, and a level is then
worse only when the candidate lies below both measurements by more than the tolerance and that
drift together (ratio bounds multiply: 1 - (1 - tolerance) x (1 - drift)). ``render_table(decision, ...)`` is the side-by-side table a
rejected upgrade prints. ``candidate_argv(argv, current_link, venv, port)`` is the serving
instance's command line run from the new venv on another port. ``history_entry(...)`` and
``merge_history(...)`` make the per-host history the inventory keeps.
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats import compare as sweep_compare

__metaclass__ = type

# Only output tok/s decides; TTFT is shown but not gated.
GATED_METRICS = (sweep_compare.DEFAULT_METRICS[0],)


class GateError(ValueError):
    """Input the gate cannot decide on (no common level, no correctness figures)."""


def _interval(level):
    m = sweep_compare.level_measurement(level, ("output_tok_s",), "output_tok_s")
    if m is None:
        return None
    value, se, df = sweep_compare.normalize(m)
    half = 0.0 if not se else sweep_compare.t_quantile(0.975, df) * se
    return {"value": value, "low": value - half, "high": value + half}


def _bracketed(cand_level, cur_level, after_level, tol):
    """The candidate against the current version measured before and after it: the relative
    spread of the two current measurements (drift) widens the tolerance, the two combined as ratio
    bounds (1 - (1 - tol) x (1 - drift)), so that a wide drift never makes every candidate a
    tie; worse (or better) only against both. Returns a compare_levels-like row plus ``drift``."""
    cur, again = _interval(cur_level), _interval(after_level)
    if cur is None or again is None or _interval(cand_level) is None:
        return None
    a, b = cur["value"], again["value"]
    drift = abs(a - b) / ((a + b) / 2.0) if a + b > 0 else 0.0
    wide = min(1.0 - (1.0 - tol) * max(1.0 - drift, 0.0), 0.99)
    rows = [sweep_compare.compare_levels([cand_level], [lv], metrics=GATED_METRICS,
                                         tolerance=wide)["rows"][0]
            for lv in (cur_level, after_level)]
    verdicts = set(r["verdict"] for r in rows)
    verdict = verdicts.pop() if len(verdicts) == 1 else "tie"
    cand = _interval(cand_level)["value"]
    ratio = cand / ((a + b) / 2.0)
    lo = min(r["ratio_ci"][0] for r in rows)
    hi = max(r["ratio_ci"][1] for r in rows)
    return {"concurrency": cand_level["concurrency"], "ratio": ratio, "ratio_ci": [lo, hi],
            "verdict": verdict, "noise_pct": 100.0 * (hi - lo) / 2.0 / ratio, "drift": drift}


def decide(candidate_levels, current_levels, correctness, coherence=None, tolerance_pct=5.0,
           min_token_match=0.9, override=False, current_after_levels=None):
    """Accept or reject the candidate; see the module documentation.

    ``correctness``: the candidate's ``vllm_correctness`` comparison (``token_match_rate``,
    ``logprob_gap_max``, ...) against the current version's outputs. ``coherence``: a dict
    check name -> bool (the venv's verify steps: import and version match, flashinfer).
    ``current_after_levels``: the current version's sweep taken again after the candidate's."""
    if not isinstance(correctness, dict) or correctness.get("token_match_rate") is None:
        raise GateError("no correctness comparison of the candidate with the current version")
    tol = float(tolerance_pct) / 100.0
    cmp_ = sweep_compare.compare_levels(candidate_levels or [], current_levels or [],
                                        metrics=GATED_METRICS, tolerance=tol)
    if not cmp_["rows"]:
        raise GateError("the candidate's and the current version's sweeps share no level "
                        "(candidate %s, current %s)"
                        % ([lv.get("concurrency") for lv in candidate_levels or []],
                           [lv.get("concurrency") for lv in current_levels or []]))
    cur = dict((lv["concurrency"], lv) for lv in current_levels)
    cand = dict((lv["concurrency"], lv) for lv in candidate_levels)
    after = dict((lv["concurrency"], lv) for lv in current_after_levels or [])
    rows, reasons, speed = [], [], 0
    for r in cmp_["rows"]:
        c = r["concurrency"]
        b = _bracketed(cand[c], cur[c], after[c], tol) if c in after else None
        r = b or r
        row = {"concurrency": c, "current": _interval(cur[c]), "candidate": _interval(cand[c]),
               "ratio": r["ratio"], "ratio_ci": r["ratio_ci"], "verdict": r["verdict"],
               "noise_pct": r["noise_pct"],
               "failed": [int(cur[c].get("requests_failed") or 0),
                          int(cand[c].get("requests_failed") or 0)]}
        if b:
            row.update(current_after=_interval(after[c]), drift_pct=100.0 * b["drift"])
        rows.append(row)
        if r["verdict"] == "worse":
            speed += 1
            reasons.append("output tok/s at concurrency %d is %.1f%% of the current version's "
                           "(95%% interval %.1f-%.1f%%), below the %.1f%% tolerance beyond the noise%s"
                           % (c, 100 * r["ratio"], 100 * r["ratio_ci"][0],
                              100 * r["ratio_ci"][1], float(tolerance_pct),
                              " and the current version's own drift (%.1f%% between its two "
                              "measurements)" % (100.0 * b["drift"]) if b else ""))
        if row["failed"][1] > row["failed"][0]:
            reasons.append("%d requests failed at concurrency %d on the candidate (%d on the "
                           "current version)" % (row["failed"][1], c, row["failed"][0]))
    rate = float(correctness["token_match_rate"])
    if rate < float(min_token_match):
        reasons.append("token match rate %.3f is below %.3f (greedy prompts, reference = the "
                       "current version's outputs)" % (rate, float(min_token_match)))
    for name, ok in sorted((coherence or {}).items()):
        if not ok:
            reasons.append("coherence check failed: %s" % name)
    accepted = not reasons or bool(override)
    verdict = "accept" if not reasons else ("override" if override else "reject")
    return {"accepted": accepted, "verdict": verdict, "reasons": reasons, "rows": rows,
            "speed_only": bool(reasons) and speed == len(reasons),
            "bracketed": any("current_after" in r for r in rows),
            "tolerance_pct": float(tolerance_pct), "min_token_match": float(min_token_match),
            "correctness": {k: correctness.get(k) for k in
                            ("token_match_rate", "prefix_match_rate", "exact_match_prompts",
                             "prompts", "logprob_gap_max", "logprob_gap_mean",
                             "first_divergence")},
            "coherence": dict(coherence or {}), "override": bool(override) and bool(reasons)}


def _f(x, fmt="%.1f"):
    return "-" if x is None else fmt % x


def _iv(m):
    if not m:
        return "-"
    return "%s [%s-%s]" % (_f(m["value"]), _f(m["low"]), _f(m["high"]))


def render_table(decision, current_pin="current", candidate_pin="candidate", journal=None,
                 mode=None, comparison=None):
    """The side-by-side table (plain text, fixed width) and what follows it."""
    again = any("current_after" in r for r in decision["rows"])
    head = ("conc", "%s tok/s [95%%]" % current_pin, "%s tok/s [95%%]" % candidate_pin,
            "ratio [95%]", "verdict")
    body = [(str(r["concurrency"]), _iv(r["current"]), _iv(r["candidate"]),
             "%.3f [%.3f-%.3f]" % (r["ratio"], r["ratio_ci"][0], r["ratio_ci"][1]),
             r["verdict"]) for r in decision["rows"]]
    if again:
        head = head[:3] + ("%s again tok/s [95%%]" % current_pin, "drift") + head[3:]
        body = [b[:3] + (_iv(r.get("current_after")), "%.1f%%" % r.get("drift_pct", 0.0)) + b[3:]
                for b, r in zip(body, decision["rows"])]
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    out = [line(head), sep] + [line(b) for b in body]
    c = decision["correctness"]
    out.append("correctness (greedy, reference = %s): token match %s (min %s), prefix match %s, "
               "exact %s/%s prompts, top-1 logprob gap max %s mean %s"
               % (current_pin, _f(c.get("token_match_rate"), "%.3f"),
                  _f(decision["min_token_match"], "%.3f"),
                  _f(c.get("prefix_match_rate"), "%.3f"), c.get("exact_match_prompts"),
                  c.get("prompts"), _f(c.get("logprob_gap_max"), "%.4g"),
                  _f(c.get("logprob_gap_mean"), "%.4g")))
    if decision["coherence"]:
        out.append("coherence: " + ", ".join("%s %s" % (k, "ok" if v else "FAILED")
                                             for k, v in sorted(decision["coherence"].items())))
    out.append("tolerance %.1f%% beyond the noise%s; %s" % (
        decision["tolerance_pct"],
        " and the current version's drift (measured before and after the candidate; a level is "
        "worse only below both)" if again else "", comparison or "both measured in this run"))
    if mode:
        out.append("mode: %s" % mode)
    out.append("verdict: %s%s" % (decision["verdict"].upper(),
                                  ("; " + "; ".join(decision["reasons"])) if decision["reasons"]
                                  else ""))
    if journal:
        out.append("candidate journal: %s" % journal)
    return "\n".join(out)


def _gpu_list(value):
    """GPU indices from a list or a comma-separated string ("" / None -> [])."""
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [int(x) for x in value.replace(" ", "").split(",") if x != ""]
    return [int(x) for x in value]


def choose_mode(requested, endpoints, gpu_facts=None, gate_gpus="", port_free=True,
                mem_available_mib=None, serving_mem_mib=None, busy_gpu_pct=5.0,
                mem_margin=1.2):
    """Where the gate's candidate runs: ``beside`` (a second server on a spare port, the
    current version serving on) or ``window`` (the current version stopped while the
    candidate is measured on its port).

    ``auto`` chooses beside only when the candidate can get what it needs:
    - on a host with GPUs (``gpu_facts['count'] > 0``): ``gate_gpus`` (the
      vllm_install_gate_gpus setting), or as many GPUs as the first instance uses that no
      declared instance uses and that were nearly empty when the facts were taken (at most
      ``busy_gpu_pct`` % of their memory used). An instance without a GPU set uses every GPU.
    - on a host without GPUs: ``mem_available_mib`` (MemAvailable) at least ``mem_margin``
      times the memory the serving instance's unit uses (``serving_mem_mib``); unknown
      figures mean beside.
    - in both cases a free candidate port.
    Returns ``{"mode", "reason", "gpus"}``; ``gpus`` is the comma-separated GPU list the
    candidate gets in beside mode ("" = the instance's own setting)."""
    endpoints = list(endpoints or [])
    if requested not in ("auto", "beside", "window"):
        raise GateError("vllm_install_gate_mode must be auto, beside or window (got %r)"
                        % (requested,))
    explicit = _gpu_list(gate_gpus)
    if requested != "auto":
        return {"mode": requested, "reason": "vllm_install_gate_mode=%s" % requested,
                "gpus": ",".join(str(g) for g in explicit)}
    if not port_free:
        return {"mode": "window", "reason": "the candidate's port is in use", "gpus": ""}
    facts = gpu_facts if isinstance(gpu_facts, dict) else {}
    count = int(facts.get("count") or 0)
    if count > 0:
        if explicit:
            return {"mode": "beside", "gpus": ",".join(str(g) for g in explicit),
                    "reason": "vllm_install_gate_gpus=%s" % ",".join(str(g) for g in explicit)}
        used, takers = set(), []
        for ep in endpoints:
            gpus = _gpu_list(ep.get("gpus"))
            if not gpus:
                used.update(range(count))
                takers.append("%s (no GPU set: every GPU)" % ep.get("name", "?"))
            else:
                used.update(gpus)
                takers.append("%s (GPUs %s)" % (ep.get("name", "?"), ",".join(map(str, gpus))))
        busy = set()
        for g in facts.get("gpus") or []:
            total = float(g.get("memory_total_mib") or 0)
            if total > 0 and float(g.get("memory_used_mib") or 0) > total * busy_gpu_pct / 100.0:
                busy.add(int(g.get("index", -1)))
        need = len(_gpu_list(endpoints[0].get("gpus"))) if endpoints else 0
        need = need or count
        spare = sorted(set(range(count)) - used - busy)
        if len(spare) >= need:
            pick = spare[:need]
            return {"mode": "beside", "gpus": ",".join(map(str, pick)),
                    "reason": "GPUs %s are used by no instance" % ",".join(map(str, pick))}
        return {"mode": "window", "gpus": "",
                "reason": "the candidate needs %d GPU(s) and %d of %d are free (%s%s)"
                          % (need, len(spare), count, "; ".join(takers) or "none declared",
                             "; busy: %s" % ",".join(map(str, sorted(busy))) if busy else "")}
    if mem_available_mib is None or serving_mem_mib is None or float(serving_mem_mib) <= 0:
        return {"mode": "beside", "gpus": "",
                "reason": "no GPUs; the serving instance's memory use is not known"}
    want = float(serving_mem_mib) * float(mem_margin)
    if float(mem_available_mib) >= want:
        return {"mode": "beside", "gpus": "",
                "reason": "no GPUs; %d MiB available >= %.0f MiB (%.1fx the serving instance's "
                          "%d MiB)" % (mem_available_mib, want, mem_margin, serving_mem_mib)}
    return {"mode": "window", "gpus": "",
            "reason": "no GPUs; %d MiB available < %.0f MiB (%.1fx the serving instance's "
                      "%d MiB)" % (mem_available_mib, want, mem_margin, serving_mem_mib)}


def candidate_argv(argv, current_link, venv, port):
    """The serving instance's argv run from ``venv`` instead of ``current_link`` and on
    ``port`` (every other argument unchanged)."""
    out = list(argv)
    if not out:
        raise GateError("the serving instance has no command line")
    prefix = current_link.rstrip("/") + "/"
    out = [venv.rstrip("/") + "/" + a[len(prefix):] if a.startswith(prefix) else a for a in out]
    if "--port" in out:
        i = out.index("--port")
        out[i + 1] = str(port)
    else:
        out += ["--port", str(port)]
    return out


def headline(levels):
    """{concurrency: output tok/s} of a sweep."""
    return dict((int(lv["concurrency"]), round(float(lv["output_tok_s"]), 3))
                for lv in levels or [] if lv.get("output_tok_s") is not None)


def history_entry(pin_id, pin, decision, candidate_levels, mode, at, previous=None,
                  downtime_s=None, versions=None):
    """One accepted pin of the host's history."""
    return {"pin_id": pin_id, "pin": pin, "accepted_at": at, "mode": mode,
            "verdict": decision["verdict"], "override": bool(decision["override"]),
            "reasons_overridden": list(decision["reasons"]) if decision["override"] else [],
            "previous": previous, "downtime_s": downtime_s, "versions": versions or {},
            "output_tok_s": headline(candidate_levels),
            "token_match_rate": decision["correctness"].get("token_match_rate"),
            "levels": list(candidate_levels or [])}


def merge_history(doc, entry, keep=20):
    """The history document with ``entry`` appended (an older entry of the same pin_id is
    replaced), newest last, at most ``keep`` entries."""
    doc = dict(doc or {})
    pins = [p for p in (doc.get("pins") or []) if p.get("pin_id") != entry["pin_id"]]
    pins.append(entry)
    doc["pins"] = pins[-int(keep):]
    return doc
