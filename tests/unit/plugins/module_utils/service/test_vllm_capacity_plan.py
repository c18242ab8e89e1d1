"""Unit tests for plugins/module_utils/service/vllm_capacity_plan.py and the vllm_capacity_plan module.

The two seed configurations use the real numeric fields of the models' config.json. The
verbatim Hugging Face config.json files could not be fetched from this machine; the fields
below agree across these public sources:

MiniMax-M2.5 (same architecture as MiniMax-M2 / M2.7):
  - https://huggingface.co/mconcat/MiniMax-M2.5-NVFP4 (model card: 62 layers, hidden 3072,
    expert intermediate 1536, 256 experts, 48 heads / 8 KV heads, context 196,608)
  - sparse-vLLM's MiniMax-M2 checkpoint validator and MiniMax-M2.7 config copies (head_dim 128,
    num_key_value_heads 8, quantization_config fp8 with weight_block_size [128, 128])
  - https://github.com/vllm-project/recipes/blob/main/MiniMax/MiniMax-M2.md ("pure TP8 is not
    supported", 96G x4 -> ~400K KV tokens, "240 GB per 1M context tokens")
Kimi-K2.5 (DeepSeek-V3 text tower nested in text_config):
  - https://glennklockwood.com/garden/kimi-k2.5 (61 layers, 64 heads, kv_lora_rank 512)
  - https://miles.radixark.com/docs/models/kimi/kimi-k2.5 (MoE hidden 2048, 384 experts)
  - Kimi-K2.x config copies in public test suites (text_config: qk_rope_head_dim 64,
    qk_nope_head_dim 128, v_head_dim 128, q_lora_rank 1536)
Public measurement (MiniMax-M2.5 FP8, vLLM, TP4 on 4x RTX PRO 6000, default utilization 0.9):
  https://github.com/local-inference-lab/rtx6kpro/blob/main/models/minimax-m25.md
  "Model loading took 53.75 GiB memory / Available KV cache memory: 23.62 GiB /
   GPU KV cache size: 399,424 tokens / Maximum concurrency for 196,608 tokens per request: 2.03x"
"""
import io
import json
import sys

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_capacity_plan import (
    GIB, PlanError, kv_bytes_per_token, architecture, plan, quantization_info)

MIB = 1024 ** 2
GB = 1000 ** 3
# nvidia-smi's total for an RTX PRO 6000 Blackwell (96 GB class): 97,887 MiB.
RTX_PRO_6000 = 97887 * MIB

MINIMAX_M25 = {
    "architectures": ["MiniMaxM2ForCausalLM"],
    "model_type": "minimax_m2",
    "hidden_size": 3072,
    "intermediate_size": 1536,
    "num_hidden_layers": 62,
    "num_attention_heads": 48,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_local_experts": 256,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 196608,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}
# ~228.7B parameters, FP8: about 57.5 GB of weights per GPU at TP4.
MINIMAX_WEIGHTS = 230 * GB

KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "model_type": "kimi_k2",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "n_routed_experts": 384,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "max_position_embeddings": 262144,
        "torch_dtype": "bfloat16",
    },
}
# nvidia/Kimi-K2.5-NVFP4: "1T, 591GB"
# (https://forums.developer.nvidia.com/t/nvidia-releases-kimi-k2-5-nvfp4-1t-591gb/359810)
KIMI_NVFP4_WEIGHTS = 591 * GB


# ----------------------------------------------------------------------------- MiniMax-M2.5

def test_minimax_kv_bytes_per_token_by_hand():
    arch = architecture(MINIMAX_M25)
    whole, per_gpu = kv_bytes_per_token(arch, 2, tensor_parallel=4)
    # 62 layers x 8 KV heads x 128 x 2 (K,V) x 2 bytes; TP4 keeps 2 of the 8 heads per GPU.
    assert whole == 62 * 8 * 128 * 2 * 2 == 253952
    assert per_gpu == 62 * 2 * 128 * 2 * 2 == 63488
    # The recipe's "240 GB per 1M context tokens" is this figure: 253,952 B x 1M = 236.5 GiB.
    assert 230 < whole * 10 ** 6 / GIB < 245


