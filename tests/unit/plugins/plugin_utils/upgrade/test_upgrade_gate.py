"""The upgrade gate's decision (plugins/plugin_utils/upgrade/gate.py): accept, reject for
speed beyond the noise, a tie inside the noise, reject for correctness or coherence, the
override, the table, the candidate's command line and the history."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.upgrade import gate


def level(c, tok_s, half=None, failed=0):
    lv = {"concurrency": c, "output_tok_s": tok_s, "requests_failed": failed,
          "ttft_ms": {"p50": 10.0}}
    if half is not None:
        lv["precision"] = {"output_tok_s": {"value": tok_s, "ci_low": tok_s - half,
                                            "ci_high": tok_s + half, "confidence": 0.95}}
    return lv


GOOD = {"token_match_rate": 1.0, "prefix_match_rate": 1.0, "exact_match_prompts": 8,
        "prompts": 8, "logprob_gap_max": 0.0, "logprob_gap_mean": 0.0}
BAD = dict(GOOD, token_match_rate=0.25, prefix_match_rate=0.1, exact_match_prompts=0,
           logprob_gap_max=None)
CUR = [level(1, 100.0, 2.0), level(4, 300.0, 6.0)]


def test_same_speed_and_outputs_accepts():
    d = gate.decide([level(1, 99.0, 2.0), level(4, 303.0, 6.0)], CUR, GOOD, {"import": True}, 5, 0.9)
    assert d["accepted"] and d["verdict"] == "accept" and d["reasons"] == []
    assert [r["concurrency"] for r in d["rows"]] == [1, 4]
    assert [r["verdict"] for r in d["rows"]] == ["tie", "tie"]
    assert d["rows"][0]["current"] == {"value": 100.0, "low": pytest.approx(98.0),
                                       "high": pytest.approx(102.0)}


def test_slower_beyond_tolerance_and_noise_rejects_naming_the_level():
    d = gate.decide([level(1, 99.0, 2.0), level(4, 150.0, 5.0)], CUR, GOOD, None, 5, 0.9)
    assert not d["accepted"] and d["verdict"] == "reject"
    assert [r["verdict"] for r in d["rows"]] == ["tie", "worse"]
    assert len(d["reasons"]) == 1 and "concurrency 4 is 50.0%" in d["reasons"][0]
    assert "below the 5.0% tolerance" in d["reasons"][0]


def test_a_drop_inside_the_noise_is_a_tie_not_a_rejection():
    # 8 % slower, but the intervals are +-20 %: not shown beyond the noise
    d = gate.decide([level(1, 92.0, 18.0)], [level(1, 100.0, 20.0)], GOOD, None, 5, 0.9)
    assert d["accepted"] and d["rows"][0]["verdict"] == "tie"
    # the same drop measured precisely is a rejection
    d = gate.decide([level(1, 92.0, 0.5)], [level(1, 100.0, 0.5)], GOOD, None, 5, 0.9)
    assert not d["accepted"] and d["rows"][0]["verdict"] == "worse"


def test_a_speed_rejection_is_marked_speed_only_and_others_are_not():
    slow = gate.decide([level(1, 80.0, 1.0)], [level(1, 100.0, 1.0)], GOOD, None, 5, 0.9)
    assert slow["speed_only"] and not slow["bracketed"]
    wrong = gate.decide([level(1, 80.0, 1.0)], [level(1, 100.0, 1.0)], BAD, None, 5, 0.9)
    assert not wrong["accepted"] and not wrong["speed_only"]
    failed = gate.decide([level(1, 80.0, 1.0, failed=3)], [level(1, 100.0, 1.0)], GOOD, None, 5, 0.9)
    assert not failed["speed_only"]
    ok = gate.decide([level(1, 100.0, 1.0)], [level(1, 100.0, 1.0)], GOOD, None, 5, 0.9)
    assert ok["accepted"] and not ok["speed_only"]


# The H200 acceptance run of 2026-12-04: the same build in two venvs, the current version
# measured first at C=1 552.0 [529.9-574.0] and the candidate after its start 452.7
# [423.9-481.5]: 0.820 [0.764-0.880], a rejection on speed alone.
H200_CUR = [level(1, 552.0, 22.05), level(16, 6200.7, 640.8)]
H200_CAND = [level(1, 452.7, 28.8), level(16, 6247.5, 319.3)]


def test_the_h200_false_rejection_without_the_second_measurement():
    d = gate.decide(H200_CAND, H200_CUR, GOOD, None, 5, 0.9)
    assert not d["accepted"] and d["speed_only"]
    assert [r["verdict"] for r in d["rows"]] == ["worse", "tie"]
    assert d["rows"][0]["ratio"] == pytest.approx(0.820, abs=0.001)


def test_the_current_version_as_slow_afterwards_is_drift_and_accepts():
    # the host slowed down: the current version measured again after the candidate gives
    # 470 tok/s at C=1; the candidate is within the drift of the two current measurements
    after = [level(1, 470.0, 20.0), level(16, 6150.0, 400.0)]
    d = gate.decide(H200_CAND, H200_CUR, GOOD, None, 5, 0.9, current_after_levels=after)
    assert d["accepted"] and d["verdict"] == "accept" and d["bracketed"]
    row = d["rows"][0]
    assert row["verdict"] == "tie"
    assert row["drift_pct"] == pytest.approx(100 * 82.0 / 511.0, abs=0.01)
    assert row["current_after"]["value"] == 470.0
    assert row["ratio"] == pytest.approx(452.7 / 511.0)
    table = gate.render_table(d, "old", "new")
    assert "old again tok/s [95%]" in table and "16.0%" in table
    assert "worse only below both" in table


def test_the_current_version_as_fast_afterwards_confirms_the_rejection():
    after = [level(1, 548.0, 20.0), level(16, 6190.0, 500.0)]
    d = gate.decide(H200_CAND, H200_CUR, GOOD, None, 5, 0.9, current_after_levels=after)
    assert not d["accepted"] and d["bracketed"] and d["speed_only"]
    assert [r["verdict"] for r in d["rows"]] == ["worse", "tie"]
    assert "drift (0.7% between its two measurements)" in d["reasons"][0]


def test_a_candidate_below_one_current_measurement_only_is_a_tie():
    # 460 is far below the first (552) but not below the second (455) beyond the noise
    after = [level(1, 455.0, 5.0)]
    d = gate.decide([level(1, 460.0, 5.0)], [level(1, 552.0, 5.0)], GOOD, None, 5, 0.9,
                    current_after_levels=after)
    assert d["accepted"] and d["rows"][0]["verdict"] == "tie"


def test_a_real_regression_stays_rejected_through_any_plausible_drift():
    # the injected slow step on the H200: 2-3 % of the current speed
    after = [level(1, 480.0, 20.0)]
    d = gate.decide([level(1, 12.1, 0.2)], [level(1, 552.0, 22.0)], GOOD, None, 5, 0.9,
                    current_after_levels=after)
    assert not d["accepted"] and d["rows"][0]["verdict"] == "worse"


def test_a_wide_drift_still_leaves_a_far_slower_candidate_worse():
    # molecule/install's slowed candidate on a loaded 2-core host: the current version measured
    # 510 then 245 tok/s at C=2 (70 % drift) with the scenario's 35 % tolerance; added up, the two
    # bounds left no ratio below them, and the candidate at 16 tok/s (3-7 %) was a tie
    after = [level(2, 245.0, 26.8)]
    d = gate.decide([level(2, 16.2, 1.3)], [level(2, 510.0, 60.6)], GOOD, None, 35, 0.9,
                    current_after_levels=after)
    row = d["rows"][0]
    assert row["drift_pct"] == pytest.approx(100 * 265.0 / 377.5, abs=0.01)
    assert row["verdict"] == "worse" and not d["accepted"]
    # a candidate inside the combined bound stays a tie: 1 - 0.65 x 0.30 = 0.805
    d = gate.decide([level(2, 60.0, 1.0)], [level(2, 510.0, 60.6)], GOOD, None, 35, 0.9,
                    current_after_levels=after)
    assert d["rows"][0]["verdict"] == "tie"


def test_within_tolerance_accepts_even_when_measurably_slower():
    d = gate.decide([level(1, 97.0, 0.2)], [level(1, 100.0, 0.2)], GOOD, None, 5, 0.9)
    assert d["accepted"]


def test_wrong_tokens_reject_whatever_the_speed():
    d = gate.decide([level(1, 150.0, 1.0)], [level(1, 100.0, 1.0)], BAD, None, 5, 0.9)
    assert not d["accepted"] and d["rows"][0]["verdict"] == "better"
    assert d["reasons"] == ["token match rate 0.250 is below 0.900 (greedy prompts, reference = "
                            "the current version's outputs)"]


def test_failed_coherence_check_and_failed_requests_reject():
    d = gate.decide([level(1, 100.0, 1.0, failed=3)], [level(1, 100.0, 1.0)], GOOD,
                    {"flashinfer extras match flashinfer-python": False, "import": True}, 5, 0.9)
    assert not d["accepted"]
    assert d["reasons"] == ["3 requests failed at concurrency 1 on the candidate (0 on the "
                            "current version)",
                            "coherence check failed: flashinfer extras match flashinfer-python"]


def test_override_accepts_and_keeps_the_reasons():
    d = gate.decide([level(1, 40.0, 1.0)], [level(1, 100.0, 1.0)], BAD, None, 5, 0.9, override=True)
    assert d["accepted"] and d["verdict"] == "override" and d["override"]
    assert len(d["reasons"]) == 2
    e = gate.history_entry("vllm-x", {"pin": "x"}, d, [level(1, 40.0)], "window", "2026-12-01T00:00:00Z",
                           previous="vllm-y", downtime_s=42)
    assert e["override"] and e["reasons_overridden"] == d["reasons"]
    assert e["output_tok_s"] == {1: 40.0} and e["downtime_s"] == 42 and e["mode"] == "window"
    # an override of a passing gate is no override
    ok = gate.decide([level(1, 100.0, 1.0)], [level(1, 100.0, 1.0)], GOOD, None, 5, 0.9, override=True)
    assert ok["verdict"] == "accept"
    assert not gate.history_entry("a", {}, ok, [], "beside", "t")["override"]


def test_bare_figures_without_intervals_compare_as_points():
    d = gate.decide([level(1, 90.0)], [level(1, 100.0)], GOOD, None, 5, 0.9)
    assert not d["accepted"] and d["rows"][0]["ratio_ci"] == [pytest.approx(0.9), pytest.approx(0.9)]


def test_no_shared_level_or_no_correctness_is_an_error():
    with pytest.raises(gate.GateError, match="share no level"):
        gate.decide([level(2, 1.0)], [level(1, 1.0)], GOOD)
    with pytest.raises(gate.GateError, match="no correctness"):
        gate.decide([level(1, 1.0)], [level(1, 1.0)], {})


def test_table_shows_both_versions_per_level_with_intervals_and_the_journal():
    d = gate.decide([level(1, 99.0, 2.0), level(4, 150.0, 5.0)], CUR, BAD, {"import": True}, 5, 0.9)
    t = gate.render_table(d, "vllm-old", "vllm-new", "/opt/v/new/vllm-deploy-gate.log", "beside",
                          "both measured in this run")
    lines = t.split("\n")
    assert lines[0].startswith("| conc | vllm-old tok/s [95%]") and "vllm-new tok/s [95%]" in lines[0]
    assert lines[2].startswith("| 1    | 100.0 [98.0-102.0]")
    assert "| 4    | 300.0 [294.0-306.0]" in lines[3] and "150.0 [145.0-155.0]" in lines[3]
    assert "0.500 [" in lines[3] and lines[3].rstrip().endswith("| worse   |")
    assert len(set(len(x) for x in lines[:4])) == 1       # the columns line up
    assert "token match 0.250 (min 0.900)" in t and "logprob gap max - " in t
    assert "coherence: import ok" in t and "mode: beside" in t
    assert "verdict: REJECT; output tok/s at concurrency 4" in t
    assert t.endswith("candidate journal: /opt/v/new/vllm-deploy-gate.log")


def test_candidate_argv_runs_the_new_venv_on_the_spare_port():
    argv = ["/opt/vllm-deploy/current/bin/python", "-m", "vllm.entrypoints.openai.api_server",
            "--model", "/m", "--host", "127.0.0.1", "--port", "8210", "--dtype", "float32"]
    out = gate.candidate_argv(argv, "/opt/vllm-deploy/current", "/opt/vllm-deploy/venvs/new", 8310)
    assert out == ["/opt/vllm-deploy/venvs/new/bin/python"] + argv[1:7] + ["--port", "8310",
                                                                           "--dtype", "float32"]
    assert argv[-3] == "8210"          # the serving instance's argv is not changed
    assert gate.candidate_argv(["/x/bin/vllm"], "/opt/c", "/v", 1) == ["/x/bin/vllm", "--port", "1"]
    with pytest.raises(gate.GateError):
        gate.candidate_argv([], "/opt/c", "/v", 1)


def test_history_replaces_a_pin_accepted_again_and_keeps_the_newest():
    doc = {}
    for i in range(4):
        doc = gate.merge_history(doc, {"pin_id": "p%d" % i}, keep=3)
    assert [p["pin_id"] for p in doc["pins"]] == ["p1", "p2", "p3"]
    doc = gate.merge_history(doc, {"pin_id": "p1", "again": True}, keep=3)
    assert [p["pin_id"] for p in doc["pins"]] == ["p2", "p3", "p1"] and doc["pins"][-1]["again"]


# --- where the candidate runs (auto: beside only when it can get what it needs) -----------
# GPU facts come from the real gpu_facts module replaying nvidia-smi as captured on the lent
# H200 machines (tests/fixtures/nvidia-smi/h200-x1, h200-x2).

def _h200_facts(tmp_path, name):
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "module_utils", "host", "test_gpu_facts.py")
    spec = importlib.util.spec_from_file_location("_gpu_facts_replay", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.run_module(tmp_path, os.path.join(mod.FIX, name), {})
    return out["ansible_facts"]["gpu_facts"]


MAIN_ALL = {"name": "main", "unit": "vllm-main.service", "gpus": None}


def test_auto_on_one_h200_taken_by_an_instance_without_a_gpu_set_chooses_window(tmp_path):
    facts = _h200_facts(tmp_path, "h200-x1")
    assert facts["count"] == 1
    c = gate.choose_mode("auto", [MAIN_ALL], facts)
    assert c["mode"] == "window" and c["gpus"] == ""
    assert "needs 1 GPU(s) and 0 of 1 are free" in c["reason"]
    assert "main (no GPU set: every GPU)" in c["reason"]


def test_auto_on_two_h200_with_the_instance_on_gpu0_puts_the_candidate_on_gpu1(tmp_path):
    facts = _h200_facts(tmp_path, "h200-x2")
    c = gate.choose_mode("auto", [dict(MAIN_ALL, gpus=[0])], facts)
    assert c == {"mode": "beside", "gpus": "1", "reason": "GPUs 1 are used by no instance"}
    # both GPUs declared (two instances, or one without a GPU set): nothing spare
    two = [dict(MAIN_ALL, gpus=[0]), dict(MAIN_ALL, name="b", gpus=[1])]
    assert gate.choose_mode("auto", two, facts)["mode"] == "window"
    assert gate.choose_mode("auto", [MAIN_ALL], facts)["mode"] == "window"


def test_auto_does_not_count_a_gpu_another_process_fills_as_spare(tmp_path):
    facts = _h200_facts(tmp_path, "h200-x2")
    facts["gpus"][1]["memory_used_mib"] = 130000
    c = gate.choose_mode("auto", [dict(MAIN_ALL, gpus=[0])], facts)
    assert c["mode"] == "window" and "busy: 1" in c["reason"]


def test_auto_with_vllm_install_gate_gpus_is_beside_on_those(tmp_path):
    facts = _h200_facts(tmp_path, "h200-x2")
    c = gate.choose_mode("auto", [MAIN_ALL], facts, gate_gpus="1")
    assert c["mode"] == "beside" and c["gpus"] == "1" and "vllm_install_gate_gpus=1" in c["reason"]


def test_auto_without_gpus_weighs_memory():
    cpu = {"present": False, "count": 0, "gpus": []}
    assert gate.choose_mode("auto", [MAIN_ALL], cpu, mem_available_mib=9000,
                            serving_mem_mib=3000)["mode"] == "beside"
    low = gate.choose_mode("auto", [MAIN_ALL], cpu, mem_available_mib=3000, serving_mem_mib=3000)
    assert low["mode"] == "window" and "3000 MiB available < 3600 MiB" in low["reason"]
    unknown = gate.choose_mode("auto", [MAIN_ALL], {}, mem_available_mib=None, serving_mem_mib=None)
    assert unknown["mode"] == "beside" and "not known" in unknown["reason"]


def test_auto_with_the_candidate_port_taken_is_window_and_a_forced_mode_is_kept():
    assert gate.choose_mode("auto", [MAIN_ALL], {}, port_free=False)["mode"] == "window"
    assert gate.choose_mode("beside", [MAIN_ALL], {"count": 1}, gate_gpus="0")["gpus"] == "0"
    assert gate.choose_mode("window", [MAIN_ALL], {})["mode"] == "window"
    with pytest.raises(gate.GateError, match="vllm_install_gate_mode"):
        gate.choose_mode("sleepy", [MAIN_ALL], {})


def test_gate_mode_filter_reads_systemd_and_meminfo_strings():
    from ansible_collections.vllm_ops.deploy.plugins.filter.vllm_upgrade import vllm_upgrade_gate_mode
    cpu = {"count": 0}
    assert vllm_upgrade_gate_mode("auto", [MAIN_ALL], cpu, "", True, "2000", "3000")["mode"] == "window"
    # systemd without memory accounting prints "[not set]": unknown -> beside
    assert vllm_upgrade_gate_mode("auto", [MAIN_ALL], cpu, "", True, "2000", "[not set]")["mode"] == "beside"
