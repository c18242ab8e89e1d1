"""The tuner (plugins/plugin_utils/tune/tuner.py) before anything is served: settings checked
with the setting named, and the plan (candidates, strategy, refusals) of the real cpu-tiny
profile. Nothing is served here, so ``play`` must not be called."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune.tuner import (
    DEFAULTS, TuneError, Tuner)


def no_play(extravars):
    raise AssertionError("nothing is served while planning: %r" % (extravars,))


def test_plan_of_the_cpu_profile_lists_the_default_first():
    t = Tuner("h1", "cpu-tiny", no_play, slo_class="mlperf-server", budget_candidates=4,
              knobs={"max-num-seqs": [16, 64]})
    plan = t.plan()
    assert plan["host"] == "h1" and plan["strategy"] in ("screen", "halving")
    ids = [c["id"] for c in plan["candidates"]]
    assert plan["candidates"][0]["default"] is True
    assert len(ids) == len(set(ids)) >= 2
    assert plan["slo"]["ttft_ms"] > 0 and plan["budget"]["candidates"] == 4


@pytest.mark.parametrize("settings, message", [
    ({"strategy": "random"}, "strategy 'random' is not one of auto, screen, halving, grid"),
    ({"levels": [0, 2]}, "levels must be positive integers"),
    ({"gpu_count": 2}, "a GPU host needs model_config"),
    ({"budgett_minutes": 3}, "unknown tune setting(s): budgett_minutes"),
    ({"max_rounds": 0}, "max_rounds must be an integer >= 1, got 0"),
    ({"input_len": "512"}, "input_len must be an integer >= 1, got '512'"),
    ({"output_len": True}, "output_len must be an integer >= 1, got True"),
    ({"eta": 1}, "eta must be an integer >= 2, got 1"),
    ({"reference_every": -1, "grid": True}, "reference_every must be an integer >= 0, got -1"),
    ({"min_lifetimes": -2}, "min_lifetimes must be a number >= 0 (0: the window only), got -2"),
    ({"min_lifetimes": "5"}, "min_lifetimes must be a number >= 0 (0: the window only), got '5'"),
    ({"reference_every": 2, "strategy": "screen"},
     "reference_every measures the default between the grid's candidates: it needs strategy "
     "grid, got 'screen'"),
])
def test_bad_settings_are_named(settings, message):
    with pytest.raises(TuneError) as e:
        Tuner("h1", "cpu-tiny", no_play, slo_class="mlperf-server", budget_candidates=4, **settings)
    assert message in str(e.value)


def test_the_api_passes_every_setting_the_tuner_knows():
    import inspect
    import vllm_deploy
    api = set(inspect.signature(vllm_deploy.tune).parameters)
    assert set(DEFAULTS) <= api
    assert api - set(DEFAULTS) == {"inventory", "host", "profile", "plan_only", "report_dir",
                                   "on_event", "log"}


def test_each_measurement_is_journaled_as_it_is_taken(tmp_path):
    """A run stopped before its end keeps what it measured: every measurement, failed ones
    too, is one JSON line in the journal the moment its play returns."""
    journal = tmp_path / "reports" / "measurements.jsonl"
    level = {"concurrency": 2, "output_tok_s": 50.0, "slo": {"met": True},
             "goodput": {"output_tok_s": 48.5},
             "precision": {"output_tok_s": {"value": 50.0, "ci_low": 47.0, "ci_high": 53.0}}}
    answers = [{"rc": 0, "facts": {"vllm_tune_measurement": {"levels": [[level]],
                                                             "measure_s": "0.0"}}},
               {"rc": 2, "facts": {}, "failure": "vllm-main.service did not become ready"}]
    seen = []

    def play(extravars):
        seen.append(extravars["vllm_tune_levels"])
        assert extravars["vllm_tune_min_lifetimes"] == 5  # the default, to the sweep
        return answers[len(seen) - 1]

    t = Tuner("h1", "cpu-tiny", play, journal=str(journal), slo_class="mlperf-server",
              budget_candidates=4, knobs={"max-num-seqs": [16, 64]})
    first, second = t.cands[0], t.cands[1]
    t.measure(first, 4.0, [2])
    lines = journal.read_text().splitlines()
    assert len(lines) == 1  # written before the next candidate is served
    t.measure(second, 4.0, [2])
    import json
    recs = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [r["candidate"] for r in recs] == [first["id"], second["id"]]
    ok, bad = recs
    assert ok["window_s"] == 4.0 and ok["levels"] == [2] and ok["rc"] == 0
    assert ok["score"]["goodput_tok_s"] == 48.5 and ok["score"]["goodput_level"] == 2
    assert ok["sweep"][0]["precision"]["output_tok_s"]["ci_low"] == 47.0
    assert ok["layout"] == first["layout"] and ok["time"].endswith("Z")
    assert bad["rc"] == 2 and "did not become ready" in bad["error"] and bad["score"] is None
    # the play's seconds split: what it spent measuring (the role's own clock), the rest serving
    assert ok["measure_s"] == 0.0 and ok["serve_s"] == ok["elapsed_s"]
    assert "measure_s" not in bad and "serve_s" not in bad



@pytest.mark.parametrize("argv, restores", [([], True), (["--no-restore"], False)])
def test_restore_serves_the_inventory_again_unless_the_cli_says_no_restore(argv, restores):
    """After the search the inventory's configuration is served again (a play that measures
    nothing); `vllm-deploy tune --no-restore` leaves the last candidate serving."""
    from vllm_deploy import cli
    args = cli.build_parser().parse_args(
        ["tune", "-i", "inv.yml", "--host", "h1", "--profile", "cpu-tiny"] + argv)
    assert args.restore is restores
    level = {"concurrency": 2, "output_tok_s": 50.0, "slo": {"met": True},
             "goodput": {"output_tok_s": 48.5}}
    plays = []

    def play(extravars):
        plays.append(extravars)
        if extravars.get("vllm_tune_measure") is False:
            return {"rc": 0, "facts": {}}
        return {"rc": 0, "facts": {"vllm_tune_measurement": {"levels": [[level]],
                                                             "measure_s": "0.0"}}}

    t = Tuner("h1", "cpu-tiny", play, slo_class="mlperf-server", budget_candidates=1,
              levels=[2], restore=args.restore)
    t.run()
    restored = [p for p in plays if p.get("vllm_tune_measure") is False]
    assert len(plays) - len(restored) == 1  # the one candidate, measured
    assert len(restored) == (1 if restores else 0)
    if restores:  # the inventory's own instances: no candidate's instances in the play
        assert "vllm_service_instances" not in restored[0]
        assert restored[0]["vllm_tune_stop_units"] == ["vllm-main.service"]


def _level(c, own, other, other_met, value=None):
    value = value or own
    return {"concurrency": c, "output_tok_s": value, "slo": {"met": True, "breaks": []},
            "goodput": {"output_tok_s": own, "request_s": own / 10.0},
            "precision": {"output_tok_s": {"value": value, "ci_low": value * 0.99,
                                           "ci_high": value * 1.01, "confidence": 0.95}},
            "by_slo": {"mlperf-interactive:llama3.1-8b": {
                "goodput": {"output_tok_s": other, "request_s": other / 10.0},
                "slo": {"met": other_met, "breaks": [] if other_met else ["tpot_ms p99 >"]}}}}


def test_the_same_measurements_are_ranked_under_each_other_slo(tmp_path):
    """--also-slo: the sweep judges every request by the other SLO too (the role gets its
    limits), and the document ranks the same measurements under it, with its own winner and
    its own comparison with vLLM's defaults; the search follows the run's own SLO."""
    seen = []

    def play(extravars):
        if extravars.get("vllm_tune_measure") is False:
            return {"rc": 0, "facts": {}}
        seen.append(extravars)
        insts = extravars["vllm_service_instances"]
        if len(insts) == 1:  # tp1, vLLM's defaults: best under the interactive SLO
            levels = [[_level(1, 100.0, 90.0, True), _level(2, 150.0, 20.0, False)]]
        else:  # 2xtp1: more goodput under the server SLO, less under the interactive one
            levels = [[_level(1, 60.0, 30.0, True), _level(2, 110.0, 5.0, False)]] * 2
        return {"rc": 0, "facts": {"vllm_tune_measurement": {"levels": levels,
                                                             "measure_s": "1.0"}}}

    t = Tuner("h1", "cpu-tiny", play, journal=str(tmp_path / "m.jsonl"),
              slo_class="mlperf-server", also_slos=["mlperf-interactive"], budget_candidates=2,
              levels=[1, 2], grid=True)
    doc, _points, _insts = t.run()
    name = "mlperf-interactive:llama3.1-8b"
    assert all(e["vllm_tune_also_slos"] == {name: {"ttft_ms": 500.0, "tpot_ms": 30.0}}
               for e in seen)
    assert doc["winner"]["id"] == "2xtp1" and doc["winner"]["goodput_tok_s"] == 220.0
    other = doc["other_slos"][name]
    assert other["slo"]["ttft_ms"] == 500.0 and other["slo"]["class"] == name
    ranked = dict((r["id"], r) for r in other["ranked"])
    assert ranked["tp1"]["rank"] == 1 and ranked["tp1"]["goodput_tok_s"] == 90.0
    assert ranked["tp1"]["goodput_level"] == 1 and ranked["tp1"]["highest_level_meeting_slo"] == 1
    assert ranked["2xtp1"]["goodput_tok_s"] == 60.0 and ranked["2xtp1"]["goodput_level"] == 2
    assert other["versus_default"]["verdict"] == "the default is already best"
    assert other["not_judged"] == []
    # the run's own ranking is untouched by the other SLO
    assert doc["versus_default"]["winner"] == "2xtp1" and doc["versus_default"]["verdict"] == "better"


def test_a_measurement_not_judged_by_an_other_slo_is_named_not_ranked():
    from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.tune.ranking import (
        rank_other_slos, score)
    name = "mlperf-interactive:llama3.1-8b"
    judged = [_level(1, 100.0, 90.0, True)]
    old = [dict(judged[0])]
    old[0].pop("by_slo")  # from a journal written without the other SLO
    lay = {"tensor_parallel": 1, "data_parallel": 1, "instances": 1, "expert_parallel": False}
    results = {
        "tp1": {"candidate": {"id": "tp1", "default": True, "layout": lay, "knobs": {}},
                "rounds": [{"window_s": 4.0, "sweep": judged, "score": score(judged)}]},
        "x": {"candidate": {"id": "x", "default": False, "layout": lay,
                            "knobs": {"max-num-seqs": 16}},
              "rounds": [{"window_s": 4.0, "sweep": old, "score": score(old)}]}}
    out = rank_other_slos(results, {name: {"ttft_ms": 500.0, "tpot_ms": 30.0}})[name]
    assert out["not_judged"] == ["x"] and [r["id"] for r in out["ranked"]] == ["tp1"]
    assert out["versus_default"]["verdict"].startswith("nothing to compare")


@pytest.mark.parametrize("also, message", [
    ("mlperf-interactive", "also_slos must be a list of SLO classes"),
    (["mlperf-server"], "also_slos: mlperf-server:llama3.1-8b is already the run's own SLO"),
    (["mlperf-interactive", "mlperf-interactive:llama3.1-8b"],
     "also_slos: mlperf-interactive:llama3.1-8b is already listed"),
    (["custom"], "also_slos: 'custom': only the run's own SLO can be custom"),
    (["mlperf-offline"], "slo_class 'mlperf-offline' is not one of"),
])
def test_bad_other_slos_are_named(also, message):
    with pytest.raises(TuneError) as e:
        Tuner("h1", "cpu-tiny", no_play, slo_class="mlperf-server", budget_candidates=4,
              also_slos=also)
    assert message in str(e.value)


def test_the_cli_passes_each_also_slo():
    from vllm_deploy import cli
    args = cli.build_parser().parse_args(
        ["tune", "-i", "inv.yml", "--host", "h1", "--profile", "cpu-tiny", "--slo",
         "mlperf-interactive", "--also-slo", "mlperf-server", "--also-slo", "mlperf-server:llama2-70b"])
    assert args.also_slo == ["mlperf-server", "mlperf-server:llama2-70b"]