def test_minimax_kv_formula_reproduces_public_measurement():
    """Feed the measured weights and the measured non-KV overhead; the planner must land on the
    measured KV capacity and concurrency (block rounding aside)."""
    budget = 0.9 * RTX_PRO_6000
    measured_weights = 53.75 * GIB
    measured_kv = 23.62 * GIB
    overhead = budget - measured_weights - measured_kv
    p = plan(MINIMAX_M25, 4 * measured_weights, RTX_PRO_6000, 4, tensor_parallel=4,
             reserve_bytes=overhead)
    assert p.kv_memory_per_gpu_bytes == pytest.approx(measured_kv, rel=1e-6)
    assert p.kv_capacity_tokens == pytest.approx(399424, rel=0.001)
    assert p.kv_capacity_tokens % 16 == 0
    assert p.max_concurrency == pytest.approx(2.03, abs=0.01)
    assert p.max_model_len == 196608          # defaults to max_position_embeddings


def test_minimax_tp4_on_96gb_cards_with_default_reserve():
    p = plan(MINIMAX_M25, MINIMAX_WEIGHTS, RTX_PRO_6000, 4, tensor_parallel=4)
    assert p.weights_per_gpu_bytes == 57.5 * GB
    # "leaving roughly 38 GB for KV cache" is the raw rest of a 96 GB card.
    assert 96 * GB - p.weights_per_gpu_bytes == 38.5 * GB
    # With utilization 0.9 and the default 8 GiB reserve the planner stays within 5 % of the
    # measured 399,424 tokens / 2.03x.
    assert p.kv_capacity_tokens == pytest.approx(399424, rel=0.05)
    assert p.max_concurrency == pytest.approx(2.03, rel=0.05)
    assert p.kv_cache_dtype == "auto (2 bytes)"
    assert p.refusals == [] and p.gpus_used == 4


def test_minimax_pure_tp8_is_refused_with_numbers_and_suggestions():
    with pytest.raises(PlanError) as e:
        plan(MINIMAX_M25, MINIMAX_WEIGHTS, RTX_PRO_6000, 8, tensor_parallel=8)
    msg = str(e.value)
    assert "1536 / tensor_parallel 8 = 192" in msg
    assert "weight block 128" in msg
    assert "expert parallel" in msg and "tensor_parallel 4" in msg
    assert len(e.value.refusals) == 1


