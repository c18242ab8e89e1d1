"""Unit tests for plugins/plugin_utils/service/instances.py: several instances per host and the
refusals (ports, GPU sets, parallel sizes, unknown profile, model limit), with numbers."""
import pytest
import yaml

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.instances import (
    gpu_memory_mib, model_max_len, parse_gpu_set, resolve_instances)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profiles import known_profiles

PROFILES = {}
for _name, _path in known_profiles().items():
    with open(_path) as _f:
        PROFILES[_name] = yaml.safe_load(_f)

DEFAULTS = dict(name="main", port=8000, host="0.0.0.0", profile="", profile_overrides={},
                model_dir="/srv/models/m", served_model_name="", args=[], extra_args=[],
                env={}, cuda_visible_devices="", python="/opt/v/bin/python",
                home="/var/lib/vllm")


def defaults(**kw):
    d = dict(DEFAULTS)
    d.update(kw)
    return d


def test_empty_list_gives_one_instance_from_the_defaults():
    insts, errors = resolve_instances([], defaults(profile="cpu-tiny", port=8201), PROFILES)
    assert errors == []
    [i] = insts
    assert i["unit"] == "vllm-main.service"
    assert i["served_model_name"] == "tiny-llama"
    assert i["argv"][:3] == ["/opt/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert i["argv"][i["argv"].index("--port") + 1] == "8201"
    assert i["url"] == "http://127.0.0.1:8201"
    assert i["gpu_required"] is False and i["gpus"] is None
    assert "CUDA_VISIBLE_DEVICES" not in i["env"]


def test_no_profile_plain_argv_and_served_name_from_dir():
    [i], errors = resolve_instances([], defaults(args=["--max-model-len", "4096"]), PROFILES)
    assert errors == []
    assert i["served_model_name"] == "m"
    assert i["argv"][-2:] == ["--max-model-len", "4096"]
    assert i["max_model_len"] == 4096


def test_two_tp4_instances_on_eight_gpus():
    insts, errors = resolve_instances(
        [{"name": "a", "port": 8001, "cuda_visible_devices": "0,1,2,3"},
         {"name": "b", "port": 8002, "cuda_visible_devices": "4,5,6,7",
          "served_model_name": "m-b"}],
        defaults(profile="minimax-m2.5-tp4"), PROFILES, gpu_count=8)
    assert errors == []
    assert [i["unit"] for i in insts] == ["vllm-a.service", "vllm-b.service"]
    assert [i["env"]["CUDA_VISIBLE_DEVICES"] for i in insts] == ["0,1,2,3", "4,5,6,7"]
    assert insts[1]["served_model_name"] == "m-b"
    assert all(i["env"]["SAFETENSORS_FAST_GPU"] == "1" for i in insts)
    assert all(i["world_size"] == 4 for i in insts)


def test_overlapping_gpu_sets_refused_with_the_gpus():
    _unused, errors = resolve_instances(
        [{"name": "a", "port": 8001, "cuda_visible_devices": "0,1,2,3"},
         {"name": "b", "port": 8002, "cuda_visible_devices": "3,4,5,6"}],
        defaults(profile="minimax-m2.5-tp4"), PROFILES, gpu_count=8)
    assert errors == ["instances a (GPUs 0,1,2,3) and b (GPUs 3,4,5,6) share GPU 3"]


def test_gpu_instance_without_a_set_overlaps_any_other():
    _unused, errors = resolve_instances(
        [{"name": "a", "port": 8001}, {"name": "b", "port": 8002, "cuda_visible_devices": "4,5,6,7"}],
        defaults(profile="minimax-m2.5-tp4"), PROFILES, gpu_count=8)
    assert len(errors) == 1 and "a sets no cuda_visible_devices" in errors[0]


def test_cpu_instances_may_share_the_host_without_gpu_sets():
    insts, errors = resolve_instances(
        [{"name": "one", "port": 8220}, {"name": "two", "port": 8221}],
        defaults(profile="cpu-tiny"), PROFILES, gpu_count=0)
    assert errors == [] and len(insts) == 2


def test_same_port_refused():
    _unused, errors = resolve_instances(
        [{"name": "one", "port": 8220}, {"name": "two", "port": 8220}],
        defaults(profile="cpu-tiny"), PROFILES)
    assert errors == ["instances one and two both use port 8220; give each its own port"]


def test_same_name_refused():
    _unused, errors = resolve_instances(
        [{"name": "one", "port": 8220}, {"name": "one", "port": 8221}],
        defaults(profile="cpu-tiny"), PROFILES)
    assert len(errors) == 1 and "same name" in errors[0]


def test_parallel_above_the_gpu_set():
    _unused, errors = resolve_instances(
        [{"name": "a", "port": 8001, "cuda_visible_devices": "0,1"}],
        defaults(profile="minimax-m2.5-tp4"), PROFILES, gpu_count=8)
    assert errors == ["instance a (profile minimax-m2.5-tp4): tensor 4 x pipeline 1 x data 1 = "
                      "4 GPUs but cuda_visible_devices 0,1 gives it 2"]


def test_parallel_above_the_host():
    _unused, errors = resolve_instances([], defaults(profile="kimi-k2.5-nvfp4-tp8"), PROFILES,
                                        gpu_count=4)
    assert errors == ["instance main (profile kimi-k2.5-nvfp4-tp8): tensor 8 x pipeline 1 x "
                      "data 1 = 8 GPUs but the host has 4 GPUs"]
    _unused, errors = resolve_instances(
        [], defaults(profile="minimax-m2.5-tp4",
                     profile_overrides={"parallel": {"data": 2}, "gpu": {"min_count": 8}}),
        PROFILES, gpu_count=4)
    assert errors == ["instance main (profile minimax-m2.5-tp4): tensor 4 x pipeline 1 x "
                      "data 2 = 8 GPUs but the host has 4 GPUs"]


def test_gpu_profile_on_a_host_without_gpus():
    _unused, errors = resolve_instances([], defaults(profile="minimax-m2.5-tp4"), PROFILES,
                                        gpu_count=0)
    assert errors == ["instance main (profile minimax-m2.5-tp4) needs tensor 4 x pipeline 1 x "
                      "data 1 = 4 GPUs but the host has no GPU"]


def test_gpu_index_the_host_lacks():
    _unused, errors = resolve_instances(
        [{"name": "a", "port": 8001, "cuda_visible_devices": "4,5,6,7"}],
        defaults(profile="minimax-m2.5-tp4"), PROFILES, gpu_count=6)
    assert errors == ["instance a (profile minimax-m2.5-tp4): cuda_visible_devices 4,5,6,7 "
                      "names GPU 6,7 but the host has 6 GPUs (0..5)"]


def test_unknown_profile_lists_the_known():
    _unused, errors = resolve_instances([], defaults(profile="llama-9000"), PROFILES)
    assert len(errors) == 1
    assert "unknown vllm_service profile 'llama-9000'" in errors[0]
    assert "cpu-tiny" in errors[0] and "minimax-m2.5-tp4" in errors[0]


def test_max_model_len_above_the_model_limit():
    _unused, errors = resolve_instances(
        [], defaults(profile="cpu-tiny", model_dir="/srv/models/tiny",
                     profile_overrides={"max_model_len": 4096}),
        PROFILES, model_limits={"/srv/models/tiny": 2048})
    assert errors == ["instance main: max_model_len 4096 is above the model's limit 2048 "
                      "(derived from /srv/models/tiny/config.json as vLLM derives it; "
                      "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the instance's env lifts the limit)"]
    _unused, errors = resolve_instances(
        [], defaults(profile="cpu-tiny", model_dir="/srv/models/tiny"),
        PROFILES, model_limits={"/srv/models/tiny": 2048})
    assert errors == []


def test_all_errors_reported_at_once():
    _unused, errors = resolve_instances(
        [{"name": "a", "port": 8001, "cuda_visible_devices": "0,1,2,3"},
         {"name": "b", "port": 8001, "cuda_visible_devices": "2,3"}],
        defaults(profile="minimax-m2.5-tp4"), PROFILES, gpu_count=8)
    assert len(errors) == 3  # port, b's 4 GPUs on a 2-GPU set, the shared GPUs 2,3


def test_bad_entries():
    _unused, errors = resolve_instances([{"name": "a"}], defaults(), PROFILES)
    assert errors == ["vllm_service_instances[0]: port required"]
    _unused, errors = resolve_instances([{"name": "a", "port": 1, "gpus": "0"}], defaults(), PROFILES)
    assert "unknown keys gpus" in errors[0]
    _unused, errors = resolve_instances([{"name": "A b", "port": 1}], defaults(), PROFILES)
    assert "name must match" in errors[0]
    _unused, errors = resolve_instances([{"name": "a", "port": 70000}], defaults(), PROFILES)
    assert errors == ["instance a: port 70000 (vllm_service_instances[0].port) is outside 1..65535"]
    # the single instance of the role's own variables: those are named
    _unused, errors = resolve_instances([], dict(defaults(), port=-7), PROFILES)
    assert errors == ["instance %s: port -7 (vllm_service_port) is outside 1..65535" % defaults()["name"]]
    _unused, errors = resolve_instances([], dict(defaults(), model_dir=""), PROFILES)
    assert errors == ["instance %s: model_dir '' (vllm_service_model_dir) must be an absolute path "
                      "on the host" % defaults()["name"]]
    _unused, errors = resolve_instances([{"name": "a", "port": 1, "cuda_visible_devices": "0,0"}],
                                        defaults(), PROFILES)
    assert "GPU 0 is listed twice" in errors[0]
    _unused, errors = resolve_instances("nope", defaults(), PROFILES)
    assert "must be a list" in errors[0]


def test_secrets_and_conflicting_flags_refused():
    _unused, errors = resolve_instances([{"name": "a", "port": 1, "args": ["--api-key", "x"]}],
                                        defaults(profile="cpu-tiny"), PROFILES)
    assert "--api-key" in errors[0]
    _unused, errors = resolve_instances([{"name": "a", "port": 1, "env": {"HF_TOKEN": "x"}}],
                                        defaults(profile="cpu-tiny"), PROFILES)
    assert "looks like a secret" in errors[0]
    _unused, errors = resolve_instances([{"name": "a", "port": 1, "extra_args": ["--dtype", "bfloat16"]}],
                                        defaults(profile="cpu-tiny"), PROFILES)
    assert "--dtype" in errors[0] and "float32" in errors[0]


def test_parse_gpu_set_and_limits():
    assert parse_gpu_set("") is None and parse_gpu_set(None) is None
    assert parse_gpu_set(" 4, 5,6 ,7") == [4, 5, 6, 7]
    with pytest.raises(ValueError):
        parse_gpu_set("0,a")
    assert model_max_len({"max_position_embeddings": 2048}) == 2048
    assert model_max_len({"text_config": {"max_position_embeddings": 262144},
                          "max_position_embeddings": 1}) == 262144
    assert model_max_len({}) is None


def test_gpu_memory_of_the_set():
    facts = {"count": 3, "gpus": [{"index": 0, "memory_total_mib": 97887},
                                  {"index": 1, "memory_total_mib": 81559},
                                  {"index": 2, "memory_total_mib": 97887}]}
    assert gpu_memory_mib(facts) == 81559
    assert gpu_memory_mib(facts, [0, 2]) == 97887
    assert gpu_memory_mib({}, None) is None


def test_plain_args_refuse_role_flags_and_secret_values():
    _unused, errors = resolve_instances([], defaults(args=["--port", "1"]), PROFILES)
    assert "must not set --port" in errors[0]
    _unused, errors = resolve_instances([], defaults(args=["--x", "hf_abcdefghijklmnopqrstuvwxyz"]),
                                        PROFILES)
    assert "looks like a token" in errors[0]


def test_overlapping_gpu_sets_are_refused_whatever_the_profile():
    # CPU profile: vLLM does not use the GPUs, but two instances naming the same GPU would
    # share it the day the profile changes; refused like GPU instances.
    _unused, errors = resolve_instances(
        [{"name": "a", "port": 8220, "cuda_visible_devices": "0,1"},
         {"name": "b", "port": 8221, "cuda_visible_devices": "1,2"}],
        defaults(profile="cpu-tiny"), PROFILES, gpu_count=0)
    assert errors == ["instances a (GPUs 0,1) and b (GPUs 1,2) share GPU 1"]
    # a GPU instance on every GPU and a CPU instance that names GPUs overlap too
    _unused, errors = resolve_instances(
        [{"name": "g", "port": 8001},
         {"name": "c", "port": 8002, "profile": "cpu-tiny", "cuda_visible_devices": "3"}],
        defaults(profile="minimax-m2.5-tp4"), PROFILES, gpu_count=8)
    assert len(errors) == 1 and "g sets no cuda_visible_devices" in errors[0]
    # disjoint sets, or CPU instances without sets, pass
    insts, errors = resolve_instances(
        [{"name": "a", "port": 8220, "cuda_visible_devices": "0"},
         {"name": "b", "port": 8221, "cuda_visible_devices": "1"}, {"name": "c", "port": 8222}],
        defaults(profile="cpu-tiny"), PROFILES, gpu_count=0)
    assert errors == [] and len(insts) == 3


def test_model_limit_is_derived_as_vllm_derives_it():
    # the smallest length key wins; model_max_length in the config replaces it
    assert model_max_len({"max_position_embeddings": 4096, "seq_length": 2048}) == 2048
    assert model_max_len({"max_position_embeddings": 4096, "model_max_length": 8192}) == 8192
    # the tokenizer's model_max_length caps it (huge placeholder values do not)
    assert model_max_len({"max_position_embeddings": 2048}, {"model_max_length": 1024}) == 1024
    assert model_max_len({"max_position_embeddings": 2048},
                         {"model_max_length": 1000000000000000019884624838656}) == 2048
    # linear/dynamic RoPE scaling multiplies it; yarn/llama3 are already scaled; gemma3 never
    assert model_max_len({"max_position_embeddings": 4096,
                          "rope_scaling": {"type": "linear", "factor": 4.0}}) == 16384
    assert model_max_len({"max_position_embeddings": 4096,
                          "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}) == 8192
    assert model_max_len({"max_position_embeddings": 131072,
                          "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}) == 131072
    assert model_max_len({"max_position_embeddings": 131072, "model_type": "llama",
                          "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}) == 131072
    assert model_max_len({"max_position_embeddings": 131072, "model_type": "gemma3_text",
                          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}) == 131072
    # per layer type RoPE parameters (nested)
    assert model_max_len({"max_position_embeddings": 1000,
                          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0},
                                              "sliding_attention": {"rope_type": "default"}}}) == 2000


def test_the_long_context_escape_hatch_lifts_the_limit():
    _unused, errors = resolve_instances(
        [], defaults(profile="cpu-tiny", model_dir="/srv/models/tiny",
                     profile_overrides={"max_model_len": 4096},
                     env={"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}),
        PROFILES, model_limits={"/srv/models/tiny": 2048})
    assert errors == []
