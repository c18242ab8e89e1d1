"""Unit tests for plugins/plugin_utils/service/profile_schema.py, the collection's profile loader
(plugins/plugin_utils/service/profiles.py) and every shipped model profile."""
import copy
import json
import os
import subprocess
import sys

import pytest
import yaml

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_capacity_plan import PlanError, plan
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profile_schema import (
    ProfileError, merge_args, merge_env, merge_overrides, parse_flags, render_argv, resolve_profile,
    validate_profile)
from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service import profiles as vllm_profiles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
PROFILE_DIR = os.path.join(ROOT, "profiles")
EXPECTED = {"minimax-m2.5-tp4", "minimax-m2.5-tp4-ep", "minimax-m2.5-tp8-ep",
            "kimi-k2.5-nvfp4-tp8", "kimi-k2.5-int4-tp8", "glm-5-fp8", "cpu-tiny"}
ENTRY = ["/opt/vllm/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]


def load_profiles():
    """The raw content of every shipped profile file: the profile's own keys at the top (no
    wrapper named like the inventory variable vllm_service_profile)."""
    profiles = {}
    for name, path in vllm_profiles.known_profiles().items():
        with open(path) as f:
            data = yaml.safe_load(f)
        assert "vllm_service_profile" not in data, path
        assert data["name"] == name, path
        profiles[name] = data
    return profiles


PROFILES = load_profiles()


def test_the_expected_profiles_ship():
    assert set(PROFILES) == EXPECTED
    assert os.path.realpath(vllm_profiles.COLLECTION_PROFILES) == os.path.realpath(PROFILE_DIR)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_validates_and_renders(name):
    prof = PROFILES[name]
    validate_profile(prof, name)
    argv = render_argv(prof, "/srv/models/m", "127.0.0.1", 8000, python=ENTRY[0])
    assert all(isinstance(a, str) for a in argv)
    assert argv[:3] == ENTRY
    flags = dict((f, v) for f, v, _raw in parse_flags(argv[3:]))
    assert flags["--model"] == "/srv/models/m"
    assert flags["--served-model-name"] == prof["model"]["served_model_name"]
    assert flags["--port"] == "8000" and flags["--host"] == "127.0.0.1"
    assert flags["--tensor-parallel-size"] == str(prof["parallel"]["tensor"])
    assert ("--enable-expert-parallel" in argv) == prof["parallel"]["expert_parallel"]
    if prof["max_model_len"] is not None:
        assert flags["--max-model-len"] == str(prof["max_model_len"])
    # profile args come last, in order, untouched
    assert argv[len(argv) - len(prof["args"]):] == prof["args"]
    # each flag appears once
    names = [f for f, _v, _r in parse_flags(argv[3:])]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_states_gpus_and_sources(name):
    prof = PROFILES[name]
    assert prof["source"] and all(u.startswith("https://") for u in prof["source"])
    gpu = prof["gpu"]
    world = prof["parallel"]["tensor"] * prof["parallel"]["pipeline"] * prof["parallel"]["data"]
    assert (gpu["min_count"] >= world) if gpu["required"] else (world == 1)
    if not gpu["verified"]:
        assert gpu["validated_on"] == [] or "SM120" in prof["notes"] or \
            "unverified" in prof["notes"].lower()


def test_glm5_is_marked_unverified_on_sm120():
    prof = PROFILES["glm-5-fp8"]
    assert prof["gpu"]["verified"] is False and "UNVERIFIED on SM120" in prof["notes"]


def test_cpu_profile_is_the_demo():
    prof = PROFILES["cpu-tiny"]
    argv = render_argv(prof, "/m", "0.0.0.0", 8000)
    assert prof["gpu"]["required"] is False
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[argv.index("--max-model-len") + 1] == "512"
    assert "--kv-cache-dtype" not in argv and "--data-parallel-size" not in argv


# MiniMax-M2.5 config fields (sources in test_capacity_plan.py).
MINIMAX = {"model_type": "minimax_m2", "intermediate_size": 1536, "num_hidden_layers": 62,
           "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
           "num_local_experts": 256, "max_position_embeddings": 196608,
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}


@pytest.mark.parametrize("name", ["minimax-m2.5-tp4", "minimax-m2.5-tp4-ep",
                                  "minimax-m2.5-tp8-ep"])
def test_minimax_profiles_pass_the_planner_on_8x_rtx_pro_6000(name):
    prof = PROFILES[name]
    par = prof["parallel"]
    p = plan(MINIMAX, 230 * 10 ** 9, 97887 * 1024 ** 2, 8, tensor_parallel=par["tensor"],
             expert_parallel=par["expert_parallel"], max_model_len=prof["max_model_len"],
             gpu_memory_utilization=prof["gpu_memory_utilization"])
    assert p.kv_capacity_tokens >= p.max_model_len
    # and the same profile without expert parallel at TP8 is exactly what must be refused
    if par["tensor"] == 8:
        with pytest.raises(PlanError, match="= 192"):
            plan(MINIMAX, 230 * 10 ** 9, 97887 * 1024 ** 2, 8, tensor_parallel=8)


# ----------------------------------------------------------------------------- selection

def test_unknown_profile_lists_known_ones_and_names_the_variable():
    with pytest.raises(ProfileError) as e:
        vllm_profiles.load_profile("minimax-tp16", variable="vllm_service_profile")
    msg = str(e.value)
    assert msg.startswith("unknown vllm_service_profile 'minimax-tp16'; known profiles: ")
    assert "cpu-tiny, glm-5-fp8, kimi-k2.5-int4-tp8" in msg
    assert PROFILE_DIR in msg or os.path.realpath(PROFILE_DIR) in os.path.realpath(
        msg.split("(searched ")[1].rstrip(")"))


def test_loader_merges_the_overrides_and_validates_the_result():
    prof = vllm_profiles.load_profile("minimax-m2.5-tp4",
                                      {"max_model_len": 65536, "parallel": {"tensor": 8},
                                       "gpu": {"min_count": 8}})
    assert prof["max_model_len"] == 65536
    assert prof["parallel"] == {"tensor": 8, "pipeline": 1, "data": 1, "expert_parallel": False}
    assert prof["args"] == PROFILES["minimax-m2.5-tp4"]["args"]  # untouched keys stay
    assert PROFILES["minimax-m2.5-tp4"]["parallel"]["tensor"] == 4  # the file is not changed
    with pytest.raises(ProfileError, match="gpu.min_count 4 is below tensor 8"):
        vllm_profiles.load_profile("minimax-m2.5-tp4", {"parallel": {"tensor": 8}})
    with pytest.raises(ProfileError, match="cannot rename profile cpu-tiny"):
        vllm_profiles.load_profile("cpu-tiny", {"name": "other"})
    with pytest.raises(ProfileError, match="must be a mapping"):
        vllm_profiles.load_profile("cpu-tiny", ["max_model_len"])


def test_a_users_profile_directory_comes_first(tmp_path):
    mine = copy.deepcopy(PROFILES["cpu-tiny"])
    mine["description"] = "my own CPU profile"
    (tmp_path / "cpu-tiny.yml").write_text(yaml.safe_dump(mine))
    other = dict(copy.deepcopy(PROFILES["cpu-tiny"]), name="cpu-small", max_model_len=256)
    (tmp_path / "cpu-small.yml").write_text(yaml.safe_dump(other))
    known = vllm_profiles.known_profiles([str(tmp_path)])
    assert known["cpu-tiny"] == str(tmp_path / "cpu-tiny.yml")
    assert set(known) == EXPECTED | {"cpu-small"}
    assert vllm_profiles.load_profile("cpu-tiny", dirs=[str(tmp_path)])["description"] == \
        "my own CPU profile"
    assert vllm_profiles.load_profile("cpu-small", dirs=[str(tmp_path)])["max_model_len"] == 256
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(dict(other, name="broken", source=[])))
    with pytest.raises(ProfileError, match="source must be a non-empty list"):
        vllm_profiles.load_profile("broken", dirs=[str(tmp_path)])
    with pytest.raises(ProfileError, match="must be a list of directories"):
        vllm_profiles.load_profile("cpu-tiny", dirs=str(tmp_path))