@pytest.mark.parametrize("tp,ep,gpus", [(8, True, 8), (4, True, 4), (4, False, 4), (4, False, 8)])
def test_minimax_accepted_layouts(tp, ep, gpus):
    p = plan(MINIMAX_M25, MINIMAX_WEIGHTS, RTX_PRO_6000, gpus, tensor_parallel=tp,
             expert_parallel=ep, max_model_len=65536)
    assert p.weights_per_gpu_bytes == MINIMAX_WEIGHTS / tp
    assert p.kv_bytes_per_token_per_gpu == 62 * (8 // tp) * 128 * 2 * 2


def test_minimax_tp2_does_not_fit_96gb_cards():
    with pytest.raises(PlanError) as e:
        plan(MINIMAX_M25, MINIMAX_WEIGHTS, RTX_PRO_6000, 2, tensor_parallel=2)
    msg = str(e.value)
    assert "107.10 GiB per GPU" in msg              # 115 GB / 2^30
    assert "86.03 GiB per GPU" in msg               # 0.9 x 95.59 GiB
    assert "at least 4 GPUs" in msg


def test_block_check_uses_both_block_dimensions_and_divisibility():
    cfg = dict(MINIMAX_M25, intermediate_size=1000)  # 1000 / 2 = 500: not a multiple of 128
    with pytest.raises(PlanError) as e:
        plan(cfg, 10 * GB, RTX_PRO_6000, 2, tensor_parallel=2, max_model_len=4096)
    assert "1000 / tensor_parallel 2 = 500" in str(e.value)
    # Without block quantization the same shape is fine.
    cfg["quantization_config"] = {"quant_method": "fp8"}
    plan(cfg, 10 * GB, RTX_PRO_6000, 2, tensor_parallel=2, max_model_len=4096)


# ----------------------------------------------------------------------------- Kimi-K2.5

def test_kimi_mla_latent_bytes_and_no_tp_split():
    arch = architecture(KIMI_K25)          # read from the nested text_config
    assert arch["mla"] and arch["layers"] == 61 and arch["model_type"] == "kimi_k2"
    whole, per_gpu8 = kv_bytes_per_token(arch, 2, tensor_parallel=8)
    _unused, per_gpu4 = kv_bytes_per_token(arch, 2, tensor_parallel=4)
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes, on every TP rank.
    assert whole == per_gpu8 == per_gpu4 == 576 * 61 * 2 == 70272
    # A plain GQA reading of the same config (64 KV heads x 192) would be ~27x larger.
    assert 64 * 2 * 128 * 61 * 2 > 20 * whole


def test_kimi_nvfp4_needs_all_8_cards():
    with pytest.raises(PlanError) as e:
        plan(KIMI_K25, KIMI_NVFP4_WEIGHTS, RTX_PRO_6000, 4, tensor_parallel=4,
             max_model_len=131072)
    assert "137.60 GiB per GPU (591.0 GB split over tensor_parallel 4" in str(e.value)
    assert "at least 8 GPUs" in str(e.value)

    p = plan(KIMI_K25, KIMI_NVFP4_WEIGHTS, RTX_PRO_6000, 8, tensor_parallel=8,
             max_model_len=131072)
    assert p.attention == "mla"
    assert p.weights_per_gpu_bytes == pytest.approx(73.875 * GB)
    # 86.03 - 68.80 - 8 = 9.23 GiB per GPU of KV / 70,272 B per token
    assert p.kv_memory_per_gpu_bytes / GIB == pytest.approx(9.23, abs=0.01)
    assert p.kv_capacity_tokens == (p.kv_memory_per_gpu_bytes // 70272) // 16 * 16
    assert p.max_concurrency == pytest.approx(p.kv_capacity_tokens / 131072.0, abs=0.01)


def test_kimi_full_context_refused_in_bf16_kv_but_fits_in_fp8():
    with pytest.raises(PlanError) as e:
        plan(KIMI_K25, KIMI_NVFP4_WEIGHTS, RTX_PRO_6000, 8, tensor_parallel=8)
    assert "less than max_model_len 262144" in str(e.value)
    p = plan(KIMI_K25, KIMI_NVFP4_WEIGHTS, RTX_PRO_6000, 8, tensor_parallel=8,
             kv_cache_dtype="fp8")
    assert p.kv_bytes_per_token_per_gpu == 35136
    assert p.kv_capacity_tokens >= 262144


def test_checkpoint_declared_fp8_kv_wins_over_flag():
    # Hand-made hf_quant_config in ModelOpt's layout (keys as ModelOpt writes them).
    hqc = {"producer": {"name": "modelopt"},
           "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}
    info = quantization_info(KIMI_K25, hqc)
    assert info["forced_kv_dtype"] == "fp8" and info["quant_algo"] == "NVFP4"
    p = plan(KIMI_K25, KIMI_NVFP4_WEIGHTS, RTX_PRO_6000, 8, tensor_parallel=8,
             kv_cache_dtype="bfloat16", hf_quant_config=hqc)
    assert p.kv_cache_dtype == "fp8" and p.kv_bytes_per_token_per_gpu == 35136
    assert any("ignores kv_cache_dtype 'bfloat16'" in w for w in p.warnings)
    # compressed-tensors style kv_cache_scheme does the same
    cfg = dict(MINIMAX_M25, quantization_config=dict(
        MINIMAX_M25["quantization_config"], kv_cache_scheme={"num_bits": 8, "type": "float"}))
    assert quantization_info(cfg)["forced_kv_dtype"] == "fp8"


# ----------------------------------------------------------------------------- generic rules

LLAMA = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
         "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
         "torch_dtype": "bfloat16"}


def test_kv_heads_fewer_than_tp_are_replicated():
    p = plan(LLAMA, 16 * GB, 80 * GIB, 16, tensor_parallel=16, max_model_len=8192)
    assert p.kv_bytes_per_token_per_gpu == 32 * 1 * 128 * 2 * 2   # one (replicated) head
    assert any("replicated on 2 GPUs" in w for w in p.warnings)


def test_heads_and_kv_heads_must_divide():
    with pytest.raises(PlanError) as e:
        plan(dict(LLAMA, num_key_value_heads=3), 16 * GB, 80 * GIB, 4, tensor_parallel=4,
             max_model_len=8192)
    assert "num_attention_heads 32" not in str(e.value)
    assert "tensor_parallel 4 is not a multiple of num_key_value_heads 3" in str(e.value)
    with pytest.raises(PlanError) as e:
        plan(dict(LLAMA, num_attention_heads=48), 16 * GB, 80 * GIB, 32, tensor_parallel=32,
             max_model_len=8192)
    assert "num_attention_heads 48 is not divisible by tensor_parallel 32" in str(e.value)


def test_more_gpus_than_available_and_too_long_context_are_both_reported():
    with pytest.raises(PlanError) as e:
        plan(LLAMA, 16 * GB, 80 * GIB, 4, tensor_parallel=2, pipeline_parallel=2,
             data_parallel=2, max_model_len=16384)
    refusals = e.value.refusals
    assert "= 8 GPUs, but gpu_count is 4" in refusals[0]
    assert any("max_model_len 16384 is above the model's limit 8192" in r for r in refusals)


def test_pipeline_and_data_parallel_arithmetic():
    one = plan(LLAMA, 16 * GB, 80 * GIB, 1, max_model_len=8192)
    pp2 = plan(LLAMA, 16 * GB, 80 * GIB, 2, pipeline_parallel=2, max_model_len=8192)
    assert pp2.kv_bytes_per_token_per_gpu * 2 == one.kv_bytes_per_token_per_gpu
    assert pp2.weights_per_gpu_bytes * 2 == one.weights_per_gpu_bytes
    dp2 = plan(LLAMA, 16 * GB, 80 * GIB, 2, data_parallel=2, max_model_len=8192)
    assert dp2.kv_capacity_tokens == one.kv_capacity_tokens
    assert dp2.kv_capacity_tokens_total == 2 * one.kv_capacity_tokens
    assert dp2.max_concurrency_total == pytest.approx(2 * one.max_concurrency, abs=0.01)


def test_float32_dtype_override_doubles_auto_kv():
    bf16 = plan(LLAMA, 16 * GB, 80 * GIB, 1, max_model_len=8192)
    fp32 = plan(LLAMA, 16 * GB, 80 * GIB, 1, max_model_len=8192, dtype="float32")
    assert fp32.kv_bytes_per_token == 2 * bf16.kv_bytes_per_token


def test_strict_false_returns_refusals_instead_of_raising():
    p = plan(MINIMAX_M25, MINIMAX_WEIGHTS, RTX_PRO_6000, 8, tensor_parallel=8, strict=False)
    assert len(p.refusals) == 1 and "192" in p.refusals[0]
    assert p.kv_capacity_tokens > 0          # the numbers are still there


@pytest.mark.parametrize("kwargs,needle", [
    ({"kv_cache_dtype": "int3"}, "kv_cache_dtype 'int3' is not one of"),
    ({"tensor_parallel": 0}, "tensor_parallel must be >= 1, got 0"),
    ({"tensor_parallel": 2.0}, "tensor_parallel must be an integer"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be <= 1.0, got 1.5"),
    ({"expert_parallel": "yes"}, "expert_parallel must be true or false"),
    ({"max_model_len": 0}, "max_model_len must be >= 1, got 0"),
])
def test_bad_input_names_the_variable(kwargs, needle):
    with pytest.raises(PlanError) as e:
        plan(LLAMA, 16 * GB, 80 * GIB, 8, **kwargs)
    assert needle in str(e.value)


def test_bad_config_is_refused():
    with pytest.raises(PlanError, match="num_hidden_layers"):
        plan({"num_attention_heads": 8, "hidden_size": 64}, GB, 80 * GIB, 1, max_model_len=64)
    with pytest.raises(PlanError, match="weight_block_size"):
        quantization_info({"quantization_config": {"weight_block_size": [128]}})
    with pytest.raises(PlanError, match="max_model_len is not set"):
        plan({"num_attention_heads": 8, "hidden_size": 64, "num_hidden_layers": 2}, GB,
             80 * GIB, 1)


# ----------------------------------------------------------------------------- the module

def run_module(args, monkeypatch, capsys):
    from ansible.module_utils import basic
    from ansible_collections.vllm_ops.deploy.plugins.modules import vllm_capacity_plan

    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", None, raising=False)
    monkeypatch.setattr(sys, "argv", ["vllm_capacity_plan"])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        json.dumps({"ANSIBLE_MODULE_ARGS": args}).encode())))
    with pytest.raises(SystemExit):
        vllm_capacity_plan.main()
    return json.loads(capsys.readouterr().out)


