"""gpu_host: the CUDA/NCCL probe script (roles/gpu_host/files/cuda_probe.py) and the
gpu_facts options the role relies on (host_name, variable_names, profile_name, nccl_no_p2p)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from test_gpu_facts import FIX, run_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))))
PROBE = os.path.join(ROOT, "roles", "gpu_host", "files", "cuda_probe.py")
_spec = importlib.util.spec_from_file_location("cuda_probe", PROBE)
cp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cp)

# Printed by nvcc of the nvidia-cuda-nvcc 13.0.88 wheel (PyPI), captured while building this role.
NVCC_13_0_88 = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""


def test_parse_nvcc_version():
    assert cp.parse_nvcc_version(NVCC_13_0_88) == {"release": "13.0", "version": "13.0.88"}
    with pytest.raises(ValueError, match="no 'release X.Y"):
        cp.parse_nvcc_version("nvcc: command not found")


@pytest.mark.parametrize("code, version", [(22809, "2.28.9"), (23203, "2.32.3"),
                                           (20900, "2.9.0"), (2804, "2.8.4")])
def test_nccl_version_codes(code, version):
    assert cp.nccl_code_to_version(code) == version


def test_pip_cuda_home_finds_the_cu13_layout(tmp_path):
    assert cp.pip_cuda_home(str(tmp_path)) is None
    nvcc = tmp_path / "nvidia" / "cu13" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("")
    assert cp.pip_cuda_home(str(tmp_path)) == str(tmp_path / "nvidia" / "cu13")


def test_probe_on_an_interpreter_without_cuda_reports_what_is_missing(tmp_path):
    out = subprocess.run([sys.executable, PROBE, "--packages", "pytest", "nvidia-nccl-cu13",
                          "--nccl-lib", str(tmp_path / "libnccl.so.2")],
                         capture_output=True, text=True, check=True, timeout=60)
    report = json.loads(out.stdout)
    assert report["packages"]["pytest"] == pytest.__version__
    assert report["packages"]["nvidia-nccl-cu13"] is None
    assert report["nccl"]["version"] is None and "libnccl.so.2" in report["nccl"]["error"]
    assert report["nvcc"]["version"] is None and report["nvcc"]["error"]


def test_module_names_the_roles_variables_and_the_host(tmp_path):
    names = {"cuda_version": "gpu_host_cuda_version", "tensor_parallel": "gpu_host_tensor_parallel",
             "pipeline_parallel": "gpu_host_pipeline_parallel",
             "data_parallel": "gpu_host_data_parallel", "profile": "vllm_service_profile"}
    out = run_module(tmp_path, os.path.join(FIX, "h200-x2"), {
        "cuda_version": "13.0", "tensor_parallel": 4, "require_gpu": True,
        "host_name": "gpu-node-7", "variable_names": names})
    errors = out["ansible_facts"]["gpu_facts"]["preflight_errors"]
    assert errors == ["host gpu-node-7: gpu_host_tensor_parallel 4 x gpu_host_pipeline_parallel 1 x "
                      "gpu_host_data_parallel 1 = 4 GPUs, host has 2: lower gpu_host_tensor_parallel "
                      "or gpu_host_pipeline_parallel or gpu_host_data_parallel"]


def test_module_offers_the_no_p2p_fallback_environment(tmp_path):
    out = run_module(tmp_path, os.path.join(FIX, "h200-x2"), {"nccl_profile": "throughput"})
    f = out["ansible_facts"]["gpu_facts"]
    assert f["nccl"]["env"].get("NCCL_P2P_DISABLE") is None  # NVLink: P2P stays on
    fb = f["nccl_no_p2p"]
    assert fb["env"]["NCCL_P2P_DISABLE"] == "1" and fb["profile"] == "throughput"
    assert "--disable-custom-all-reduce" in fb["vllm_args"]


def test_module_refuses_unknown_variable_names(tmp_path):
    out = run_module(tmp_path, os.path.join(FIX, "h200-x1"), {"variable_names": {"tp": "x"}})
    assert out["failed"] and "unknown keys tp" in out["msg"]


def test_module_without_nvidia_smi_names_host_and_profile(tmp_path):
    args = {"nvidia_smi": str(tmp_path / "missing" / "nvidia-smi"), "require_gpu": True,
            "tensor_parallel": 4, "host_name": "cpu-1", "profile_name": "minimax-m2.5-tp4",
            "variable_names": {"profile": "vllm_service_profile"}, "_ansible_check_mode": True}
    code = ("import sys; sys.path.insert(0, %r); import conftest; "
            "from ansible_collections.vllm_ops.deploy.plugins.modules import gpu_facts; "
            "gpu_facts.main()" % os.path.join(ROOT, "tests"))
    proc = subprocess.run([sys.executable, "-c", code],
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": args}),
                          capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    f = json.loads(proc.stdout)["ansible_facts"]["gpu_facts"]
    assert f["present"] is False and f["nccl"]["env"] == {}
    assert f["preflight_errors"] == [
        "host cpu-1 has no NVIDIA GPU (gpu_facts.present is false: %s not found) but "
        "vllm_service_profile minimax-m2.5-tp4 needs 4 GPU(s): set vllm_service_profile to a "
        "CPU profile for host cpu-1, or install the driver" % args["nvidia_smi"]]