def test_merge_overrides_is_recursive_and_replaces_lists():
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    out = merge_overrides(base, {"a": {"c": [3]}, "e": {"f": 1}})
    assert out == {"a": {"b": 1, "c": [3]}, "d": 1, "e": {"f": 1}}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert resolve_profile(PROFILES["cpu-tiny"], "cpu-tiny") == PROFILES["cpu-tiny"]


# ----------------------------------------------------------------------------- arg merging

MM = PROFILES["minimax-m2.5-tp4"]


def test_extra_args_are_appended_as_single_items():
    cfg = '{"cudagraph_mode": "PIECEWISE"}'
    argv = render_argv(MM, "/m", "h", 1, extra_args=["--compilation-config", cfg,
                                                     "--max-num-seqs", "64"])
    assert argv[-4:] == ["--compilation-config", cfg, "--max-num-seqs", "64"]


@pytest.mark.parametrize("extra", [
    ["--reasoning-parser", "minimax_m2"],
    ["--reasoning_parser", "minimax_m2"],
    ["--reasoning-parser=minimax_m2"],
])
def test_conflicting_extra_arg_is_refused(extra):
    with pytest.raises(ProfileError) as e:
        merge_args(MM["args"], extra)
    msg = str(e.value)
    assert "--reasoning-parser" in msg and "'minimax_m2'" in msg
    assert "'minimax_m2_append_think'" in msg