def _model_dir(tmp_path, config, shard_sizes, quant=None):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    if quant is not None:
        (d / "hf_quant_config.json").write_text(json.dumps(quant))
    for i, size in enumerate(shard_sizes):
        with open(str(d / ("model-%05d.safetensors" % i)), "wb") as f:
            f.truncate(size)            # sparse: real size, no disk used
    return d


def test_module_sums_safetensors_and_plans(tmp_path, monkeypatch, capsys):
    d = _model_dir(tmp_path, MINIMAX_M25, [MINIMAX_WEIGHTS // 2] * 2)
    out = run_module({"config_path": str(d / "config.json"), "weights_dir": str(d),
                      "gpu_memory_mib": 97887, "gpu_count": 4, "tensor_parallel": 4,
                      "_ansible_check_mode": True}, monkeypatch, capsys)
    assert not out.get("failed"), out
    assert out["changed"] is False
    assert out["weights_bytes"] == {"bytes": MINIMAX_WEIGHTS, "source": "2 safetensors files"}
    assert out["plan"]["weights_per_gpu_bytes"] == 57.5 * GB
    assert out["plan"]["kv_bytes_per_token_per_gpu"] == 63488


def test_module_fails_with_refusal_text(tmp_path, monkeypatch, capsys):
    d = _model_dir(tmp_path, MINIMAX_M25, [MINIMAX_WEIGHTS])
    out = run_module({"config_path": str(d / "config.json"), "weights_dir": str(d),
                      "gpu_memory_mib": 97887, "gpu_count": 8, "tensor_parallel": 8},
                     monkeypatch, capsys)
    assert out["failed"] is True
    assert out["msg"].startswith("capacity plan refused: MoE intermediate_size 1536")
    assert out["plan"]["refusals"] and out["plan"]["kv_capacity_tokens"] > 0


def test_module_reads_sibling_hf_quant_config_and_index(tmp_path, monkeypatch, capsys):
    hqc = {"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}
    d = _model_dir(tmp_path, KIMI_K25, [], quant=hqc)
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": KIMI_NVFP4_WEIGHTS}, "weight_map": {}}))
    out = run_module({"config_path": str(d / "config.json"), "weights_dir": str(d),
                      "gpu_memory_bytes": RTX_PRO_6000, "gpu_count": 8, "tensor_parallel": 8},
                     monkeypatch, capsys)
    assert not out.get("failed"), out
    assert out["weights_bytes"]["source"].startswith("metadata.total_size")
    assert out["plan"]["kv_cache_dtype"] == "fp8"
    assert out["plan"]["max_model_len"] == 262144


def test_module_rejects_missing_weights(tmp_path, monkeypatch, capsys):
    d = _model_dir(tmp_path, LLAMA, [])
    out = run_module({"config": LLAMA, "weights_dir": str(d), "gpu_memory_mib": 81920,
                      "gpu_count": 1}, monkeypatch, capsys)
    assert out["failed"] is True and "pass weights_bytes" in out["msg"]


# ----------------------------------------------------------------------------- weights from config
# The fixtures of the GPU check (public config.json values of the real checkpoints) against the
# checkpoints' published sizes: MiniMax-M2.5 FP8 ~230 GB, Kimi-K2.5 INT4 ~595 GB.
import os  # noqa: E402

from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_capacity_plan import (  # noqa: E402
    estimate_weights_bytes)

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))), "gpu", "models")


