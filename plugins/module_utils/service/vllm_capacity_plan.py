"""Capacity planner for a vLLM deployment: pure Python, no I/O.

From a model's config.json (plus its quantization config), the size of its weights, the GPUs and
the chosen parallel layout, compute what vLLM will do with the memory:

* weights per GPU (total weights / (tensor x pipeline));
* KV-cache bytes per token and per GPU (layers of one pipeline stage x KV heads on one GPU x
  head dim x 2 (K and V) x KV dtype bytes; MLA models such as DeepSeek-V3 / Kimi-K2 cache one
  compressed latent per layer, kv_lora_rank + qk_rope_head_dim wide, replicated on every TP rank);
* KV capacity in tokens: (memory x gpu_memory_utilization - weights - reserve) / bytes per token,
  rounded down to whole KV blocks, as vLLM reports "GPU KV cache size";
* maximum concurrency at max_model_len (capacity / max_model_len, per replica and for all DP
  replicas).

It refuses layouts vLLM would refuse or that cannot fit, with the numbers in the message:
heads vs tensor parallel, FP8 block-quantized MoE experts whose per-rank slice is not a multiple
of the block (MiniMax-M2.5 at pure TP8: 1536 / 8 = 192, not a multiple of 128), more GPUs than
given, weights that do not fit, a KV cache smaller than max_model_len, max_model_len above the
model's limit.

Limits (stated so nobody reads more into the numbers than is there): the non-KV memory vLLM
needs (activations at the profile run, CUDA graphs, NCCL buffers, sampler) is a per-GPU
``reserve_bytes`` input, not derived; every decoder layer is counted as full attention (sliding
window or linear-attention layers would make the real capacity larger); with data parallel +
expert parallel the experts are also split over the DP ranks, which is not modelled (the weights
per GPU shown are then an upper bound).
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

GIB = 1024 ** 3
GB = 1000 ** 3

# Default memory kept out of the KV cache on each GPU (activations, CUDA graphs, NCCL, sampler).
# Calibrated on the one public measurement we have (MiniMax-M2.5 FP8, TP4, RTX PRO 6000,
# gpu_memory_utilization 0.9): 0.9 x 95.59 GiB - 53.75 GiB weights - 23.62 GiB KV = 8.66 GiB.
DEFAULT_RESERVE_BYTES = 8 * GIB
DEFAULT_BLOCK_SIZE = 16

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2,
    "float16": 2, "fp16": 2, "half": 2,
}
# --kv-cache-dtype values this planner understands ('auto' = the model dtype).
KV_CACHE_DTYPES = {
    "auto": None,
    "bfloat16": 2, "bf16": 2, "float16": 2, "half": 2, "float32": 4,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}


class PlanError(Exception):
    """A configuration that cannot be served. ``refusals`` lists every reason found."""

    def __init__(self, refusals, warnings=None):
        if isinstance(refusals, str):
            refusals = [refusals]
        self.refusals = list(refusals)
        self.warnings = list(warnings or [])
        super().__init__("; ".join(self.refusals))


@dataclass
class Plan:
    model_type: str
    attention: str                      # 'mha/gqa' or 'mla'
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    expert_parallel: bool
    gpus_used: int
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    weights_bytes: int
    weights_per_gpu_bytes: int
    reserve_per_gpu_bytes: int
    kv_cache_dtype: str                 # effective dtype used for the plan
    kv_bytes_per_token: int             # whole model, one token (all layers, all KV heads)
    kv_bytes_per_token_per_gpu: int     # what one GPU stores per token
    kv_memory_per_gpu_bytes: int
    kv_capacity_tokens: int             # per replica ("GPU KV cache size" in vLLM's log)
    kv_capacity_tokens_total: int       # all data-parallel replicas
    max_model_len: int
    model_max_len: int
    max_concurrency: float              # per replica, at max_model_len
    max_concurrency_total: float        # all replicas
    warnings: list = field(default_factory=list)
    refusals: list = field(default_factory=list)

    def as_dict(self):
        d = asdict(self)
        d["weights_per_gpu_gib"] = round(self.weights_per_gpu_bytes / GIB, 2)
        d["kv_memory_per_gpu_gib"] = round(self.kv_memory_per_gpu_bytes / GIB, 2)
        return d


# ----------------------------------------------------------------------------- config reading

def _text_config(config):
    """The language-model part of a config: nested ``text_config`` (multimodal wrappers such as
    Kimi-K2.5) falls back to the top level for keys it lacks."""
    if not isinstance(config, dict):
        raise PlanError("model config must be a dict (the parsed config.json), got %s"
                        % type(config).__name__)
    text = config.get("text_config")
    if isinstance(text, dict):
        merged = dict(config)
        merged.update(text)
        return merged
    return config


def _int_field(cfg, *names, **kw):
    for name in names:
        value = cfg.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PlanError("config.json field %s must be a non-negative integer, got %r"
                                % (name, value))
            return value
    if kw.get("required"):
        raise PlanError("config.json has none of the fields %s" % ", ".join(names))
    return kw.get("default")


def quantization_info(config, hf_quant_config=None):
    """Summarise the quantization of a checkpoint.

    Reads ``quantization_config`` (top level or inside ``text_config``) and, when given, the
    ModelOpt ``hf_quant_config.json``. Returns a dict: method, weight_block_size (list or None)
    and forced_kv_dtype ('fp8' when the checkpoint declares an FP8 KV-cache scheme, which vLLM
    then uses whatever --kv-cache-dtype says; see vllm-project/vllm#34752)."""
    qc = {}
    if isinstance(config, dict):
        qc = config.get("quantization_config") or {}
        text = config.get("text_config")
        if not qc and isinstance(text, dict):
            qc = text.get("quantization_config") or {}
    method = qc.get("quant_method")
    block = qc.get("weight_block_size")
    forced = None

    kv_algo = qc.get("kv_cache_quant_algo")
    kv_scheme = qc.get("kv_cache_scheme")
    if isinstance(hf_quant_config, dict):
        q = hf_quant_config.get("quantization") or {}
        method = method or "modelopt"
        algo = q.get("quant_algo")
        if algo and not qc.get("quant_algo"):
            qc = dict(qc, quant_algo=algo)
        kv_algo = kv_algo or q.get("kv_cache_quant_algo")
    if isinstance(kv_algo, str) and kv_algo.upper().startswith("FP8"):
        forced = "fp8"
    if isinstance(kv_scheme, dict) and kv_scheme.get("num_bits") == 8 \
            and kv_scheme.get("type", "float") == "float":
        forced = "fp8"
    if block is not None:
        if (not isinstance(block, (list, tuple)) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                           for b in block)):
            raise PlanError("quantization_config.weight_block_size must be two positive "
                            "integers, got %r" % (block,))
        block = list(block)
    return {"method": method, "quant_algo": qc.get("quant_algo"),
            "weight_block_size": block, "forced_kv_dtype": forced}


