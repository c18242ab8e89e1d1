# -*- coding: utf-8 -*-
"""The tuner's measurement journal, pure Python: one JSON line per measurement, appended the
moment it is taken, so that a run stopped before its end (interrupted, out of time) keeps what
it measured; and the same file read back by a resumed run.

A resumed run serves only what the journal lacks. It measures vLLM's defaults again first,
whatever the journal holds, and anchors each measurement it takes from the journal on them:
each level's throughput is multiplied by (the default's output tok/s at that level now) /
(the same then), and its interval widened by both default measurements' intervals (relative
half-widths added in quadrature). The latencies, and with them whether a level met the SLO,
stay as they were measured. A host that has become slower or faster since (another lease of a
lent machine, a driver update, other load) then shifts every candidate by the same factor, and
the ranking compares like with like.
"""
from __future__ import annotations

import copy
import json
import math
import os
import time

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune.candidates import TuneError

JOURNAL_FILE = "measurements.jsonl"
# The settings a measurement depends on besides its candidate, window and levels: a journal
# written with other values cannot be resumed.
SETTINGS = ("profile", "input_len", "output_len", "slo", "profile_overrides", "extra_args",
            "min_lifetimes")
# What a journal written before a setting existed was measured with.
SETTINGS_ABSENT = {"min_lifetimes": 0}


def record(cand, run, score, sweep, outputs, settings):
    """The journal line of one measurement: the run entry (candidate id, window, levels,
    seconds, rc, error), when, the candidate's layout and knobs, the score, each level's summary
    (with its interval), the correctness outputs, and the settings it was measured with."""
    return dict(run, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                layout=cand["layout"], knobs=cand.get("knobs"), score=score, sweep=sweep,
                outputs=outputs, settings=settings)


def append(path, line):
    """Append ``line`` to the journal at ``path`` and sync it to disk before returning."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(line, sort_keys=True, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read(path):
    """The records of the journal ``path`` (the file, or a run's report directory holding it).
    A last line cut short (the run was killed while writing it) is left out; any other line
    that is not a JSON object is an error naming ``resume``. Returns (file, records, notes)."""
    fpath = os.path.join(path, JOURNAL_FILE) if os.path.isdir(path) else path
    if not os.path.isfile(fpath):
        raise TuneError("resume: no measurement journal at %s" % path)
    with open(fpath) as f:
        lines = f.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    recs, notes = [], []
    for i, ln in enumerate(lines):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or "candidate" not in rec:
            if i == len(lines) - 1:
                notes.append("the journal's last line is cut short (the run stopped while "
                             "writing it): left out")
                continue
            raise TuneError("resume: line %d of %s is not a measurement record" % (i + 1, fpath))
        recs.append(rec)
    return fpath, recs, notes


def _rel_half(level):
    p = (level.get("precision") or {}).get("output_tok_s") or {}
    v = p.get("value")
    if not v or p.get("ci_low") is None or p.get("ci_high") is None:
        return None
    return max(p["ci_high"] - v, v - p["ci_low"]) / float(v)


def _by_level(sweep):
    return dict((lv.get("concurrency"), lv) for lv in sweep or [])


def anchor_factors(then_sweep, now_sweep):
    """Per concurrency level: {'factor': now/then output tok/s of the default, 'rel_half': the
    two default measurements' relative interval half-widths in quadrature (None when either
    has no interval), 'then', 'now'}; levels either sweep lacks are left out."""
    then, now = _by_level(then_sweep), _by_level(now_sweep)
    out = {}
    for c in sorted(set(then) & set(now)):
        t, n = then[c].get("output_tok_s"), now[c].get("output_tok_s")
        if not t or not n:
            continue
        ht, hn = _rel_half(then[c]), _rel_half(now[c])
        out[c] = {"factor": round(n / float(t), 4), "then": t, "now": n,
                  "rel_half": (round(math.sqrt(ht ** 2 + hn ** 2), 4)
                               if ht is not None and hn is not None else None)}
    return out


def anchored(sweep, factors, overall):
    """A copy of ``sweep`` with each level's rates (its goodput under every SLO too)
    multiplied by its level's factor (``overall`` where the anchor lacks the level) and its
    output tok/s interval widened by the anchor's; each level says how (``anchored``)."""
    out = []
    for lv in sweep or []:
        a = factors.get(lv.get("concurrency")) or overall
        f = a["factor"]
        lv = copy.deepcopy(lv)
        for k in ("output_tok_s", "total_tok_s", "request_s"):
            if isinstance(lv.get(k), (int, float)):
                lv[k] = round(lv[k] * f, 4)
        for good in [lv.get("goodput") or {}] + [
                (o or {}).get("goodput") or {} for o in (lv.get("by_slo") or {}).values()]:
            for k in ("output_tok_s", "request_s"):
                if isinstance(good.get(k), (int, float)):
                    good[k] = round(good[k] * f, 4)
        p = (lv.get("precision") or {}).get("output_tok_s")
        h = _rel_half(lv)
        if p and h is not None:
            val = p["value"] * f
            half = val * math.sqrt(h ** 2 + (a.get("rel_half") or 0.0) ** 2)
            p.update(value=round(val, 4), ci_low=round(val - half, 4), ci_high=round(val + half, 4))
            if p.get("se") is not None:
                p["se"] = round(p["se"] * f, 4)
        lv["anchored"] = {"factor": f, "default_then": a.get("then"), "default_now": a.get("now"),
                          "rel_half": a.get("rel_half")}
        out.append(lv)
    return out


