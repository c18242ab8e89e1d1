"""The sweep's typed settings (plugins/module_utils/sweep/settings.py): parameters checked and
typed once, defaults filled in where a parameter is absent or None, unknown names refused, and
the secrets kept out of the settings' repr."""
import dataclasses

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.settings import (
    SweepError, SweepSettings)


def params(**kw):
    p = {"base_url": "http://127.0.0.1:1", "model": "m", "levels": [1, 2], "input_len": 8,
         "output_len": 4, "duration_s": 1.0, "request_timeout_s": 10.0,
         "saturation_threshold": 0.1, "endpoint": "completions"}
    p.update(kw)
    return p


def test_defaults_fill_absent_and_none_parameters():
    s = SweepSettings.from_params(params(processes=None, repeats=None, prompt_format=None))
    assert s.levels == (1, 2)
    assert (s.processes, s.repeats, s.prompt_format, s.stream_transport, s.event_loop) == \
        (1, 1, "token_ids", "native", "auto")
    assert s.stop_on_saturation is True and s.load_generators == ()
    assert s.min_requests is None and s.warmup_requests is None


def test_settings_are_frozen():
    s = SweepSettings.from_params(params())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.levels = (4,)


def test_an_unknown_parameter_is_named():
    with pytest.raises(SweepError, match="unknown sweep parameter\\(s\\): durration_s"):
        SweepSettings.from_params(params(durration_s=3))


def test_a_bad_parameter_is_named_before_typing():
    with pytest.raises(SweepError, match="levels must be positive integers"):
        SweepSettings.from_params(params(levels=[0]))


def test_repr_leaves_the_secrets_out():
    s = SweepSettings.from_params(params(api_key="sk-secret-1", load_generators=[
        {"host": "lg", "port": 26310}], load_generator_authkey="agent-secret-2"))
    assert s.api_key == "sk-secret-1" and s.load_generators == ({"host": "lg", "port": 26310},)
    text = repr(s)
    assert "sk-secret-1" not in text and "agent-secret-2" not in text
    assert "levels=(1, 2)" in text
