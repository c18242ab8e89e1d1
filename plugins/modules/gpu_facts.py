#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: NVIDIA GPU, topology and P2P host facts (read only)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU, topology and P2P-related host facts
description:
  - Runs C(nvidia-smi --query-gpu=...), plain C(nvidia-smi) (CUDA version), C(nvidia-smi topo -m),
    C(nvidia-smi topo -p2p r) and C(nvidia-smi topo -p2p n), and reads the host state that decides
    whether PCIe peer-to-peer works - C(/proc/cmdline) (IOMMU mode), C(/sys/kernel/iommu_groups),
    C(lspci -vvv) ACSCtl lines, C(/sys/module/nvidia_uvm/parameters/uvm_disable_hmm), and the
    kernel module flavour (C(/proc/driver/nvidia/version), else C(modinfo nvidia)).
  - Returns C(ansible_facts.gpu_facts) with the GPUs, versions and the topology class of the GPU set
    (C(nvlink), C(pcie-switch), C(pcie-host-bridge), C(cross-numa), C(no-p2p), or C(single-gpu))
    with the evidence for it, plus the NCCL/vLLM environment derived for I(nccl_profile).
  - A host without C(nvidia-smi), or where it fails, gives C(present=false) and is not an error;
    the caller decides (with I(require_gpu=true) it gets a preflight error naming the host).
  - Output nvidia-smi prints that the parsers do not recognise fails the task with the raw line.
  - Read only; supports check mode. C(lspci -vvv) needs root to show ACS capability lines.
options:
  nvidia_smi:
    description: nvidia-smi executable (name looked up on PATH, or a path).
    type: str
    default: nvidia-smi
  gpus:
    description:
      - GPU indices whose set is classified (the tensor-parallel peers). Default all.
      - A list is checked (into C(preflight_errors)) against the parallel layout (the tensor-parallel size
        divides its length; tp x pp x dp GPUs at most) and the host (a host without GPUs, or an index it
        lacks, is refused).
    type: list
    elements: int
  nccl_profile:
    description: Workload profile for the derived NCCL environment.
    type: str
    choices: [latency, throughput]
    default: latency
  nccl_overrides:
    description: Variables that replace the derived ones; a null value removes that variable.
    type: dict
    default: {}
  cuda_version:
    description: CUDA release (C(13.0)) to check the driver against; no driver check when unset.
    type: str
  tensor_parallel:
    description: Tensor-parallel size the host must serve (preflight GPU count).
    type: int
    default: 1
  pipeline_parallel:
    description: Pipeline-parallel size (preflight GPU count).
    type: int
    default: 1
  data_parallel:
    description: Data-parallel size (preflight GPU count).
    type: int
    default: 1
  require_gpu:
    description: The host must have a GPU; a host without one gets a preflight error naming it.
    type: bool
    default: false
  host_name:
    description: Name of the host in preflight messages (e.g. C(inventory_hostname)). Default the
      host's node name.
    type: str
  variable_names:
    description:
      - Names the preflight messages tell the user to change, keyed by C(cuda_version),
        C(tensor_parallel), C(pipeline_parallel), C(data_parallel), C(gpus), C(nccl_overrides) and C(profile) (a role passes
        its own variables, e.g. C(gpu_host_tensor_parallel)). Missing keys keep the option name.
    type: dict
    default: {}
  profile_name:
    description: Name of the model profile, quoted in the no-GPU preflight message.
    type: str
notes:
  - Preflight problems are returned in C(gpu_facts.preflight_errors), not raised; the caller fails.
extends_documentation_fragment:
  - vllm_ops.deploy.attributes
  - vllm_ops.deploy.attributes.PLATFORM
  - vllm_ops.deploy.attributes.FACTS
  - vllm_ops.deploy.attributes.INFO
author:
  - vllm-deploy contributors (@vllm-ops)
"""

EXAMPLES = r"""
- name: Read GPU facts
  vllm_ops.deploy.gpu_facts:
    nccl_profile: throughput
    cuda_version: "13.0"
    tensor_parallel: 2
    require_gpu: true

- name: Refuse a GPU profile on a host without GPUs
  ansible.builtin.assert:
    that: ansible_facts.gpu_facts.preflight_errors | length == 0
    fail_msg: "{{ ansible_facts.gpu_facts.preflight_errors | join('; ') }}"

- name: Keep P2P on, whatever the profile says
  vllm_ops.deploy.gpu_facts:
    nccl_profile: throughput
    nccl_overrides:
      NCCL_P2P_DISABLE: null
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: always
  type: dict
  contains:
    gpu_facts:
      description: GPU facts.
      type: dict
      contains:
        present: {description: nvidia-smi listed at least one GPU, type: bool}
        count: {description: Number of GPUs, type: int}
        gpus:
          description: One dict per GPU - index, name, uuid, memory_total_mib, memory_used_mib,
            compute_cap, compute_cap_major, driver_version, persistence_mode, pcie_gen,
            pcie_width, pci_bus_id.
          type: list
          elements: dict
        driver_version: {description: NVIDIA driver version, type: str, sample: 580.159.04}
        cuda_version: {description: Highest CUDA the driver supports, type: str, sample: "13.0"}
        nvidia_smi_error: {description: Why nvidia-smi gave nothing (missing or failing), type: str}
        kernel_module: {description: "open, proprietary or none", type: str}
        iommu: {description: "mode (off|passthrough|on|default), params, groups", type: dict}
        acs: {description: "lspci_available, checked, src_valid_devices, redirecting", type: dict}
        uvm_hmm_disabled: {description: nvidia_uvm uvm_disable_hmm (null when not loaded), type: bool}
        topology:
          description: "class, reason, matrix (topo -m), p2p (topo -p2p r), p2p_nvlink
            (topo -p2p n), evidence (list), risks (host settings that break PCIe P2P)."
          type: dict
        nccl:
          description: Derived environment - env, reasons, vllm_args, summary, profile.
          type: dict
        nccl_no_p2p:
          description: The environment derived for class C(no-p2p) with the same profile, set
            size and overrides (the fallback when an all-reduce over P2P hangs).
          type: dict
        preflight_errors: {description: Messages naming the variable to change, type: list}