def model_dtype_bytes(config, dtype=None):
    """Bytes of the model's compute dtype (what 'auto' KV cache uses)."""
    name = dtype if dtype not in (None, "auto") else None
    if name is None:
        cfg = _text_config(config)
        name = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    key = str(name).replace("torch.", "").lower()
    if key not in _DTYPE_BYTES:
        raise PlanError("dtype %r is not one of %s" % (name, ", ".join(sorted(_DTYPE_BYTES))))
    return _DTYPE_BYTES[key]


def architecture(config):
    """The numbers that decide the KV cache and the divisibility rules."""
    cfg = _text_config(config)
    heads = _int_field(cfg, "num_attention_heads", "n_head", required=True)
    layers = _int_field(cfg, "num_hidden_layers", "n_layer", "num_layers", required=True)
    if heads < 1 or layers < 1:
        raise PlanError("config.json: num_attention_heads (%d) and num_hidden_layers (%d) must "
                        "be at least 1" % (heads, layers))
    kv_heads = _int_field(cfg, "num_key_value_heads", default=heads) or heads
    hidden = _int_field(cfg, "hidden_size", "n_embd", default=0)
    head_dim = _int_field(cfg, "head_dim", default=None)
    if not head_dim:
        if not hidden:
            raise PlanError("config.json has neither head_dim nor hidden_size")
        head_dim = hidden // heads
    kv_lora_rank = _int_field(cfg, "kv_lora_rank", default=None)
    mla = bool(kv_lora_rank)
    experts = _int_field(cfg, "n_routed_experts", "num_local_experts", "num_experts",
                         default=0) or 0
    moe_inter = None
    if experts:
        # DeepSeek/Kimi/GLM name it moe_intermediate_size; MiniMax-M2 and Mixtral use
        # intermediate_size for the (only) expert FFN.
        moe_inter = _int_field(cfg, "moe_intermediate_size", "intermediate_size", default=None)
    max_len = _int_field(cfg, "max_position_embeddings", "max_sequence_length", "seq_length",
                         "n_positions", default=None)
    return {
        "model_type": cfg.get("model_type") or "unknown",
        "layers": layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "mla": mla,
        "kv_lora_rank": kv_lora_rank or 0,
        "qk_rope_head_dim": _int_field(cfg, "qk_rope_head_dim", default=0) or 0,
        "experts": experts,
        "moe_intermediate_size": moe_inter,
        "max_len": max_len,
        "partial_attention": bool(cfg.get("sliding_window") or cfg.get("layer_types")),
    }


