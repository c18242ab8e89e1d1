"""NCCL / vLLM environment from the GPU topology, and the GPU host preflight checks.

Pure Python. derive() turns (topology class, workload profile, GPU count, user overrides) into
an environment where every variable carries a one-line reason, so users can see why it is set.
The preflight functions return messages that name the variable to change and the numbers.

Profiles (after the community RTX PRO 6000 NCCL tuning, github.com/local-inference-lab/rtx6kpro
optimization/nccl-tuning.md, which reports on MiniMax-M2.5 90 vs 70 tok/s for one request with
P2P on, 5,000 vs 10,000 tok/s for 100 requests with P2P off: the right environment depends on
the workload):
  latency     P2P on, P2P level matched to the topology, a few more channels: best for few
              concurrent requests.
  throughput  on PCIe, P2P off with more channels and larger buffers: best under high
              concurrency. On NVLink P2P stays on: NVLink is what carries the traffic (measured
              on 2x H200: 267 GB/s bus bandwidth with P2P, 27 GB/s with NCCL_P2P_DISABLE=1;
              tests/fixtures/nvidia-smi/h200-x2/smoke-*.txt).
"""
from __future__ import annotations

import re

PROFILES = ("latency", "throughput")
CLASSES = ("nvlink", "pcie-switch", "pcie-host-bridge", "cross-numa", "no-p2p", "single-gpu")

# Peer-to-peer level that still allows P2P for every pair of the class (NCCL_P2P_LEVEL
# takes LOC/NVL/PIX/PXB/PHB/SYS; strings, not the old numbers).
_P2P_LEVEL = {"nvlink": "NVL", "pcie-switch": "PXB", "pcie-host-bridge": "PHB", "cross-numa": "SYS"}

_THROUGHPUT_PCIE = (
    ("NCCL_P2P_DISABLE", "1",
     "throughput profile on PCIe: P2P off, NCCL copies through host memory, which scales "
     "better under many concurrent requests"),
    ("NCCL_MIN_NCHANNELS", "32", "throughput profile: more channels to keep PCIe links busy"),
    ("NCCL_MAX_NCHANNELS", "64", "throughput profile: cap channels at 64"),
    ("NCCL_BUFFSIZE", "67108864", "throughput profile: 64 MiB buffers for large messages"),
    ("CUDA_DEVICE_MAX_CONNECTIONS", "64",
     "throughput profile: more hardware work queues for the extra channels"),
)

_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def derive(topology_class, profile, gpu_count, overrides=None):
    """Environment for the vLLM unit. Returns {"env", "reasons", "vllm_args", "summary"}.

    env: {NAME: "value"}; reasons: {NAME: "one line"} (a removed variable keeps the reason
    "removed by override"); vllm_args: extra vLLM CLI arguments ({arg: reason}), derived from
    the final env; overrides ({NAME: value or None}) win: a value replaces or adds, None removes.
    """
    if topology_class not in CLASSES:
        raise ValueError("topology class %r is not one of %s" % (topology_class, ", ".join(CLASSES)))
    if profile not in PROFILES:
        raise ValueError("nccl profile %r is not one of %s" % (profile, ", ".join(PROFILES)))
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 0:
        raise ValueError("gpu_count must be an integer >= 0 (got %r)" % (gpu_count,))
    overrides = overrides or {}
    if not isinstance(overrides, dict):
        raise ValueError("NCCL overrides must be a mapping of NAME: value (got %s)"
                         % type(overrides).__name__)

    env, reasons, vllm_args = {}, {}, {}

    def put(name, value, reason):
        env[name] = value
        reasons[name] = reason

    if topology_class == "single-gpu" or gpu_count <= 1:
        summary = ("%d GPU(s) in the set: no traffic between GPUs, no NCCL variables needed"
                   % gpu_count)
    else:
        put("NCCL_IB_DISABLE", "1",
            "single box: no InfiniBand between the GPUs of one host, skip probing it")
        if topology_class == "nvlink":
            # NCCL picks NVLink by itself; P2P_LEVEL=NVL only stops it from using PCIe P2P
            # between GPUs that are not NVLink peers. Same for both profiles (see module doc).
            put("NCCL_P2P_LEVEL", "NVL",
                "NVLink between every pair: P2P over NVLink only, never over PCIe")
            summary = ("nvlink: NCCL defaults over NVLink; P2P stays on in the %s profile "
                       "because NVLink carries the traffic" % profile)
        elif topology_class == "no-p2p":
            put("NCCL_P2P_DISABLE", "1",
                "nvidia-smi reports P2P not available between these GPUs: P2P off so NCCL "
                "does not try it")
            if profile == "throughput":
                for name, value, reason in _THROUGHPUT_PCIE[1:]:
                    put(name, value, reason)
            summary = "no-p2p: P2P off; %s profile" % profile
        elif profile == "latency":
            level = _P2P_LEVEL[topology_class]
            put("NCCL_P2P_LEVEL", level,
                "latency profile on %s: allow P2P up to %s so every pair talks directly"
                % (topology_class, level))
            put("NCCL_MIN_NCHANNELS", "8",
                "latency profile: a few more channels than NCCL's PCIe default")
            summary = "%s, latency profile: P2P on (level %s)" % (topology_class, level)
        else:
            for name, value, reason in _THROUGHPUT_PCIE:
                put(name, value, reason)
            summary = "%s, throughput profile: P2P off, more channels and buffers" % topology_class

    for name, value in sorted(overrides.items(), key=lambda item: str(item[0])):
        if not isinstance(name, str) or not _VAR_RE.match(name):
            raise ValueError("NCCL override name %r is not an environment variable name" % (name,))
        if value is None:
            env.pop(name, None)
            reasons[name] = "removed by override"
        else:
            if isinstance(value, bool):
                value = "1" if value else "0"
            env[name] = str(value)
            reasons[name] = "set by override"
    if env.get("NCCL_P2P_DISABLE") == "1" and gpu_count > 1:
        vllm_args["--disable-custom-all-reduce"] = (
            "vLLM's custom all-reduce uses CUDA P2P directly, which NCCL_P2P_DISABLE does "
            "not stop")
    return {"env": env, "reasons": reasons, "vllm_args": vllm_args, "summary": summary}


