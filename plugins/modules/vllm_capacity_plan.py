#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: plan KV-cache capacity for a vLLM deployment and refuse layouts that cannot
be served. No side effects (reads the model's config files only)."""
from __future__ import absolute_import, division, print_function

DOCUMENTATION = r"""
---
module: vllm_capacity_plan
short_description: Plan weights, KV cache and concurrency of a vLLM deployment (preflight)
description:
  - Reads the model's C(config.json) (and C(hf_quant_config.json) next to it when present),
    the weights' size, the GPU memory and count and the parallel layout, and computes weights
    per GPU, KV-cache bytes per token (MLA latent for DeepSeek-V3 style models), KV capacity
    in tokens at the chosen C(gpu_memory_utilization) and the maximum concurrency at
    C(max_model_len).
  - Fails, before anything changes, when vLLM would refuse the layout or it cannot fit
    (heads vs tensor parallel, FP8 block-quantized MoE slices, too few GPUs, weights too large,
    KV cache below C(max_model_len), C(max_model_len) above the model's limit). The message
    carries the numbers.
  - Changes nothing; supports check mode.
options:
  config_path:
    description: Path of the model's config.json on the host. Mutually exclusive with I(config).
    type: path
  config:
    description: The parsed config.json. Mutually exclusive with I(config_path).
    type: dict
  hf_quant_config_path:
    description:
      - Path of a ModelOpt hf_quant_config.json. Defaults to the file next to I(config_path)
        when it exists.
    type: path
  hf_quant_config:
    description: The parsed hf_quant_config.json.
    type: dict
  weights_dir:
    description:
      - Directory holding the *.safetensors files; their sizes are summed. When no shard is
        there yet, C(metadata.total_size) of model.safetensors.index.json is used.
      - Mutually exclusive with I(weights_bytes).
    type: path
  weights_bytes:
    description: Total size of the weights in bytes.
    type: int
  weights_from_config:
    description:
      - Estimate the weights from config.json alone (layer by layer, with the checkpoint's
        quantization) instead of reading files. For C(--load-format dummy), which loads none,
        or before a download. I(weights_dir) is then not read.
    type: bool
  gpu_memory_bytes:
    description: Memory of one GPU in bytes. Mutually exclusive with I(gpu_memory_mib).
    type: int
  gpu_memory_mib:
    description: Memory of one GPU in MiB (as nvidia-smi reports it, e.g. 97887).
    type: int
  gpu_count:
    description: GPUs available to this instance.
    type: int
    required: true
  tensor_parallel:
    description: Tensor-parallel size.
    type: int
    default: 1
  pipeline_parallel:
    description: Pipeline-parallel size.
    type: int
    default: 1
  data_parallel:
    description: Data-parallel size.
    type: int
    default: 1
  expert_parallel:
    description: Whether MoE layers use expert parallel (C(--enable-expert-parallel)).
    type: bool
    default: false
  kv_cache_dtype:
    description: vLLM's C(--kv-cache-dtype); C(auto) uses the model dtype.
    type: str
    default: auto
  dtype:
    description: Model dtype override (vLLM's C(--dtype)); C(auto) reads config.json.
    type: str
    default: auto
  gpu_memory_utilization:
    description: Fraction of each GPU's memory vLLM may use.
    type: float
    default: 0.9
  max_model_len:
    description: Longest sequence; defaults to the model's max_position_embeddings.
    type: int
  reserve_gib:
    description:
      - Memory per GPU kept out of the KV cache for activations, CUDA graphs and NCCL buffers.
        Raise it when vLLM's log reports less KV cache than the plan.
    type: float
    default: 8.0
  block_size:
    description: KV-cache block size in tokens (capacity is rounded down to whole blocks).
    type: int
    default: 16
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.INFO
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Plan MiniMax-M2.5 on four 96 GB cards
  vllm_ops.deploy.vllm_capacity_plan:
    config_path: /srv/models/MiniMax-M2.5/config.json
    weights_dir: /srv/models/MiniMax-M2.5
    gpu_memory_mib: 97887
    gpu_count: 4
    tensor_parallel: 4
  register: capacity

- name: Show the plan
  ansible.builtin.debug:
    msg: "{{ capacity.plan.kv_capacity_tokens }} KV tokens, {{ capacity.plan.max_concurrency }}x"
"""

RETURN = r"""
plan:
  description: The plan (also returned, as far as it could be computed, when the module fails).
  returned: always
  type: dict
  contains:
    weights_per_gpu_bytes: {description: Weights on each GPU, type: int}
    kv_bytes_per_token: {description: KV bytes per token for the whole model, type: int}
    kv_bytes_per_token_per_gpu: {description: KV bytes per token stored by one GPU, type: int}
    kv_memory_per_gpu_bytes: {description: Memory per GPU left for the KV cache, type: int}
    kv_capacity_tokens: {description: KV-cache capacity of one replica in tokens, type: int}
    kv_capacity_tokens_total: {description: Capacity of all data-parallel replicas, type: int}
    max_concurrency: {description: Sequences of max_model_len one replica holds, type: float}
    kv_cache_dtype: {description: KV dtype planned with (a checkpoint's FP8 scheme wins), type: str}
    warnings: {description: Things to know that do not stop the plan, type: list}
    refusals: {description: Why the layout is refused (empty when it is not), type: list}
  sample:
    weights_per_gpu_bytes: 57500000000
    kv_bytes_per_token_per_gpu: 63488
    kv_capacity_tokens: 414048
    max_concurrency: 2.11
weights_bytes:
  description: Total weights size used for the plan, and how it was found.
  returned: always
  type: dict
"""

import glob
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.service.vllm_capacity_plan import (
    GIB, PlanError, estimate_weights_bytes, plan)


def _read_json(module, path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (IOError, OSError, ValueError) as e:
        module.fail_json(msg="cannot read %s %s: %s" % (what, path, e))


def weights_size(module, weights_dir):
    if not os.path.isdir(weights_dir):
        module.fail_json(msg="weights_dir %s is not a directory" % weights_dir)
    shards = glob.glob(os.path.join(weights_dir, "*.safetensors"))
    if shards:
        return sum(os.path.getsize(p) for p in shards), "%d safetensors files" % len(shards)
    index = os.path.join(weights_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        total = (_read_json(module, index, "weights index").get("metadata") or {}) \
            .get("total_size")
        if isinstance(total, int) and total > 0:
            return total, "metadata.total_size of model.safetensors.index.json"
    module.fail_json(msg="weights_dir %s holds no *.safetensors and no index with "
                         "metadata.total_size; pass weights_bytes" % weights_dir)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config_path=dict(type="path"),
            config=dict(type="dict"),
            hf_quant_config_path=dict(type="path"),
            hf_quant_config=dict(type="dict"),
            weights_dir=dict(type="path"),
            weights_bytes=dict(type="int"),
            weights_from_config=dict(type="bool"),
            gpu_memory_bytes=dict(type="int"),
            gpu_memory_mib=dict(type="int"),
            gpu_count=dict(type="int", required=True),
            tensor_parallel=dict(type="int", default=1),
            pipeline_parallel=dict(type="int", default=1),
            data_parallel=dict(type="int", default=1),
            expert_parallel=dict(type="bool", default=False),
            kv_cache_dtype=dict(type="str", default="auto"),
            dtype=dict(type="str", default="auto"),
            gpu_memory_utilization=dict(type="float", default=0.9),
            max_model_len=dict(type="int"),
            reserve_gib=dict(type="float", default=8.0),
            block_size=dict(type="int", default=16),
        ),
        mutually_exclusive=[("config_path", "config"), ("weights_dir", "weights_bytes"),
                            ("gpu_memory_bytes", "gpu_memory_mib"),
                            ("hf_quant_config_path", "hf_quant_config")],
        required_one_of=[("config_path", "config"),
                         ("weights_dir", "weights_bytes", "weights_from_config"),
                         ("gpu_memory_bytes", "gpu_memory_mib")],
        supports_check_mode=True,
    )
    p = module.params

    config = p["config"]
    quant = p["hf_quant_config"]
    if p["config_path"]:
        config = _read_json(module, p["config_path"], "config")
        sibling = os.path.join(os.path.dirname(p["config_path"]), "hf_quant_config.json")
        if quant is None and not p["hf_quant_config_path"] and os.path.isfile(sibling):
            quant = _read_json(module, sibling, "hf_quant_config")
    if p["hf_quant_config_path"]:
        quant = _read_json(module, p["hf_quant_config_path"], "hf_quant_config")

    if p["weights_from_config"]:
        try:
            total = estimate_weights_bytes(config)
        except PlanError as e:
            module.fail_json(msg="capacity plan: %s" % e)
        how = "estimated from config.json (no weight files are read)"
    elif p["weights_dir"]:
        total, how = weights_size(module, p["weights_dir"])
    else:
        total, how = p["weights_bytes"], "weights_bytes"
    memory = p["gpu_memory_bytes"] if p["gpu_memory_bytes"] is not None \
        else p["gpu_memory_mib"] * 1024 * 1024

    try:
        result = plan(config, total, memory, p["gpu_count"],
                      tensor_parallel=p["tensor_parallel"],
                      pipeline_parallel=p["pipeline_parallel"],
                      data_parallel=p["data_parallel"], expert_parallel=p["expert_parallel"],
                      kv_cache_dtype=p["kv_cache_dtype"], dtype=p["dtype"],
                      gpu_memory_utilization=p["gpu_memory_utilization"],
                      max_model_len=p["max_model_len"], hf_quant_config=quant,
                      reserve_bytes=int(p["reserve_gib"] * GIB), block_size=p["block_size"],
                      strict=False)
    except PlanError as e:
        module.fail_json(msg="capacity plan refused: %s" % e, plan={},
                         weights_bytes=dict(bytes=total, source=how))
    info = dict(plan=result.as_dict(), weights_bytes=dict(bytes=total, source=how),
                changed=False)
    if result.refusals:
        module.fail_json(msg="capacity plan refused: %s" % "; ".join(result.refusals), **info)
    for w in result.warnings:
        module.warn(w)
    module.exit_json(**info)


if __name__ == "__main__":
    main()
