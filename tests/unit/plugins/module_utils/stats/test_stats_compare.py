"""sweep_compare: the t quantiles, the intervals and the verdict boundaries that the autotuner
(winner beyond the runner-up's noise) and gated upgrades (within a tolerance beyond noise)
decide with."""
import math
import statistics

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats.compare import (
    CompareError, batch_means_interval, bootstrap_interval, compare, compare_levels,
    interval, normalize, t_cdf, t_quantile)


@pytest.mark.parametrize("df,q", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (10, 2.2281),
                                  (30, 2.0423), (None, 1.95996)])
def test_t_quantile_matches_tables(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=2e-4)
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=2e-4)


def test_fractional_degrees_of_freedom_lie_between_their_neighbours():
    assert t_quantile(0.975, 3) < t_quantile(0.975, 2.5) < t_quantile(0.975, 2)


def test_t_cdf_is_symmetric_and_inverts_the_quantile():
    for df in (1, 3, 7.5, 50):
        assert t_cdf(0.0, df) == pytest.approx(0.5)
        for p in (0.6, 0.9, 0.995):
            assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_interval_of_repeats_is_the_t_interval():
    xs = [100.0, 102.0, 98.0, 101.0, 99.0]
    iv = interval(xs)
    se = statistics.stdev(xs) / math.sqrt(5)
    assert iv["value"] == 100.0 and iv["df"] == 4 and iv["n"] == 5
    assert iv["ci_high"] - 100.0 == pytest.approx(2.7764 * se, rel=1e-4)
    assert iv["half_width_pct"] == pytest.approx(2.7764 * se, rel=1e-4)
    single = interval([5.0])
    assert single["ci_low"] == single["ci_high"] == 5.0 and "no spread" in single["method"]
    with pytest.raises(CompareError):
        interval([])
    with pytest.raises(CompareError):
        interval([1.0, "x"])


def test_batch_means_use_consecutive_batches():
    # a trend inside each half: batch means see the halves, not the per-value noise
    xs = [10.0] * 5 + [20.0] * 5
    iv = batch_means_interval(xs, batches=2)
    assert iv["value"] == 15.0 and iv["n"] == 2 and iv["df"] == 1
    assert iv["se"] == pytest.approx(5.0)
    # the remainder is dropped: 11 values in 5 batches of 2
    iv = batch_means_interval(list(range(11)), batches=5)
    assert iv["value"] == pytest.approx(4.5) and "5 x 2" in iv["method"]
    with pytest.raises(CompareError):
        batch_means_interval([1.0], batches=4)


def test_bootstrap_of_the_median_is_reproducible_and_brackets_it():
    xs = [float(x) for x in range(1, 102)]
    a = bootstrap_interval(xs, seed=7)
    b = bootstrap_interval(xs, seed=7)
    assert a == b and a["value"] == 51.0
    assert a["ci_low"] < 51.0 < a["ci_high"]
    assert 40 < a["ci_low"] and a["ci_high"] < 62
    const = bootstrap_interval([3.0] * 20)
    assert const["ci_low"] == const["ci_high"] == 3.0 and const["se"] == 0


def test_normalize_accepts_every_documented_form():
    assert normalize(7) == (7.0, 0.0, None)
    v, se, df = normalize({"value": 10.0, "ci_low": 9.0, "ci_high": 11.0})
    assert v == 10.0 and se == pytest.approx(1.0 / 1.95996, rel=1e-4) and df is None
    v, se, df = normalize({"value": 10.0, "ci_low": 9.0, "ci_high": 11.0, "df": 4,
                           "confidence": 0.95})
    assert se == pytest.approx(1.0 / 2.7764, rel=1e-4) and df == 4
    assert normalize({"value": 3.0, "se": 0.5, "df": 9}) == (3.0, 0.5, 9)
    v, se, df = normalize({"repeats": [1.0, 3.0]})
    assert v == 2.0 and se == pytest.approx(1.0) and df == 1
    for bad in (True, "12", None, {"ci_low": 1}, {"value": 1, "ci_low": 3, "ci_high": 2}):
        with pytest.raises(CompareError):
            normalize(bad)


def test_without_noise_the_tolerance_alone_decides():
    assert compare(105.0, 100.0)["verdict"] == "better"
    assert compare(95.0, 100.0)["verdict"] == "worse"
    assert compare(100.0, 100.0)["verdict"] == "tie"
    # tolerance band: strictly beyond 1 +- tolerance
    assert compare(104.9, 100.0, tolerance=0.05)["verdict"] == "tie"
    assert compare(105.1, 100.0, tolerance=0.05)["verdict"] == "better"
    assert compare(95.1, 100.0, tolerance=0.05)["verdict"] == "tie"
    assert compare(94.9, 100.0, tolerance=0.05)["verdict"] == "worse"
    r = compare(102.0, 100.0, tolerance=0.05)
    assert r["within_tolerance"] is True and r["ratio_ci"] == [r["ratio"], r["ratio"]]


def _iv(value, half_pct):
    return {"value": value, "ci_low": value * (1 - half_pct / 100.0),
            "ci_high": value * (1 + half_pct / 100.0)}