def test_exact_repeat_is_dropped_and_switches_merge():
    merged = merge_args(MM["args"], ["--trust-remote-code", "--tool-call-parser=minimax_m2",
                                     "--enable-prefix-caching"])
    assert merged == MM["args"] + ["--enable-prefix-caching"]
    with pytest.raises(ProfileError, match="--enable-prefix-caching"):
        merge_args(["--enable-prefix-caching"], ["--no-enable-prefix-caching"])
    with pytest.raises(ProfileError, match="twice"):
        merge_args([], ["--max-num-seqs", "8", "--max-num-seqs", "16"])


@pytest.mark.parametrize("extra,where", [
    (["--tensor-parallel-size", "8"], "parallel.tensor"),
    (["-tp", "8"], "parallel.tensor"),
    (["--enable_expert_parallel"], "parallel.expert_parallel"),
    (["--max-model-len", "1000"], "max_model_len"),
    (["--port", "9000"], "port argument"),
    (["--api-key", "abc"], "API key secret"),
])
def test_renderer_owned_flags_are_refused_in_extra_args(extra, where):
    with pytest.raises(ProfileError) as e:
        render_argv(MM, "/m", "h", 8000, extra_args=extra)
    assert where in str(e.value)


def test_secret_values_and_env_are_refused():
    with pytest.raises(ProfileError, match="token or key"):
        merge_args([], ["--hf-overrides", "hf_" + "a" * 30])
    for key in ("HF_TOKEN", "VLLM_API_KEY", "hugging_face_hub_token"):
        with pytest.raises(ProfileError, match="looks like a secret"):
            merge_env({}, {key: "x"})
    # names that merely contain TOKEN are fine
    assert merge_env({}, {"TOKENIZERS_PARALLELISM": "false"}) == {
        "TOKENIZERS_PARALLELISM": "false"}


