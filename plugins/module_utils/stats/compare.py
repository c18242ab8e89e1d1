# -*- coding: utf-8 -*-
"""Noise-aware comparison of two measurements, and the intervals it needs (pure Python, the
standard library only, so it runs on a target host's Python >= 3.9 and on the controller).

Used by the sweep (a confidence interval per level), the autotuner ("a winner must beat the
runner-up by more than the measured spread") and gated upgrades ("the new pin is within a
tolerance of the stored results, beyond the noise").

Python API
----------
A *measurement* is one of:

* a number (no noise known: its interval is the point itself);
* ``{"repeats": [x1, x2, ...]}``: independent repeats of the same figure (mean and its
  t-interval, n - 1 degrees of freedom);
* ``{"value": v, "ci_low": lo, "ci_high": hi, "confidence": 0.95, "df": n}``: a figure with a
  stated two-sided interval (``confidence`` defaults to 0.95, ``df`` to "large", i.e. normal);
  this is the form ``interval()``, ``batch_means_interval()`` and ``bootstrap_interval()``
  return, and what each sweep level carries under ``precision``;
* ``{"value": v, "se": s, "df": n}``: a value with its standard error.

``compare(candidate, baseline, tolerance=0.0, higher_is_better=True, confidence=0.95)``
returns a dict:

* ``ratio``: candidate / baseline (point estimates);
* ``ratio_ci``: ``[low, high]``, the interval of the ratio at ``confidence``, from the two
  relative standard errors combined on the log scale (delta method) with Welch-Satterthwaite
  degrees of freedom;
* ``verdict``: ``better`` when the whole interval lies beyond ``1 + tolerance`` in the good
  direction, ``worse`` when it lies beyond ``1 - tolerance`` in the bad direction, else
  ``tie`` (the difference is within the tolerance or within the noise);
* ``within_tolerance``: the whole interval lies inside ``[1 - tolerance, 1 + tolerance]``
  (equivalence shown, not merely "no difference detected");
* ``noise_pct``: the interval's half-width relative to the ratio, in percent;
* ``reason``: one line that says why.

With ``higher_is_better=False`` (latencies) "better" means a ratio below 1. The rule is the same
for both callers: the autotuner keeps a winner only on ``better`` (tolerance 0 or a margin);
a gated upgrade rejects on ``worse`` with its tolerance (e.g. 0.05 = "more than 5 % slower,
beyond the noise").

``compare_levels(candidate_levels, baseline_levels, metrics=DEFAULT_METRICS, tolerance=...)``
applies ``compare`` to every concurrency both sweeps ran, for each metric (output tok/s,
higher is better; TTFT p50, lower is better), taking each level's repeats (``repeats``, when
run at least twice), else its ``precision`` interval, else the bare number. It returns per-level rows and an
overall verdict: ``worse`` if any row is worse, else ``better`` if any is better, else ``tie``.

``median_interval(values, confidence)`` (distribution-free interval of a median from its
order statistics), ``interval(values, confidence)`` (t-interval of a mean),
``batch_means_interval(values,
batches, confidence)`` (the mean of a time-ordered series with the interval from the means of
consecutive batches, which absorbs autocorrelation) and ``bootstrap_interval(values, statistic,
confidence, resamples, seed)`` (percentile bootstrap of any statistic, e.g. a median) build
measurements from raw data.
"""
from __future__ import annotations

import math
import random
import statistics

VERDICTS = ("better", "worse", "tie")
DEFAULT_CONFIDENCE = 0.95
# metric name -> (path in a sweep level, precision key, higher is better)
DEFAULT_METRICS = (
    ("output_tok_s", ("output_tok_s",), "output_tok_s", True),
    ("ttft_ms_p50", ("ttft_ms", "p50"), "ttft_ms_p50", False),
)


class CompareError(ValueError):
    """A measurement that cannot be compared (not a number, empty repeats, zero baseline)."""


