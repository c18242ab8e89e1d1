"""plugins/plugin_utils/benchmark/record.py: what a sweep's result belongs to, and its fingerprint.

The targets are instances resolved by the collection's own code (vllm_resolve_instances and
vllm_instance_endpoints), as vllm_service publishes them, so a change of profile, override,
argument or environment is seen exactly as the role would see it."""
import pytest

from ansible_collections.vllm_ops.deploy.plugins.filter.sweep import vllm_benchmark_config
from ansible_collections.vllm_ops.deploy.plugins.filter.vllm_instances import (
    vllm_instance_endpoints, vllm_resolve_instances)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.benchmark.record import (
    BenchmarkError, fingerprint, instance_config, public_env)

SWEEP = dict(levels=[1, 2, 4], input_len=128, output_len=128, duration_s=20, slo_ttft_ms=0,
             slo_tpot_ms=0, saturation_threshold=0.1, stop_on_saturation=True,
             chunk_usage=False)
CONTEXT = {"vllm": "0.33.0", "weights_bytes": 230000000000}
DEFAULTS = dict(name="main", port=8000, host="0.0.0.0", profile="minimax-m2.5-tp4",
                profile_overrides={}, model_dir="/srv/models/MiniMax-M2.5", served_model_name="",
                args=[], extra_args=[], env={}, cuda_visible_devices="",
                python="/opt/vllm-deploy/current/bin/python", home="/var/lib/vllm")


def endpoints(instances=(), dirs=None, **over):
    out = vllm_resolve_instances(list(instances), dict(DEFAULTS, **over), dirs, gpu_count=8)
    assert out["errors"] == []
    return vllm_instance_endpoints(out["instances"])


def fp(target, sweep=None, context=None):
    return fingerprint(instance_config(target, sweep or SWEEP, CONTEXT if context is None else context))


def test_switching_profile_with_the_same_served_name_changes_the_fingerprint():
    """The reported bug: minimax-m2.5-tp4 -> minimax-m2.5-tp8-ep serve the same model name;
    the old fingerprint (args, env, sweep settings) did not change, so TP4's results were
    shown as TP8's."""
    [tp4] = endpoints()
    [tp8] = endpoints(profile="minimax-m2.5-tp8-ep")
    assert tp4["model"] == tp8["model"] == "minimax-m2.5"
    assert fp(tp4) != fp(tp8)
    assert instance_config(tp8, SWEEP)["profile_config"]["parallel"]["tensor"] == 8


def test_an_override_or_an_argument_changes_it_the_same_config_does_not():
    [base] = endpoints()
    assert fp(base) == fp(endpoints()[0])  # stable: the same configuration, the same print
    [longer] = endpoints(profile_overrides={"max_model_len": 65536})
    [extra] = endpoints(extra_args=["--max-num-seqs", "64"])
    [envd] = endpoints(env={"VLLM_USE_DEEP_GEMM": "0"})
    prints = {fp(base), fp(longer), fp(extra), fp(envd)}
    assert len(prints) == 4
    assert "--max-num-seqs" in instance_config(extra, SWEEP)["argv"]
    # sweep settings and the vLLM version count too
    assert fp(base, dict(SWEEP, output_len=64)) != fp(base)
    assert fp(base, context=dict(CONTEXT, vllm="0.34.0")) != fp(base)
    # prompt_format: text prompts are another measurement; the default keeps the fingerprint
    # results measured before the setting existed had
    assert fp(base, dict(SWEEP, prompt_format="token_ids")) == fp(base)
    assert fp(base, dict(SWEEP, prompt_format="text")) != fp(base)


def test_each_instance_has_its_own_fingerprint():
    a, b = endpoints([{"name": "a", "port": 8001, "cuda_visible_devices": "0,1,2,3"},
                      {"name": "b", "port": 8002, "cuda_visible_devices": "4,5,6,7"}])
    assert fp(a) != fp(b)
    assert a["profile_config"]["name"] == "minimax-m2.5-tp4" and a["gpus"] == [0, 1, 2, 3]


def test_secret_variables_are_left_out_by_name():
    target = {"name": "main", "model": "m", "argv": ["python", "-m", "x"],
              "env": {"HF_HUB_OFFLINE": "1", "MY_API_KEY": "k1", "WANDB_TOKEN": "t1",
                      "DB_PASSWORD": "p1"}}
    cfg = instance_config(target, SWEEP)
    assert cfg["env"] == {"HF_HUB_OFFLINE": "1"}
    rotated = dict(target, env=dict(target["env"], MY_API_KEY="k2", WANDB_TOKEN="t2"))
    assert fp(target) == fp(rotated)  # a rotated secret does not re-measure
    assert fp(target) != fp(dict(target, env=dict(target["env"], HF_HUB_OFFLINE="0")))
    assert public_env({"TOKENIZERS_PARALLELISM": "false", "X_TOKEN": "s"}) == {
        "TOKENIZERS_PARALLELISM": "false"}


def test_an_endpoint_without_vllm_service_is_known_by_its_url():
    a = {"name": "main", "url": "http://gpu-1:8000", "model": "m"}
    b = dict(a, url="http://gpu-2:8000")
    assert fp(a) != fp(b)


def test_bad_targets_are_refused():
    with pytest.raises(BenchmarkError, match="needs a name"):
        instance_config({"url": "x"}, SWEEP)
    with pytest.raises(BenchmarkError, match="lack levels"):
        instance_config({"name": "x"}, {})
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="env must be a mapping"):
        vllm_benchmark_config({"name": "x", "env": ["A=1"]}, SWEEP)