def _fixture(name, full=True):
    with open(os.path.join(FIXTURES, name + ".json")) as f:
        cfg = json.load(f)
    meta = cfg.pop("_fixture")
    if not full:
        cfg["num_hidden_layers"] = meta["num_hidden_layers"]
    return cfg


@pytest.mark.parametrize("name, published_gb", [("minimax-m2.5", 230), ("kimi-k2.5-text", 595)])
def test_weights_estimated_from_config_match_the_published_checkpoint_sizes(name, published_gb):
    est = estimate_weights_bytes(_fixture(name)) / GB
    assert abs(est - published_gb) / published_gb < 0.03, est


def test_weights_estimate_scales_with_depth_and_quantization():
    full, cut = _fixture("minimax-m2.5"), _fixture("minimax-m2.5", full=False)
    per_layer = (estimate_weights_bytes(full) - estimate_weights_bytes(cut)) / (62 - 4)
    # 256 experts x 3 x 3072 x 1536 FP8 bytes dominate a MiniMax-M2 layer (~3.6 GB)
    assert 3.5e9 < per_layer < 3.8e9
    bf16 = dict(full)
    bf16.pop("quantization_config")
    assert estimate_weights_bytes(bf16) > 1.9 * estimate_weights_bytes(full)


def test_a_dense_llama_estimate_counts_every_matrix():
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
           "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "torch_dtype": "float32"}
    h, v, i, kv = 64, 1000, 128, 2 * 16
    per_layer = h * h + 2 * kv * h + h * h + 3 * h * i + 2 * h
    assert estimate_weights_bytes(cfg) == 4 * (2 * v * h + h + 2 * per_layer)


def test_an_unknown_quantization_is_refused_not_guessed():
    cfg = dict(_fixture("minimax-m2.5"), quantization_config={"quant_method": "awq"})
    with pytest.raises(PlanError, match="quantization method 'awq' is not supported"):
        estimate_weights_bytes(cfg)


def test_module_estimates_dummy_weights_from_config(monkeypatch, capsys):
    """--load-format dummy: no weight files; the module plans from config.json alone."""
    cfg = _fixture("minimax-m2.5", full=False)
    out = run_module({"config": cfg, "weights_from_config": True, "gpu_memory_mib": 143771,
                      "gpu_count": 1, "max_model_len": 8192}, monkeypatch, capsys)
    assert not out.get("failed"), out
    assert out["weights_bytes"]["source"].startswith("estimated from config.json")
    assert out["weights_bytes"]["bytes"] == estimate_weights_bytes(cfg)
    assert out["plan"]["weights_per_gpu_bytes"] == estimate_weights_bytes(cfg)