# --- Student's t quantile without scipy ---------------------------------------------------
def _betacf(a, b, x):
    """Continued fraction of the incomplete beta function (Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a, b, x):
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbeta = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(lbeta + a * math.log(x) + b * math.log(1.0 - x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t, df):
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df may be fractional)."""
    if df is None or df == math.inf:
        return statistics.NormalDist().cdf(t)
    x = df / (df + t * t)
    tail = 0.5 * _betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p, df):
    """The ``p`` quantile of Student's t (normal when df is None or infinite)."""
    if not 0.0 < p < 1.0:
        raise CompareError("quantile probability must be in (0, 1), got %r" % (p,))
    z = statistics.NormalDist().inv_cdf(p)
    if df is None or df == math.inf or df > 1e7:
        return z
    if df <= 0:
        raise CompareError("degrees of freedom must be > 0, got %r" % (df,))
    lo, hi = (0.0, max(1.0, abs(z))) if p > 0.5 else (-max(1.0, abs(z)), 0.0)
    while t_cdf(hi, df) < p:
        hi *= 2.0
    while t_cdf(lo, df) > p:
        lo *= 2.0
    for _unused in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, abs(mid)):
            break
    return (lo + hi) / 2.0


def _two_sided(confidence):
    if not 0.0 < confidence < 1.0:
        raise CompareError("confidence must be in (0, 1), got %r" % (confidence,))
    return 1.0 - (1.0 - confidence) / 2.0


# --- building measurements ------------------------------------------------------------------
def _finish(value, se, df, confidence, n, method):
    half = 0.0 if se == 0 else t_quantile(_two_sided(confidence), df) * se
    return {"value": value, "ci_low": value - half, "ci_high": value + half,
            "half_width_pct": (100.0 * half / abs(value)) if value else None,
            "confidence": confidence, "se": se, "df": df, "n": n, "method": method}


def _numbers(values, what):
    out = []
    for v in values or ():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise CompareError("%s must be numbers, got %r" % (what, v))
        out.append(float(v))
    return out


def interval(values, confidence=DEFAULT_CONFIDENCE, method="repeats"):
    """Mean of independent values with its t-interval (n - 1 degrees of freedom)."""
    xs = _numbers(values, "repeats")
    if not xs:
        raise CompareError("no values to build an interval from")
    mean = statistics.fmean(xs)
    if len(xs) == 1:  # one value: no spread known
        return _finish(mean, 0.0, None, confidence, 1, method + " (single value: no spread)")
    se = statistics.stdev(xs) / math.sqrt(len(xs))
    return _finish(mean, se, len(xs) - 1, confidence, len(xs), method)


def batch_means_interval(values, batches=10, confidence=DEFAULT_CONFIDENCE):
    """The mean of a time-ordered series (e.g. per-second token counts) with the interval of
    the method of batch means: the series is cut into ``batches`` consecutive batches of
    equal length (the remainder at the end is dropped) and the batch means are treated as
    independent repeats. Needs at least two batches of one value each."""
    xs = _numbers(values, "series values")
    k = min(int(batches), len(xs))
    if k < 2:
        raise CompareError("batch means need at least 2 values, got %d" % len(xs))
    size = len(xs) // k
    means = [statistics.fmean(xs[i * size:(i + 1) * size]) for i in range(k)]
    out = interval(means, confidence, method="batch means (%d x %d)" % (k, size))
    out["value"] = statistics.fmean(xs[:k * size])
    return out