"""

import os
import platform

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_ops.deploy.plugins.module_utils.host.gpu_facts import (
    NvidiaSmiParseError, QUERY_GPU_ARGS, build_facts)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.host.nccl_env import (
    check_gpu_set, derive, preflight)


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def _run(module, argv):
    """stdout, or None plus a reason when the command fails."""
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    if rc != 0:
        return None, "`%s` exited %d: %s" % (" ".join(argv), rc, (err or out).strip()[:300])
    return out, None


def collect(module, nvidia_smi):
    outputs = {
        "cmdline": _read("/proc/cmdline"),
        "nvrm_version": _read("/proc/driver/nvidia/version"),
        "uvm_disable_hmm": _read("/sys/module/nvidia_uvm/parameters/uvm_disable_hmm"),
    }
    try:
        outputs["iommu_groups"] = str(len(os.listdir("/sys/kernel/iommu_groups")))
    except OSError:
        outputs["iommu_groups"] = None
    lspci = module.get_bin_path("lspci")
    outputs["lspci"] = (_run(module, [lspci, "-vvv"])[0] or "") if lspci else None
    if not outputs["nvrm_version"]:
        modinfo = module.get_bin_path("modinfo")
        if modinfo:
            outputs["modinfo"] = _run(module, [modinfo, "nvidia"])[0]

    smi = nvidia_smi if os.path.sep in nvidia_smi else module.get_bin_path(nvidia_smi)
    if not smi or not os.path.exists(smi):
        outputs["nvidia_smi_error"] = "%s not found" % nvidia_smi
        return outputs
    outputs["query_gpu"], outputs["nvidia_smi_error"] = _run(module, [smi] + QUERY_GPU_ARGS)
    if outputs["query_gpu"] is None:
        return outputs
    outputs["nvidia_smi"] = _run(module, [smi])[0]
    outputs["topo_m"] = _run(module, [smi, "topo", "-m"])[0]
    outputs["topo_p2p_r"] = _run(module, [smi, "topo", "-p2p", "r"])[0]
    outputs["topo_p2p_n"] = _run(module, [smi, "topo", "-p2p", "n"])[0]
    return outputs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            gpus=dict(type="list", elements="int"),
            nccl_profile=dict(type="str", default="latency", choices=["latency", "throughput"]),
            nccl_overrides=dict(type="dict", default={}),
            cuda_version=dict(type="str"),
            tensor_parallel=dict(type="int", default=1),
            pipeline_parallel=dict(type="int", default=1),
            data_parallel=dict(type="int", default=1),
            require_gpu=dict(type="bool", default=False),
            host_name=dict(type="str"),
            variable_names=dict(type="dict", default={}),
            profile_name=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    names = dict(cuda_version="cuda_version", tensor_parallel="tensor_parallel",
                 pipeline_parallel="pipeline_parallel", data_parallel="data_parallel",
                 profile="the profile", gpus="gpus", nccl_overrides="nccl_overrides")
    unknown = sorted(set(p["variable_names"]) - set(names))
    if unknown:
        module.fail_json(msg="variable_names: unknown keys %s (known: %s)"
                         % (", ".join(unknown), ", ".join(sorted(names))))
    names.update({k: str(v) for k, v in p["variable_names"].items()})
    host = "host %s" % (p["host_name"] or platform.node())
    outputs = collect(module, p["nvidia_smi"])
    set_error = None
    try:
        facts = build_facts(outputs, p["gpus"])
    except NvidiaSmiParseError as exc:
        module.fail_json(msg=str(exc), raw_line=exc.line, command=exc.command)
    except ValueError as exc:  # e.g. a GPU index in `gpus` that the host lacks
        set_error = "%s=%s: %s" % (names["gpus"], p["gpus"], exc)
        facts = build_facts(outputs)
    parallel_names = (names["tensor_parallel"], names["pipeline_parallel"], names["data_parallel"])
    set_errors = check_gpu_set(p["gpus"], facts, p["tensor_parallel"], p["pipeline_parallel"],
                               p["data_parallel"], parallel_names, names["gpus"], host)
    if set_error and not set_errors:
        module.fail_json(msg=set_error)

    topo_class = facts["topology"]["class"] or "single-gpu"
    set_size = len(p["gpus"]) if p["gpus"] else facts["count"]
    try:
        nccl = derive(topo_class, p["nccl_profile"], set_size, p["nccl_overrides"])
        no_p2p = derive("no-p2p", p["nccl_profile"], set_size, p["nccl_overrides"])
    except ValueError as exc:
        module.fail_json(msg="%s: %s" % (names["nccl_overrides"], exc))
    nccl["profile"] = p["nccl_profile"]
    no_p2p["profile"] = p["nccl_profile"]
    facts["nccl"] = nccl
    facts["nccl_no_p2p"] = no_p2p
    facts["preflight_errors"] = preflight(
        facts, p["cuda_version"], p["tensor_parallel"], p["pipeline_parallel"],
        p["data_parallel"], host=host,
        cuda_var=names["cuda_version"], require_gpu=p["require_gpu"],
        parallel_names=parallel_names,
        profile_var=names["profile"], profile_name=p["profile_name"]) + set_errors
    module.exit_json(changed=False, ansible_facts={"gpu_facts": facts})


if __name__ == "__main__":
    main()