def test_env_merge():
    assert merge_env({"A": "1"}, {"B": 2, "A": "1"}) == {"A": "1", "B": "2"}
    with pytest.raises(ProfileError, match="extra env sets A='2' but the profile sets '1'"):
        merge_env({"A": "1"}, {"A": "2"})
    with pytest.raises(ProfileError, match="quote booleans"):
        merge_env({}, {"X": True})
    with pytest.raises(ProfileError, match="not a valid environment variable name"):
        merge_env({}, {"1X": "a"})


def test_values_must_follow_flags():
    with pytest.raises(ProfileError, match="'minimax_m2' is not a flag"):
        parse_flags(["minimax_m2", "--x"])
    assert parse_flags(["--seed", "-1"]) == [("--seed", "-1", ["--seed", "-1"])]


# ----------------------------------------------------------------------------- validation

def _broken(**changes):
    prof = copy.deepcopy(MM)
    for dotted, value in changes.items():
        node = prof
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node[k]
        if value is KeyError:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return prof


@pytest.mark.parametrize("changes,needle", [
    ({"args": "--trust-remote-code"}, "args must be a list of strings"),
    ({"args": ["--x", 3]}, "args must be a list of strings"),
    ({"parallel__tensor": 0}, "parallel.tensor must be an integer >= 1, got 0"),
    ({"parallel__expert_parallel": "no"}, "parallel.expert_parallel must be true or false"),
    ({"gpu__min_count": 2}, "gpu.min_count 2 is below tensor 4"),
    ({"kv_cache_dtype": "int4"}, "kv_cache_dtype 'int4' is not one of"),
    ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization must be in (0, 1]"),
    ({"source": ["file:///x"]}, "source must be a non-empty list of http(s) URLs"),
    ({"model__revision": KeyError}, "model.revision must be a string or null"),
    ({"notes": KeyError}, "missing keys: notes"),
    ({"env": {"HF_TOKEN": "x"}}, "HF_TOKEN looks like a secret"),
    ({"args": ["--model", "/x"]}, "must not set --model"),
])
def test_invalid_profiles_name_the_key(changes, needle):
    with pytest.raises(ProfileError) as e:
        validate_profile(_broken(**changes))
    assert needle in str(e.value)


def test_profile_name_must_match_file():
    with pytest.raises(ProfileError, match="expected 'other'"):
        validate_profile(MM, "other")


def test_cpu_profile_cannot_ask_for_parallelism():
    prof = copy.deepcopy(PROFILES["cpu-tiny"])
    prof["parallel"]["tensor"] = 2
    with pytest.raises(ProfileError, match="without GPUs"):
        validate_profile(prof)


def test_render_rejects_bad_port_and_dir():
    with pytest.raises(ProfileError, match="port must be an integer in 1..65535, got 0"):
        render_argv(MM, "/m", "h", 0)
    with pytest.raises(ProfileError, match="model_dir"):
        render_argv(MM, "", "h", 8000)


def test_the_lookup_plugin_through_ansible():
    """lookup('vllm_ops.deploy.vllm_profile', ...) as a play calls it: merged, validated, and an
    unknown name refused naming the variable."""
    ansible = os.path.join(os.path.dirname(sys.executable), "ansible")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
               ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")

    def debug(expr):
        out = subprocess.run([ansible, "localhost", "-i", "localhost,", "-c", "local", "-m",
                              "ansible.builtin.debug", "-a", "msg={{ %s }}" % expr],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                             check=False)
        return json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]

    res = debug("lookup('vllm_ops.deploy.vllm_profile', 'minimax-m2.5-tp4', "
                "overrides={'max_model_len': 65536}) | to_json")
    prof = json.loads(res["msg"])
    assert prof["max_model_len"] == 65536 and prof["parallel"]["tensor"] == 4
    res = debug("lookup('vllm_ops.deploy.vllm_profile', 'gpt-9', variable='vllm_service_profile')")
    assert res["failed"] is True
    assert "unknown vllm_service_profile 'gpt-9'" in res["msg"]