def bootstrap_interval(values, statistic=statistics.median, confidence=DEFAULT_CONFIDENCE,
                       resamples=1000, seed=0):
    """Percentile bootstrap of ``statistic`` over ``values`` (independent samples, e.g. the
    TTFTs of a level's requests); ``seed`` makes it reproducible."""
    xs = _numbers(values, "samples")
    if len(xs) < 2:
        raise CompareError("a bootstrap needs at least 2 samples, got %d" % len(xs))
    rng = random.Random(seed)
    n = len(xs)
    stats = sorted(statistic([xs[rng.randrange(n)] for _unused in range(n)])
                   for _unused in range(int(resamples)))
    alpha = (1.0 - confidence) / 2.0
    lo = stats[max(0, int(math.floor(alpha * (len(stats) - 1))))]
    hi = stats[min(len(stats) - 1, int(math.ceil((1.0 - alpha) * (len(stats) - 1))))]
    value = statistic(xs)
    z = t_quantile(_two_sided(confidence), None)
    se = (hi - lo) / (2.0 * z)
    return {"value": value, "ci_low": lo, "ci_high": hi,
            "half_width_pct": (100.0 * (hi - lo) / 2.0 / abs(value)) if value else None,
            "confidence": confidence, "se": se, "df": None, "n": n,
            "method": "bootstrap (%d resamples)" % int(resamples)}


def median_interval(values, confidence=DEFAULT_CONFIDENCE):
    """The median of independent samples with its distribution-free interval: the order
    statistics at ranks n/2 -+ z * sqrt(n) / 2 (the normal approximation of the binomial
    count of samples below the median). Cheap (one sort), so a running level can check it."""
    xs = sorted(_numbers(values, "samples"))
    n = len(xs)
    if n < 2:
        raise CompareError("a median interval needs at least 2 samples, got %d" % n)
    z = t_quantile(_two_sided(confidence), None)
    half = z * math.sqrt(n) / 2.0
    lo = xs[max(0, int(math.floor(n / 2.0 - half)) - 1)] if n / 2.0 - half >= 1 else xs[0]
    hi = xs[min(n - 1, int(math.ceil(n / 2.0 + half)))]
    value = statistics.median(xs)
    return {"value": value, "ci_low": min(lo, value), "ci_high": max(hi, value),
            "half_width_pct": (100.0 * (hi - lo) / 2.0 / abs(value)) if value else None,
            "confidence": confidence, "se": (hi - lo) / (2.0 * z), "df": None, "n": n,
            "method": "order statistics of the median"}


# --- comparing ------------------------------------------------------------------------------
def normalize(m, confidence=DEFAULT_CONFIDENCE):
    """(value, standard error, degrees of freedom) of a measurement (see the module doc)."""
    if isinstance(m, bool):
        raise CompareError("a measurement must be a number or a dict, got %r" % (m,))
    if isinstance(m, (int, float)):
        return float(m), 0.0, None
    if not isinstance(m, dict):
        raise CompareError("a measurement must be a number or a dict, got %r" % (m,))
    if m.get("repeats") is not None:
        iv = interval(m["repeats"], confidence)
        return iv["value"], iv["se"], iv["df"]
    if m.get("value") is None:
        raise CompareError("a measurement dict needs 'value' or 'repeats': %r" % (m,))
    value = float(m["value"])
    df = m.get("df")
    if m.get("se") is not None:
        return value, float(m["se"]), df
    if m.get("ci_low") is not None and m.get("ci_high") is not None:
        lo, hi = float(m["ci_low"]), float(m["ci_high"])
        if lo > hi:
            raise CompareError("ci_low %r is above ci_high %r" % (lo, hi))
        if hi == lo:
            return value, 0.0, df
        q = t_quantile(_two_sided(float(m.get("confidence") or DEFAULT_CONFIDENCE)), df)
        return value, (hi - lo) / (2.0 * q), df
    return value, 0.0, None