# --------------------------------------------------------------------------- preflight
# Minimum Linux x86_64 driver for each CUDA toolkit release (GA of each minor), as NVIDIA
# publishes it with each CUDA toolkit release:
#   13.2 GA >=595.45.04, 13.1 GA >=590.44.01, 13.0 GA >=580.65.06, 12.9 GA >=575.51.03,
#   12.8 GA >=570.26 (12.8 Update 1 >=570.124.06), 12.6 GA >=560.28.03, 12.5 GA >=555.42.02,
#   12.4 GA >=550.54.14, 12.3 GA >=545.23.06, 12.2 GA >=535.54.03, 12.1 GA >=530.30.02,
#   12.0 GA >=525.60.13.
# Minor-version compatibility (docs.nvidia.com/deploy/cuda-compatibility) lets some 12.x
# programs run on >=525 with limited features; the preflight asks for the table's minimum.
CUDA_MIN_DRIVER = {
    (13, 2): "595.45.04", (13, 1): "590.44.01", (13, 0): "580.65.06",
    (12, 9): "575.51.03", (12, 8): "570.26", (12, 6): "560.28.03", (12, 5): "555.42.02",
    (12, 4): "550.54.14", (12, 3): "545.23.06", (12, 2): "535.54.03", (12, 1): "530.30.02",
    (12, 0): "525.60.13",
}
# Blackwell is compute capability 10.x (B200/GB200), 11.x (Thor) and 12.x (RTX 50, RTX PRO
# 6000); NVIDIA ships these GPUs for the open kernel modules only (driver installation guide,
# "Kernel Modules"; the open flavour is the default since R560).
BLACKWELL_MIN_CC_MAJOR = 10


def version_tuple(version):
    """"580.65.06" -> (580, 65, 6); raises ValueError on anything else."""
    if not isinstance(version, str) or not re.match(r"^\d+(\.\d+)*$", version.strip()):
        raise ValueError("%r is not a dotted version number" % (version,))
    return tuple(int(p) for p in version.strip().split("."))


def min_driver_for_cuda(cuda_version):
    """Minimum driver for a CUDA "MAJOR.MINOR[.PATCH]"; ValueError for an unknown release."""
    parts = version_tuple(str(cuda_version))
    if len(parts) < 2:
        raise ValueError("CUDA version %r needs MAJOR.MINOR" % (cuda_version,))
    key = parts[:2]
    if key not in CUDA_MIN_DRIVER:
        raise ValueError("no known minimum driver for CUDA %d.%d (known: %s)" % (
            key[0], key[1], ", ".join("%d.%d" % k for k in sorted(CUDA_MIN_DRIVER))))
    return CUDA_MIN_DRIVER[key]


def check_driver(driver_version, cuda_version, cuda_var="gpu_host_cuda_version"):
    """[] when the driver can run the CUDA release, else one message naming cuda_var."""
    try:
        need = min_driver_for_cuda(cuda_version)
    except ValueError as exc:
        return ["%s=%s: %s" % (cuda_var, cuda_version, exc)]
    if not driver_version:
        return ["no NVIDIA driver found, %s=%s needs driver >= %s" % (cuda_var, cuda_version, need)]
    if version_tuple(driver_version) < version_tuple(need):
        return ["driver %s is too old for %s=%s (needs >= %s): upgrade the driver or lower %s"
                % (driver_version, cuda_var, cuda_version, need, cuda_var)]
    return []


def check_kernel_module(gpus, kernel_module):
    """Blackwell GPUs need the open kernel module: [] or one message."""
    blackwell = [g for g in gpus or [] if g.get("compute_cap_major", 0) >= BLACKWELL_MIN_CC_MAJOR]
    if blackwell and kernel_module != "open":
        return ["%s (compute capability %s) needs the open NVIDIA kernel module, host has %s: "
                "install the driver's open flavour (nvidia-open / *-open packages)"
                % (blackwell[0]["name"], blackwell[0]["compute_cap"], kernel_module)]
    return []


