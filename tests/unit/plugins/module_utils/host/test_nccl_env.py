"""nccl_env: derived environment per topology class x profile, overrides, preflight.

Expected environments are hand-written from the community RTX PRO 6000 NCCL profiles
(github.com/local-inference-lab/rtx6kpro, optimization/nccl-tuning.md: latency P2P on with NCCL_MIN_NCHANNELS=8 and a P2P level, throughput P2P off with
32/64 channels, 64 MiB buffers, CUDA_DEVICE_MAX_CONNECTIONS=64).
"""
import os

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.host import gpu_facts as gt
from ansible_collections.vllm_ops.deploy.plugins.module_utils.host import nccl_env as ne

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.dirname(os.path.abspath(__file__)))))), "fixtures", "nvidia-smi")

THROUGHPUT_PCIE = {
    "NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_MIN_NCHANNELS": "32",
    "NCCL_MAX_NCHANNELS": "64", "NCCL_BUFFSIZE": "67108864", "CUDA_DEVICE_MAX_CONNECTIONS": "64",
}
EXPECTED = {
    ("nvlink", "latency"): {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"},
    ("nvlink", "throughput"): {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL"},
    ("pcie-switch", "latency"): {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "PXB",
                                 "NCCL_MIN_NCHANNELS": "8"},
    ("pcie-host-bridge", "latency"): {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "PHB",
                                      "NCCL_MIN_NCHANNELS": "8"},
    ("cross-numa", "latency"): {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS",
                                "NCCL_MIN_NCHANNELS": "8"},
    ("pcie-switch", "throughput"): THROUGHPUT_PCIE,
    ("pcie-host-bridge", "throughput"): THROUGHPUT_PCIE,
    ("cross-numa", "throughput"): THROUGHPUT_PCIE,
    ("no-p2p", "latency"): {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1"},
    ("no-p2p", "throughput"): THROUGHPUT_PCIE,
    ("single-gpu", "latency"): {},
    ("single-gpu", "throughput"): {},
}


@pytest.mark.parametrize("cls,profile", sorted(EXPECTED))
def test_each_class_and_profile(cls, profile):
    r = ne.derive(cls, profile, 1 if cls == "single-gpu" else 4)
    assert r["env"] == EXPECTED[(cls, profile)]
    assert set(r["reasons"]) == set(r["env"])
    assert all(isinstance(v, str) and v and "\n" not in v for v in r["reasons"].values())
    p2p_off = r["env"].get("NCCL_P2P_DISABLE") == "1"
    assert ("--disable-custom-all-reduce" in r["vllm_args"]) is p2p_off
    assert "NCCL_SHM_DISABLE" not in r["env"] and "NCCL_CUMEM_ENABLE" not in r["env"]


@pytest.mark.parametrize("cls", ["nvlink", "pcie-switch", "pcie-host-bridge", "cross-numa", "no-p2p"])
@pytest.mark.parametrize("profile", ne.PROFILES)
def test_overrides_win_add_and_remove(cls, profile):
    base = ne.derive(cls, profile, 2)["env"]
    r = ne.derive(cls, profile, 2, {"NCCL_IB_DISABLE": None, "NCCL_DEBUG": "WARN",
                                    "NCCL_MIN_NCHANNELS": 4})
    expected = dict(base)
    del expected["NCCL_IB_DISABLE"]
    expected.update({"NCCL_DEBUG": "WARN", "NCCL_MIN_NCHANNELS": "4"})
    assert r["env"] == expected
    assert r["reasons"]["NCCL_IB_DISABLE"] == "removed by override"
    assert r["reasons"]["NCCL_MIN_NCHANNELS"] == "set by override"


def test_removing_p2p_disable_drops_the_vllm_argument_and_setting_it_adds_it():
    r = ne.derive("pcie-host-bridge", "throughput", 2, {"NCCL_P2P_DISABLE": None})
    assert "NCCL_P2P_DISABLE" not in r["env"] and r["vllm_args"] == {}
    r = ne.derive("nvlink", "latency", 2, {"NCCL_P2P_DISABLE": 1})
    assert r["env"]["NCCL_P2P_DISABLE"] == "1" and "--disable-custom-all-reduce" in r["vllm_args"]
    assert ne.derive("nvlink", "latency", 2, {"NCCL_P2P_DISABLE": True})["env"]["NCCL_P2P_DISABLE"] == "1"


def test_one_gpu_of_a_multi_gpu_class_needs_nothing():
    assert ne.derive("pcie-host-bridge", "throughput", 1)["env"] == {}
    assert ne.derive("single-gpu", "latency", 0)["env"] == {}


@pytest.mark.parametrize("args,needle", [
    (("pcie", "latency", 2), "topology class 'pcie'"),
    (("nvlink", "fast", 2), "nccl profile 'fast'"),
    (("nvlink", "latency", -1), "gpu_count"),
    (("nvlink", "latency", "2"), "gpu_count"),
])
def test_bad_input_names_the_value(args, needle):
    with pytest.raises(ValueError, match=needle):
        ne.derive(*args)
    with pytest.raises(ValueError, match="'bad-name'"):
        ne.derive("nvlink", "latency", 2, {"bad-name": "1"})
    with pytest.raises(ValueError, match="mapping"):
        ne.derive("nvlink", "latency", 2, ["NCCL_DEBUG=INFO"])


def test_derive_from_real_fixture_classes():
    """The class each fixture classifies to yields the environment of that class."""
    def cls_of(machine, p2p=None, mode="r"):
        m = gt.parse_topo_matrix(open(os.path.join(FIX, machine, "nvidia-smi-topo-m.txt")).read())
        p = gt.parse_topo_p2p(open(os.path.join(FIX, machine, p2p)).read(), mode) if p2p else None
        return gt.classify(m, p)["class"]
    assert ne.derive(cls_of("h200-x2", "nvidia-smi-topo-p2p-r.txt"), "latency", 2)["env"] == \
        EXPECTED[("nvlink", "latency")]
    assert ne.derive(cls_of("go-gpuallocator-17-8x4090"), "latency", 8)["env"]["NCCL_P2P_LEVEL"] == "SYS"
    assert ne.derive(cls_of("club-3090-1229-2x5090"), "latency", 2)["env"]["NCCL_P2P_LEVEL"] == "PHB"
    no = ne.derive(cls_of("club-3090-1229-2x5090", "nvidia-smi-topo-p2p-rw.txt", "rw"), "latency", 2)
    assert no["env"]["NCCL_P2P_DISABLE"] == "1"


# ----------------------------------------------------------------------------- preflight
@pytest.mark.parametrize("driver,cuda,ok", [
    ("580.159.04", "13.0", True),    # the H200 fixtures
    ("580.65.06", "13.0", True),     # exactly the minimum
    ("580.65.05", "13.0", False),
    ("575.57.08", "13.0", False),
    ("570.26", "12.8", True),
    ("570.26.0", "12.8.1", True),    # patch of the CUDA version is ignored
    ("565.57.01", "12.8", False),
    ("580.159.04", "13.1", False),   # 13.1 needs 590.44.01
    ("590.44.01", "13.1", True),
    ("580.159.04", "12.4", True),
])
def test_driver_minimums(driver, cuda, ok):
    errors = ne.check_driver(driver, cuda, "gpu_host_cuda_version")
    assert (errors == []) is ok
    if not ok:
        assert "gpu_host_cuda_version=%s" % cuda in errors[0] and driver in errors[0]
        assert ne.min_driver_for_cuda(cuda) in errors[0]


def test_driver_unknown_cuda_and_missing_driver():
    assert "no known minimum driver for CUDA 11.8" in ne.check_driver("580.1", "11.8")[0]
    assert "no NVIDIA driver found" in ne.check_driver(None, "13.0")[0]
    assert "needs MAJOR.MINOR" in ne.check_driver("580.1", "13")[0]
    assert ne.version_tuple("580.65.06") == (580, 65, 6)
    with pytest.raises(ValueError):
        ne.version_tuple("580.x")


def _facts(machine):
    text = open(os.path.join(FIX, machine, "nvidia-smi-query-gpu.txt")).read()
    gpus = gt.parse_query_gpu(text)
    module = gt.parse_kernel_module(open(os.path.join(FIX, machine, "proc-driver-nvidia-version.txt")).read())
    return {"present": True, "count": len(gpus), "gpus": gpus,
            "driver_version": gpus[0]["driver_version"], "kernel_module": module}


def test_preflight_h200_fixtures():
    two = _facts("h200-x2")
    assert ne.preflight(two, "13.0", tensor_parallel=2, host="h200-x2") == []
    errors = ne.preflight(two, "13.1", tensor_parallel=2, pipeline_parallel=2, host="h200-x2")
    assert len(errors) == 2
    assert errors[0].startswith("h200-x2: driver 580.159.04 is too old")
    assert "590.44.01" in errors[0]
    assert "tensor_parallel 2 x pipeline_parallel 2 x data_parallel 1 = 4 GPUs, host has 2" in errors[1]


def test_preflight_blackwell_needs_open_modules():
    # the real H200 CSV line with compute capability 12.0 (RTX PRO 6000 / RTX 50 are 12.x)
    facts = _facts("h200-x1")
    facts["gpus"][0]["compute_cap"], facts["gpus"][0]["compute_cap_major"] = "12.0", 12
    assert ne.preflight(facts, None) == []  # open module on the capture
    facts["kernel_module"] = "proprietary"
    errors = ne.preflight(facts, None, host="box1")
    assert len(errors) == 1 and "open NVIDIA kernel module" in errors[0] and "12.0" in errors[0]


def test_preflight_no_gpu():
    none = {"present": False, "count": 0, "gpus": []}
    errors = ne.preflight(none, "13.0", tensor_parallel=2, host="cpu-demo")
    assert errors == ["cpu-demo has no NVIDIA GPU (gpu_facts.present is false: nvidia-smi "
                      "listed no GPU) but the profile needs 2 GPU(s): use a CPU profile for "
                      "cpu-demo, or install the driver"]
    assert ne.preflight(none, "13.0", require_gpu=False) == []
    none["nvidia_smi_error"] = "nvidia-smi not found"
    errors = ne.preflight(none, None, tensor_parallel=4, host="vd-1",
                          profile_var="vllm_service_profile", profile_name="minimax-m2.5-tp4")
    assert errors == ["vd-1 has no NVIDIA GPU (gpu_facts.present is false: nvidia-smi not "
                      "found) but vllm_service_profile minimax-m2.5-tp4 needs 4 GPU(s): set "
                      "vllm_service_profile to a CPU profile for vd-1, or install the driver"]


def test_preflight_names_the_callers_variables():
    facts = {"present": True, "count": 2, "driver_version": "570.26", "kernel_module": "open",
             "gpus": [{"name": "H200", "compute_cap": "9.0", "compute_cap_major": 9}] * 2}
    names = ("gpu_host_tensor_parallel", "gpu_host_pipeline_parallel", "gpu_host_data_parallel")
    errors = ne.preflight(facts, "13.0", tensor_parallel=4, host="h", parallel_names=names,
                          cuda_var="gpu_host_cuda_version")
    assert len(errors) == 2
    assert "driver 570.26 is too old for gpu_host_cuda_version=13.0 (needs >= 580.65.06)" in errors[0]
    assert ("gpu_host_tensor_parallel 4 x gpu_host_pipeline_parallel 1 x gpu_host_data_parallel 1"
            " = 4 GPUs, host has 2: lower gpu_host_tensor_parallel or") in errors[1]


def test_gpu_count_bad_values():
    assert "tensor_parallel must be an integer >= 1 (got 0)" in ne.check_gpu_count(8, 0)[0]
    assert ne.check_gpu_count(8, 2, 2, 2) == []
    assert "= 16 GPUs, host has 8" in ne.check_gpu_count(8, 4, 2, 2)[0]


def test_gpu_set_against_the_layout_and_the_host():
    names = ("gpu_host_tensor_parallel", "gpu_host_pipeline_parallel", "gpu_host_data_parallel")
    eight = _facts("h200-x2")
    eight["gpus"] = [dict(eight["gpus"][0], index=i) for i in range(8)]
    eight["count"] = 8
    assert ne.check_gpu_set([], eight, 3) == []  # every GPU: nothing declared
    assert ne.check_gpu_set(list(range(8)), eight, 4, 2, 1, names, "gpu_host_gpus", "host b") == []
    errors = ne.check_gpu_set(list(range(8)), eight, 3, 1, 1, names, "gpu_host_gpus", "host b")
    assert errors == ["gpu_host_gpus=[0, 1, 2, 3, 4, 5, 6, 7] declares 8 GPUs, which "
                      "gpu_host_tensor_parallel 3 does not divide (each tensor-parallel group "
                      "takes 3 GPUs of the list): list a multiple of 3 GPUs, or set "
                      "gpu_host_tensor_parallel to a size that divides 8"]
    errors = ne.check_gpu_set([0, 1], eight, 2, 2, 1, names, "gpu_host_gpus", "host b")
    assert errors == ["gpu_host_tensor_parallel 2 x gpu_host_pipeline_parallel 2 x "
                      "gpu_host_data_parallel 1 = 4 GPUs, but gpu_host_gpus=[0, 1] declares 2: "
                      "list more GPUs or lower gpu_host_tensor_parallel or "
                      "gpu_host_pipeline_parallel or gpu_host_data_parallel"]
    errors = ne.check_gpu_set([0, 0, 9], eight, 1, 1, 1, names, "gpu_host_gpus", "host b")
    assert errors == ["gpu_host_gpus=[0, 0, 9] lists GPU 0 more than once",
                      "gpu_host_gpus=[0, 0, 9]: host b has no GPU 9 (its GPUs: 0, 1, 2, 3, 4, 5, 6, 7)"]


def test_gpu_list_on_a_host_without_gpus_is_refused():
    none = {"present": False, "count": 0, "gpus": [], "nvidia_smi_error": "nvidia-smi not found"}
    errors = ne.check_gpu_set([0, 1], none, 2, gpus_var="gpu_host_gpus", host="host cpu-1")
    assert errors == ["host cpu-1 has no NVIDIA GPU (nvidia-smi not found) but gpu_host_gpus=[0, 1] "
                      "declares 2: set gpu_host_gpus: [] (every GPU) for this host"]