def compare(candidate, baseline, tolerance=0.0, higher_is_better=True,
            confidence=DEFAULT_CONFIDENCE):
    """Compare two measurements of one figure; see the module documentation."""
    if tolerance is None or tolerance < 0 or tolerance >= 1:
        raise CompareError("tolerance must be in [0, 1), got %r" % (tolerance,))
    cv, cse, cdf = normalize(candidate, confidence)
    bv, bse, bdf = normalize(baseline, confidence)
    if cv <= 0 or bv <= 0:
        raise CompareError("ratios need positive values, got candidate %r, baseline %r"
                           % (cv, bv))
    ratio = cv / bv
    rc, rb = cse / cv, bse / bv  # relative standard errors = standard errors of the logs
    var = rc * rc + rb * rb
    if var == 0:
        lo = hi = ratio
        df = None
    else:
        # Welch-Satterthwaite; a side with no df (normal, or no noise) counts as infinite
        den = sum((r ** 4) / d for r, d in ((rc, cdf), (rb, bdf)) if r > 0 and d)
        df = (var * var / den) if den > 0 else None
        half = t_quantile(_two_sided(confidence), df) * math.sqrt(var)
        lo, hi = ratio * math.exp(-half), ratio * math.exp(half)
    good_lo, good_hi = (lo, hi) if higher_is_better else (1.0 / hi, 1.0 / lo)
    # good_* is the interval of "how much better" (> 1 is better) whatever the direction
    if good_lo > 1.0 + tolerance:
        verdict = "better"
    elif good_hi < 1.0 - tolerance:
        verdict = "worse"
    else:
        verdict = "tie"
    within = (1.0 - tolerance) <= good_lo and good_hi <= (1.0 + tolerance)
    noise = 100.0 * (hi - lo) / 2.0 / ratio
    band = "+-%.1f %%" % (100.0 * tolerance) if tolerance else "no tolerance"
    if verdict == "tie":
        why = ("ratio %.3f, interval [%.3f, %.3f] at %g %% confidence overlaps 1 %s: "
               "a tie within %s" % (ratio, lo, hi, 100 * confidence, band,
                                    "the tolerance" if within else "the noise"))
    else:
        why = ("ratio %.3f, interval [%.3f, %.3f] at %g %% confidence lies beyond 1 %s: %s"
               % (ratio, lo, hi, 100 * confidence, band, verdict))
    return {"ratio": ratio, "ratio_ci": [lo, hi], "verdict": verdict,
            "within_tolerance": within, "noise_pct": noise, "tolerance": tolerance,
            "higher_is_better": bool(higher_is_better), "confidence": confidence,
            "df": df, "reason": why}


def _dig(level, path):
    x = level
    for key in path:
        if not isinstance(x, dict):
            return None
        x = x.get(key)
    return x


def level_measurement(level, path, precision_key):
    """A sweep level's figure as a measurement: its ``repeats`` values when it was run at
    least twice (the spread across runs includes drift between them), else its
    ``precision`` interval (from the request log of one run), else the bare number (None
    when the level lacks the figure)."""
    reps = [x for x in ((level.get("repeats") or {}).get(precision_key) or ()) if x is not None]
    if len(reps) >= 2:
        return {"repeats": reps}
    prec = (level.get("precision") or {}).get(precision_key)
    if isinstance(prec, dict) and prec.get("value") is not None:
        return prec
    return _dig(level, path)


def compare_levels(candidate_levels, baseline_levels, metrics=DEFAULT_METRICS, tolerance=0.0,
                   confidence=DEFAULT_CONFIDENCE):
    """Compare two sweeps level by level (the concurrencies both ran); see the module doc.
    ``tolerance`` is one fraction for every metric or a dict metric name -> fraction."""
    base = dict((lv["concurrency"], lv) for lv in baseline_levels)
    rows = []
    for lv in candidate_levels:
        c = lv["concurrency"]
        if c not in base:
            continue
        for name, path, key, higher in metrics:
            cm, bm = level_measurement(lv, path, key), level_measurement(base[c], path, key)
            if cm is None or bm is None:
                continue
            tol = tolerance.get(name, 0.0) if isinstance(tolerance, dict) else tolerance
            row = compare(cm, bm, tol, higher, confidence)
            row.update(concurrency=c, metric=name)
            rows.append(row)
    verdicts = set(r["verdict"] for r in rows)
    overall = "worse" if "worse" in verdicts else ("better" if "better" in verdicts else "tie")
    return {"rows": rows, "verdict": overall if rows else None,
            "levels": sorted(set(r["concurrency"] for r in rows))}
