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