def check_gpu_count(gpu_count, tensor_parallel=1, pipeline_parallel=1, data_parallel=1,
                    names=("tensor_parallel", "pipeline_parallel", "data_parallel")):
    """[] when the host has tp*pp*dp GPUs, else one message with the numbers and variables."""
    for name, value in zip(names, (tensor_parallel, pipeline_parallel, data_parallel)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return ["%s must be an integer >= 1 (got %r)" % (name, value)]
    need = tensor_parallel * pipeline_parallel * data_parallel
    if need > gpu_count:
        return ["%s %d x %s %d x %s %d = %d GPUs, host has %d: lower %s"
                % (names[0], tensor_parallel, names[1], pipeline_parallel, names[2],
                   data_parallel, need, gpu_count, " or ".join(names))]
    return []


PARALLEL_NAMES = ("tensor_parallel", "pipeline_parallel", "data_parallel")


def check_gpu_set(gpus, facts, tensor_parallel=1, pipeline_parallel=1, data_parallel=1,
                  names=PARALLEL_NAMES, gpus_var="gpus", host="this host"):
    """[] when a declared GPU list (``gpus``; empty = every GPU, nothing to check) fits the
    parallel layout and the host's GPUs, else one message per problem, naming the variables:
    an index listed twice or negative; a list the tensor-parallel size does not divide (each
    tensor-parallel group takes that many GPUs of the list); fewer GPUs than tp x pp x dp; a
    list on a host without GPUs, or with an index the host does not have."""
    if not gpus:
        return []
    shown = "%s=%s" % (gpus_var, list(gpus))
    errors = []
    twice = sorted(set(g for g in gpus if list(gpus).count(g) > 1))
    if twice:
        errors.append("%s lists GPU %s more than once" % (shown, ", ".join(map(str, twice))))
    negative = [g for g in gpus if g < 0]
    if negative:
        errors.append("%s: GPU indices are >= 0 (got %s)" % (shown, ", ".join(map(str, negative))))
    count = len(set(gpus))
    layout = (tensor_parallel, pipeline_parallel, data_parallel)
    if all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in layout):
        tp = tensor_parallel
        need = tensor_parallel * pipeline_parallel * data_parallel
        if count % tp:
            errors.append("%s declares %d GPUs, which %s %d does not divide (each tensor-parallel "
                          "group takes %d GPUs of the list): list a multiple of %d GPUs, or set "
                          "%s to a size that divides %d"
                          % (shown, count, names[0], tp, tp, tp, names[0], count))
        if need > count:
            errors.append("%s %d x %s %d x %s %d = %d GPUs, but %s declares %d: list more GPUs "
                          "or lower %s"
                          % (names[0], tensor_parallel, names[1], pipeline_parallel, names[2],
                             data_parallel, need, shown, count, " or ".join(names)))
    if not facts.get("present"):
        errors.append("%s has no NVIDIA GPU (%s) but %s declares %d: set %s: [] (every GPU) for "
                      "this host" % (host, facts.get("nvidia_smi_error") or "nvidia-smi listed none",
                                     shown, count, gpus_var))
    else:
        have = [g.get("index") for g in facts.get("gpus") or []]
        absent = [g for g in gpus if g >= 0 and g not in have]
        if absent:
            errors.append("%s: %s has no GPU %s (its GPUs: %s)"
                          % (shown, host, ", ".join(map(str, absent)),
                             ", ".join(map(str, have))))
    return errors


def preflight(facts, cuda_version=None, tensor_parallel=1, pipeline_parallel=1, data_parallel=1,
              host="this host", cuda_var="gpu_host_cuda_version", require_gpu=True,
              parallel_names=PARALLEL_NAMES, profile_var="the profile", profile_name=None):
    """All GPU host checks on gpu_facts (see gpu_facts module). Returns a list of messages.

    cuda_var, parallel_names (tp, pp, dp) and profile_var are the variable names the messages
    tell the user to change (a role passes its own, e.g. gpu_host_tensor_parallel);
    profile_name is the chosen profile's name, quoted in the no-GPU message.
    """
    if not facts.get("present"):
        if require_gpu:
            if profile_name:
                subject = "%s %s" % (profile_var, profile_name)
                advice = "set %s to a CPU profile for %s" % (profile_var, host)
            else:
                subject, advice = profile_var, "use a CPU profile for %s" % host
            return ["%s has no NVIDIA GPU (gpu_facts.present is false: %s) but %s needs "
                    "%d GPU(s): %s, or install the driver"
                    % (host, facts.get("nvidia_smi_error") or "nvidia-smi listed no GPU",
                       subject, tensor_parallel * pipeline_parallel * data_parallel, advice)]
        return []
    errors = []
    if cuda_version:
        errors += check_driver(facts.get("driver_version"), cuda_version, cuda_var)
    errors += check_kernel_module(facts.get("gpus"), facts.get("kernel_module"))
    errors += check_gpu_count(facts.get("count", 0), tensor_parallel, pipeline_parallel,
                              data_parallel, names=tuple(parallel_names))
    return ["%s: %s" % (host, e) for e in errors]