def kv_bytes_per_token(arch, kv_dtype_bytes, tensor_parallel=1, pipeline_parallel=1):
    """(whole model, one GPU) KV-cache bytes for one token."""
    layers_per_stage = int(math.ceil(arch["layers"] / float(pipeline_parallel)))
    if arch["mla"]:
        per_layer = (arch["kv_lora_rank"] + arch["qk_rope_head_dim"]) * kv_dtype_bytes
        return arch["layers"] * per_layer, layers_per_stage * per_layer
    per_head = 2 * arch["head_dim"] * kv_dtype_bytes           # K and V
    heads_per_gpu = max(1, arch["kv_heads"] // tensor_parallel)  # replicated below 1
    return (arch["layers"] * arch["kv_heads"] * per_head,
            layers_per_stage * heads_per_gpu * per_head)


# ----------------------------------------------------------------------------- weights from config

def _quant_scheme(config):
    """(kind, group) of the checkpoint's linear weights: ('fp8-block', (bn, bk)), ('fp8', None),
    ('int4-group', g), ('int8-group', g) or (None, None) for unquantized ones."""
    cfg = _text_config(config)
    qc = cfg.get("quantization_config") or {}
    method = qc.get("quant_method")
    if method == "fp8":
        block = qc.get("weight_block_size")
        return ("fp8-block", tuple(block)) if block else ("fp8", None)
    if method == "compressed-tensors":
        for group in (qc.get("config_groups") or {}).values():
            w = (group or {}).get("weights") or {}
            bits = w.get("num_bits")
            if w.get("type", "int") == "int" and bits in (4, 8):
                return ("int%d-group" % bits, w.get("group_size") or 128)
    if method is not None:
        raise PlanError("estimating weights from config.json: quantization method %r is not "
                        "supported (fp8, compressed-tensors int4/int8); give the weights size"
                        % method)
    return (None, None)


def _linear_bytes(rows, cols, scheme, dtype_bytes):
    """Bytes of one linear layer's weight (rows x cols) stored the way vLLM holds it."""
    kind, group = scheme
    n = rows * cols
    if kind == "fp8-block":
        bn, bk = group
        return n + 4 * int(math.ceil(rows / float(bn))) * int(math.ceil(cols / float(bk)))
    if kind == "fp8":
        return n + 4 * rows
    if kind in ("int4-group", "int8-group"):
        bits = 4 if kind == "int4-group" else 8
        return n * bits // 8 + dtype_bytes * rows * int(math.ceil(cols / float(group)))
    return n * dtype_bytes


def estimate_weights_bytes(config):
    """Weight bytes of the whole model as vLLM holds them in GPU memory, from config.json alone
    (for dummy weights, or before a download). Dense decoders (Llama-like), MoE with
    grouped-query attention (MiniMax-M2, Mixtral, Qwen-MoE) and MLA + MoE (DeepSeek-V3, Kimi-K2)
    are counted layer by layer; FP8 (per-tensor or 128x128 blocks with fp32 scales) and
    compressed-tensors INT4/INT8 group quantization apply to the routed experts and, where the
    checkpoint does not exclude them, the attention and dense projections. Embeddings, norms,
    routers and the LM head stay in the model dtype."""
    cfg = _text_config(config)
    arch = architecture(config)
    dt = model_dtype_bytes(config)
    scheme = _quant_scheme(config)
    qc = cfg.get("quantization_config") or {}
    ignore = [str(x) for x in (qc.get("ignore") or qc.get("modules_to_not_convert") or [])]

    def excluded(name):
        for pat in ignore:
            if pat.startswith("re:"):
                if re.match(pat[3:], name):
                    return True
            elif name == pat or name.endswith("." + pat) or ("." + pat + ".") in name:
                return True
        return False

    def lin(name, rows, cols):
        return _linear_bytes(rows, cols, (None, None) if excluded(name) else scheme, dt)

    h = _int_field(cfg, "hidden_size", required=True)
    vocab = _int_field(cfg, "vocab_size", required=True)
    inter = _int_field(cfg, "intermediate_size", default=0) or 0
    heads, kv_heads, hd = arch["heads"], arch["kv_heads"], arch["head_dim"]
    experts = arch["experts"]
    moe_inter = arch["moe_intermediate_size"] or 0
    shared = _int_field(cfg, "n_shared_experts", default=0) or 0
    shared_inter = _int_field(cfg, "shared_intermediate_size", default=0) or 0
    first_dense = _int_field(cfg, "first_k_dense_replace", default=0) or 0
    total = vocab * h * dt + h * dt  # embeddings, final norm
    if not cfg.get("tie_word_embeddings"):
        total += lin("lm_head", vocab, h)
    for i in range(arch["layers"]):
        p = "model.layers.%d." % i
        total += 2 * h * dt  # input and post-attention norms
        if arch["mla"]:
            ql = _int_field(cfg, "q_lora_rank", default=0) or 0
            nope = _int_field(cfg, "qk_nope_head_dim", default=hd) or hd
            rope = arch["qk_rope_head_dim"]
            vh = _int_field(cfg, "v_head_dim", default=hd) or hd
            kvl = arch["kv_lora_rank"]
            a = p + "self_attn."
            if ql:
                total += lin(a + "q_a_proj", ql, h) + ql * dt
                total += lin(a + "q_b_proj", heads * (nope + rope), ql)
            else:
                total += lin(a + "q_proj", heads * (nope + rope), h)
            total += lin(a + "kv_a_proj_with_mqa", kvl + rope, h) + kvl * dt
            total += lin(a + "kv_b_proj", heads * (nope + vh), kvl)
            # vLLM's MLA keeps W_UK and W_UV, split from kv_b_proj, beside it in the model dtype
            total += heads * (nope + vh) * kvl * dt
            total += lin(a + "o_proj", h, heads * vh)
        else:
            a = p + "self_attn."
            total += lin(a + "q_proj", heads * hd, h) + 2 * lin(a + "k_proj", kv_heads * hd, h)
            total += lin(a + "o_proj", h, heads * hd)
            if cfg.get("use_qk_norm") or cfg.get("qk_norm_type"):
                total += (heads + kv_heads) * hd * dt
        m = p + "mlp."
        if experts and i >= first_dense:
            total += h * experts * dt + experts * 4  # router and its score-correction bias
            e = m + "experts.0."
            total += experts * (2 * lin(e + "gate_proj", moe_inter, h) + lin(e + "down_proj", h, moe_inter))
            s_inter = shared * moe_inter or shared_inter
            if s_inter:
                sp = m + "shared_experts."
                total += 2 * lin(sp + "gate_proj", s_inter, h) + lin(sp + "down_proj", h, s_inter)
        elif inter:
            total += 2 * lin(m + "gate_proj", inter, h) + lin(m + "down_proj", h, inter)
    return int(total)


# ----------------------------------------------------------------------------- rules

def _tp_candidates(limit):
    t, out = 1, []
    while t <= limit:
        out.append(t)
        t *= 2
    return out


def _moe_block_ok(arch, block, tp):
    inter = arch["moe_intermediate_size"]
    if inter % tp:
        return False
    shard = inter // tp
    return shard % block[0] == 0 and shard % block[1] == 0


def _check_layout(arch, quant, tp, pp, dp, ep, gpu_count):
    refusals, warnings = [], []
    used = tp * pp * dp
    if used > gpu_count:
        refusals.append("tensor_parallel %d x pipeline_parallel %d x data_parallel %d = %d GPUs, "
                        "but gpu_count is %d" % (tp, pp, dp, used, gpu_count))
    if arch["heads"] % tp:
        refusals.append("num_attention_heads %d is not divisible by tensor_parallel %d"
                        % (arch["heads"], tp))
    if not arch["mla"]:
        kv = arch["kv_heads"]
        if kv >= tp and kv % tp:
            refusals.append("num_key_value_heads %d is not divisible by tensor_parallel %d"
                            % (kv, tp))
        elif kv < tp and tp % kv:
            refusals.append("tensor_parallel %d is not a multiple of num_key_value_heads %d "
                            "(each KV head must be replicated a whole number of times)"
                            % (tp, kv))
        elif kv < tp:
            warnings.append("num_key_value_heads %d < tensor_parallel %d: each KV head is "
                            "replicated on %d GPUs" % (kv, tp, tp // kv))
    if pp > arch["layers"]:
        refusals.append("pipeline_parallel %d is larger than num_hidden_layers %d"
                        % (pp, arch["layers"]))

    block = quant["weight_block_size"]
    if arch["experts"] and block and arch["moe_intermediate_size"] and not ep \
            and not _moe_block_ok(arch, block, tp):
        inter = arch["moe_intermediate_size"]
        good = [t for t in _tp_candidates(max(gpu_count, tp))
                if t < tp and arch["heads"] % t == 0 and _moe_block_ok(arch, block, t)]
        hint = "enable expert parallel (tensor_parallel %d + expert parallel)" % tp
        if good:
            hint += " or use tensor_parallel %s" % " / ".join(str(t) for t in reversed(good))
        refusals.append(
            "MoE intermediate_size %d / tensor_parallel %d = %s is not a multiple of the FP8 "
            "weight block %d (weight_block_size %s): %s"
            % (inter, tp, ("%g" % (inter / float(tp))), block[0], block, hint))
    if ep and arch["experts"] and arch["experts"] % (tp * dp):
        warnings.append("%d experts do not split evenly over %d expert-parallel ranks"
                        % (arch["experts"], tp * dp))
    if ep and not arch["experts"]:
        warnings.append("expert parallel requested but the model has no experts")
    if ep and dp > 1:
        warnings.append("data parallel + expert parallel: experts are also split over the %d "
                        "DP ranks; weights per GPU shown are an upper bound" % dp)
    return refusals, warnings


def _num(name, value, minimum=None, integer=False, maximum=None):
    ok_type = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, ok_type):
        raise PlanError("%s must be %s, got %r"
                        % (name, "an integer" if integer else "a number", value))
    if minimum is not None and value < minimum:
        raise PlanError("%s must be >= %s, got %s" % (name, minimum, value))
    if maximum is not None and value > maximum:
        raise PlanError("%s must be <= %s, got %s" % (name, maximum, value))
    return value


# ----------------------------------------------------------------------------- plan

def plan(config, weights_bytes, gpu_memory_bytes, gpu_count, tensor_parallel=1,
         pipeline_parallel=1, data_parallel=1, expert_parallel=False, kv_cache_dtype="auto",
         gpu_memory_utilization=0.9, max_model_len=None, hf_quant_config=None, dtype=None,
         reserve_bytes=DEFAULT_RESERVE_BYTES, block_size=DEFAULT_BLOCK_SIZE, strict=True):
    """Plan a deployment. Returns a :class:`Plan`; raises :class:`PlanError` when the layout is
    refused (or, with ``strict=False``, returns the Plan with ``refusals`` filled in; numbers
    that cannot be computed are then 0)."""
    tp = _num("tensor_parallel", tensor_parallel, 1, integer=True)
    pp = _num("pipeline_parallel", pipeline_parallel, 1, integer=True)
    dp = _num("data_parallel", data_parallel, 1, integer=True)
    gpu_count = _num("gpu_count", gpu_count, 1, integer=True)
    weights_bytes = _num("weights_bytes", weights_bytes, 1)
    gpu_memory_bytes = _num("gpu_memory_bytes", gpu_memory_bytes, 1)
    util = _num("gpu_memory_utilization", gpu_memory_utilization, 0.01, maximum=1.0)
    reserve_bytes = _num("reserve_bytes", reserve_bytes, 0)
    block_size = _num("block_size", block_size, 1, integer=True)
    if not isinstance(expert_parallel, bool):
        raise PlanError("expert_parallel must be true or false, got %r" % (expert_parallel,))
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise PlanError("kv_cache_dtype %r is not one of %s"
                        % (kv_cache_dtype, ", ".join(sorted(KV_CACHE_DTYPES))))

    arch = architecture(config)
    quant = quantization_info(config, hf_quant_config)
    refusals, warnings = _check_layout(arch, quant, tp, pp, dp, expert_parallel, gpu_count)

    # KV dtype: a checkpoint-declared FP8 KV scheme wins over the flag (vllm#34752).
    effective = kv_cache_dtype
    if quant["forced_kv_dtype"]:
        if kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3"):
            warnings.append("the checkpoint declares an FP8 KV cache, so vLLM ignores "
                            "kv_cache_dtype %r; planning with fp8 (edit the quantization "
                            "config to change it)" % kv_cache_dtype)
        effective = quant["forced_kv_dtype"]
    kv_dtype_bytes = KV_CACHE_DTYPES[effective] or model_dtype_bytes(config, dtype)
    if effective == "auto":
        effective = "auto (%d bytes)" % kv_dtype_bytes

    model_max = arch["max_len"]
    if max_model_len is None:
        if model_max is None:
            raise PlanError("max_model_len is not set and config.json has no "
                            "max_position_embeddings to default to")
        max_model_len = model_max
    max_model_len = _num("max_model_len", max_model_len, 1, integer=True)
    if model_max is not None and max_model_len > model_max:
        refusals.append("max_model_len %d is above the model's limit %d "
                        "(max_position_embeddings)" % (max_model_len, model_max))
    if arch["partial_attention"]:
        warnings.append("config declares sliding-window or mixed layer types; every layer is "
                        "counted as full attention, so the KV capacity is a lower bound")

    kv_total, kv_gpu = kv_bytes_per_token(arch, kv_dtype_bytes, tp, pp)
    weights_per_gpu = int(math.ceil(weights_bytes / float(tp * pp)))
    budget = int(gpu_memory_bytes * util)
    kv_mem = budget - weights_per_gpu - int(reserve_bytes)
    capacity = 0
    if kv_mem <= 0:
        need = weights_per_gpu + reserve_bytes
        min_gpus = _min_gpus(weights_bytes, budget, reserve_bytes)
        refusals.append(
            "weights %.2f GiB per GPU (%.1f GB split over tensor_parallel %d x pipeline_parallel %d) "
            "+ reserve %.2f GiB = %.2f GiB do not fit in gpu_memory_utilization %.2f x %.2f GiB "
            "= %.2f GiB per GPU; %s"
            % (weights_per_gpu / float(GIB), weights_bytes / float(GB), tp, pp,
               reserve_bytes / float(GIB), need / float(GIB), util,
               gpu_memory_bytes / float(GIB), budget / float(GIB),
               ("the weights need at least %d GPUs of this size" % min_gpus) if min_gpus
               else "the reserve alone is larger than the budget"))
        kv_mem = 0
    else:
        capacity = (kv_mem // kv_gpu) // block_size * block_size
        if capacity < max_model_len:
            refusals.append(
                "KV cache holds %d tokens (%.2f GiB per GPU / %d bytes per token per GPU), "
                "less than max_model_len %d: lower max_model_len, raise "
                "gpu_memory_utilization or use more GPUs"
                % (capacity, kv_mem / float(GIB), kv_gpu, max_model_len))

    result = Plan(
        model_type=arch["model_type"], attention="mla" if arch["mla"] else "mha/gqa",
        tensor_parallel=tp, pipeline_parallel=pp, data_parallel=dp,
        expert_parallel=expert_parallel, gpus_used=tp * pp * dp,
        gpu_memory_bytes=int(gpu_memory_bytes), gpu_memory_utilization=util,
        weights_bytes=int(weights_bytes), weights_per_gpu_bytes=weights_per_gpu,
        reserve_per_gpu_bytes=int(reserve_bytes), kv_cache_dtype=effective,
        kv_bytes_per_token=kv_total, kv_bytes_per_token_per_gpu=kv_gpu,
        kv_memory_per_gpu_bytes=int(kv_mem), kv_capacity_tokens=int(capacity),
        kv_capacity_tokens_total=int(capacity) * dp, max_model_len=max_model_len,
        model_max_len=model_max or 0,
        max_concurrency=round(capacity / float(max_model_len), 2),
        max_concurrency_total=round(capacity * dp / float(max_model_len), 2),
        warnings=warnings, refusals=refusals)
    if refusals and strict:
        raise PlanError(refusals, warnings)
    return result


def _min_gpus(weights_bytes, budget, reserve_bytes):
    """Smallest power-of-two GPU count whose share of the weights fits next to the reserve."""
    room = budget - reserve_bytes
    if room <= 0:
        return 0
    n = 1
    while weights_bytes / float(n) > room and n < 1024:
        n *= 2
    return n