def test_a_gain_inside_the_noise_is_a_tie_and_beyond_it_a_win():
    """The tuner's rule: the winner must beat the runner-up by more than the measured spread."""
    # 4 % faster, each side +-2 % (95 %): the ratio's interval is about +-2.8 %: better
    r = compare(_iv(104.0, 2.0), _iv(100.0, 2.0))
    assert r["verdict"] == "better", r["reason"]
    assert r["ratio_ci"][0] > 1.0 and r["noise_pct"] == pytest.approx(2.83, abs=0.05)
    # 2 % faster with the same noise: the interval straddles 1: a tie within the noise
    r = compare(_iv(102.0, 2.0), _iv(100.0, 2.0))
    assert r["verdict"] == "tie" and "noise" in r["reason"] and r["within_tolerance"] is False
    # the boundary: ratio interval low end just above / below 1
    assert compare(_iv(102.9, 2.0), _iv(100.0, 2.0))["verdict"] == "better"
    assert compare(_iv(102.7, 2.0), _iv(100.0, 2.0))["verdict"] == "tie"


def test_a_gated_upgrade_is_worse_only_beyond_tolerance_and_noise():
    """The upgrade gate's rule: reject when the new pin is slower by more than the tolerance, beyond
    the noise; a slowdown inside tolerance + noise is accepted (tie)."""
    old = {"repeats": [1000.0, 1010.0, 990.0]}
    assert compare({"repeats": [940.0, 945.0, 935.0]}, old, tolerance=0.05)["verdict"] == "tie"
    assert compare({"repeats": [900.0, 905.0, 895.0]}, old, tolerance=0.05)["verdict"] == "worse"
    # a noisy candidate whose mean is 8 % slower is not condemned by noise alone
    r = compare({"repeats": [800.0, 1050.0, 910.0]}, old, tolerance=0.05)
    assert r["verdict"] == "tie" and r["df"] > 1


def test_latencies_are_better_when_lower():
    r = compare(90.0, 100.0, higher_is_better=False)
    assert r["verdict"] == "better" and r["ratio"] == pytest.approx(0.9)
    assert compare(110.0, 100.0, higher_is_better=False)["verdict"] == "worse"
    # 3 % lower at +-2 % each (ratio +-2.8 %): better; 2 % lower: a tie within the noise
    assert compare(_iv(97.0, 2.0), _iv(100.0, 2.0), higher_is_better=False)["verdict"] == "better"
    assert compare(_iv(98.0, 2.0), _iv(100.0, 2.0), higher_is_better=False)["verdict"] == "tie"


def test_welch_degrees_of_freedom_widen_small_samples():
    # the same standard errors, fewer repeats: a wider interval
    few = compare({"value": 105.0, "se": 1.5, "df": 2}, {"value": 100.0, "se": 1.5, "df": 2})
    many = compare({"value": 105.0, "se": 1.5, "df": 200}, {"value": 100.0, "se": 1.5, "df": 200})
    assert few["df"] == pytest.approx(4.0, rel=0.01)
    assert few["ratio_ci"][1] - few["ratio_ci"][0] > many["ratio_ci"][1] - many["ratio_ci"][0]
    assert few["verdict"] == "tie" and many["verdict"] == "better"


def test_bad_comparisons_are_refused():
    for bad in ({"tolerance": -0.1}, {"tolerance": 1.0}, {"confidence": 1.0}):
        with pytest.raises(CompareError):
            compare(_iv(1.0, 1.0), _iv(1.0, 1.0), **bad)
    with pytest.raises(CompareError):
        compare(0.0, 1.0)


def test_compare_levels_takes_precision_then_repeats_then_the_number():
    base = [{"concurrency": 1, "output_tok_s": 100.0, "ttft_ms": {"p50": 50.0},
             "precision": {"output_tok_s": _iv(100.0, 1.0)}},
            {"concurrency": 4, "output_tok_s": 300.0, "ttft_ms": {"p50": 60.0},
             "repeats": {"output_tok_s": [300.0, 303.0, 297.0]}},
            {"concurrency": 8, "output_tok_s": 500.0, "ttft_ms": {"p50": 70.0}}]
    cand = [{"concurrency": 1, "output_tok_s": 101.0, "ttft_ms": {"p50": 50.5},
             "precision": {"output_tok_s": _iv(101.0, 1.0)}},
            {"concurrency": 4, "output_tok_s": 250.0, "ttft_ms": {"p50": 60.0},
             "repeats": {"output_tok_s": [250.0, 252.0, 248.0]}},
            {"concurrency": 16, "output_tok_s": 900.0, "ttft_ms": {"p50": 90.0}}]
    out = compare_levels(cand, base, tolerance={"output_tok_s": 0.05, "ttft_ms_p50": 0.05})
    assert out["levels"] == [1, 4]  # 8 and 16 were not run by both
    rows = dict(((r["concurrency"], r["metric"]), r) for r in out["rows"])
    assert rows[(1, "output_tok_s")]["verdict"] == "tie"
    assert rows[(4, "output_tok_s")]["verdict"] == "worse"
    assert rows[(4, "ttft_ms_p50")]["verdict"] == "tie"
    assert rows[(1, "ttft_ms_p50")]["higher_is_better"] is False
    assert out["verdict"] == "worse"
    assert compare_levels(cand[:1], base[:1], tolerance=0.05)["verdict"] == "tie"
    assert compare_levels([], base)["verdict"] is None


def test_median_interval_uses_order_statistics():
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.stats.compare import (
        median_interval)
    xs = [float(x) for x in range(1, 101)]  # median 50.5; ranks 50 -+ 9.8
    iv = median_interval(xs)
    assert iv["value"] == 50.5 and iv["n"] == 100
    assert iv["ci_low"] == 40.0 and iv["ci_high"] == 61.0
    assert median_interval([2.0, 2.0, 2.0])["half_width_pct"] == 0.0
    small = median_interval([1.0, 2.0, 3.0])
    assert small["ci_low"] == 1.0 and small["ci_high"] == 3.0
    with pytest.raises(CompareError):
        median_interval([1.0])