class Resumed(object):
    """What a resumed run takes from earlier runs' journals (``paths``: one or more, each a
    journal or its report directory).

    ``candidates``: this run's; a record is used for the candidate with its id, layout and
    knobs when it succeeded (rc 0, a score) and was measured with the same settings; failed
    records are served again. Where several journals measured a candidate, the latest
    measurement is taken. ``settings``: this run's SETTINGS values. Each journal's own default
    record is its anchor (the default itself is always measured again)."""

    def __init__(self, paths, candidates, settings, say=None):
        say = say or (lambda msg: None)
        if isinstance(paths, str):
            paths = [paths]
        by_id = dict((c["id"], c) for c in candidates)
        default = next((c for c in candidates if c.get("default")), None)
        self.default_id = default["id"] if default else None
        self.paths, self.records, self.default_then = [], {}, {}
        ignored = {"other candidates": 0, "failed": 0}
        unchecked = 0
        for src, path in enumerate(paths):
            fpath, recs, notes = read(path)
            self.paths.append(fpath)
            for n in notes:
                say("resume: %s: %s" % (fpath, n))
            for rec in recs:
                cand = by_id.get(rec.get("candidate"))
                if cand is None or rec.get("layout") != cand["layout"] or \
                        (rec.get("knobs") or {}) != (cand.get("knobs") or {}):
                    ignored["other candidates"] += 1
                    continue
                if rec.get("rc") != 0 or not rec.get("score"):
                    ignored["failed"] += 1
                    continue
                theirs = rec.get("settings")
                if theirs is None:
                    unchecked += 1
                else:
                    for k in SETTINGS:
                        then = theirs.get(k, SETTINGS_ABSENT.get(k))
                        if then != settings.get(k):
                            raise TuneError(
                                "resume: %s was measured with %s=%s, this run has %s=%s: its "
                                "measurements are not comparable" % (
                                    fpath, k, json.dumps(then, sort_keys=True), k,
                                    json.dumps(settings.get(k), sort_keys=True)))
                key = (float(rec.get("window_s") or 0), tuple(rec.get("levels") or ()))
                if cand is default:
                    self.default_then.setdefault((src,) + key, rec)
                    continue
                have = self.records.get((rec["candidate"],) + key)
                if have is None or (rec.get("time") or "") >= (have[1].get("time") or ""):
                    self.records[(rec["candidate"],) + key] = (src, rec)
        for why, n in sorted(ignored.items()):
            if n:
                say("resume: %d journal measurement(s) left out (%s): served again if "
                    "this run needs them" % (n, why))
        if unchecked:
            say("resume: %d journal measurement(s) do not record their settings (an older "
                "journal): their profile, lengths and SLO are taken to be this run's" % unchecked)
        self.now = {}       # (window, levels) -> the default's sweep measured in this run
        self.used = []      # [{'candidate', 'from', 'elapsed_s', 'measured_at', 'anchor'}]
        say("resume: %d measurement(s) of %s taken from %s; vLLM's defaults are measured again "
            "as the anchor" % (len(self.records), "candidate" if len(self.records) == 1
                               else "candidates", ", ".join(self.paths)))

    def measured_default(self, window, levels, sweep):
        """The default was measured in this run with ``window`` and ``levels``: the anchor."""
        self.now.setdefault((float(window), tuple(levels)), sweep)

    def recall(self, cand, window, levels):
        """The journals' measurement of ``cand`` at ``window`` and ``levels``, anchored on the
        default (None: serve it): {'levels', 'elapsed_s', 'correctness', 'resumed'}."""
        key = (float(window), tuple(levels))
        hit = self.records.get((cand["id"],) + key)
        if hit is None or cand.get("default"):
            return None
        src, rec = hit
        then, now = self.default_then.get((src,) + key), self.now.get(key)
        anchor = None
        sweep = rec.get("sweep") or []
        if then is not None and now is not None:
            factors = anchor_factors(then.get("sweep"), now)
            t_good = (then.get("score") or {}).get("goodput_tok_s")
            n_good = max([(lv.get("goodput") or {}).get("output_tok_s") or 0.0 for lv in now]
                         or [0.0])
            overall = {"factor": round(n_good / float(t_good), 4) if t_good and n_good else 1.0,
                       "then": t_good, "now": n_good, "rel_half": None}
            sweep = anchored(sweep, factors, overall)
            anchor = {"default": self.default_id, "levels": factors, "overall": overall}
        used = {"candidate": cand["id"], "from": self.paths[src],
                "elapsed_s": rec.get("elapsed_s"), "measured_at": rec.get("time"),
                "anchor": anchor}
        self.used.append(used)
        return {"levels": sweep, "elapsed_s": rec.get("elapsed_s") or 0.0,
                "correctness": rec.get("outputs"), "resumed": used}

    def evidence(self):
        return {"from": self.paths, "candidates": [u["candidate"] for u in self.used],
                "seconds_then": round(sum(u["elapsed_s"] or 0.0 for u in self.used), 1),
                "taken": dict((u["candidate"], {"from": u["from"], "anchor": u["anchor"]})
                              for u in self.used)}
