"""gpu_host role: its derived variables and rendered files (apt pin, profile.d, driver files),
rendered by Ansible's own templar from the role's real defaults/vars/templates.

The apt method and the driver install cannot run here (no NVIDIA repository reachable, no
GPU, Debian test hosts): these tests check what they would write. The pip method runs for
real in molecule/gpu.
"""
import os
import re

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.vllm_ops.deploy.plugins.plugin_utils.service.profiles import load_profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ROLE = os.path.join(ROOT, "roles", "gpu_host")


def _trusted(value):
    """Role files are trusted templates (as Ansible's loader marks them), nested ones too."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: _trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v) for v in value]
    return value


def templar(facts=None, gpu_facts=None, **overrides):
    variables = {}
    # the shared role's defaults first (a meta dependency of gpu_host), then the role's own
    for path in (os.path.join(ROOT, "roles", "vllm_deploy", "defaults", "main.yml"),
                 os.path.join(ROLE, "defaults", "main.yml"), os.path.join(ROLE, "vars", "main.yml")):
        with open(path) as fh:
            variables.update({k: _trusted(v) for k, v in yaml.safe_load(fh).items()})
    variables.update({k: _trusted(v) for k, v in overrides.items()})
    variables["ansible_facts"] = dict(facts or {}, **({"gpu_facts": gpu_facts} if gpu_facts else {}))
    variables["inventory_hostname"] = "gpu-1"
    return Templar(loader=DataLoader(), variables=variables)


def var(t, name):
    return t.template(trust_as_template("{{ %s }}" % name))


def render(t, template):
    with open(os.path.join(ROLE, "templates", template)) as fh:
        return t.template(trust_as_template(fh.read()))


UBUNTU_2404 = {"distribution": "Ubuntu", "distribution_version": "24.04",
               "distribution_major_version": "24", "architecture": "x86_64"}
UBUNTU_2204_ARM = {"distribution": "Ubuntu", "distribution_version": "22.04",
                   "distribution_major_version": "22", "architecture": "aarch64"}


@pytest.mark.parametrize("facts, folder", [
    (UBUNTU_2404, "ubuntu2404/x86_64"),
    (UBUNTU_2204_ARM, "ubuntu2204/sbsa"),
    ({"distribution": "Debian", "distribution_version": "12.12",
      "distribution_major_version": "12", "architecture": "x86_64"}, "debian12/x86_64"),
])
def test_repository_and_keyring_urls(facts, folder):
    t = templar(facts)
    base = "https://developer.download.nvidia.com/compute/cuda/repos/" + folder
    assert var(t, "_gpu_host_repo_url") == base
    assert var(t, "_gpu_host_keyring_url") == base + "/cuda-keyring_1.1-1_all.deb"


def test_apt_pin_file_pins_nccl_and_optionally_the_toolkit():
    t = templar(UBUNTU_2404, gpu_host_cuda_method="apt")
    text = render(t, "cuda-apt-pin.pref.j2")
    stanzas = [s for s in re.split(r"\n\s*\n", text) if "Package:" in s]
    assert len(stanzas) == 1  # no toolkit version given: the package name pins the minor
    assert "Package: libnccl2 libnccl-dev\nPin: version 2.28.9-1+cuda13.0\nPin-Priority: 1001" in text
    assert "cuda-toolkit-13-0" in text

    t = templar(UBUNTU_2404, gpu_host_cuda_method="apt", gpu_host_cuda_version="12.9",
                gpu_host_nccl_version="2.27.7", gpu_host_cuda_apt_toolkit_version="12.9.1-1")
    text = render(t, "cuda-apt-pin.pref.j2")
    assert ("Package: cuda-toolkit-12-9\nPin: version 12.9.1-1\nPin-Priority: 1001") in text
    assert "Pin: version 2.27.7-1+cuda12.9" in text
    # apt's own syntax: every stanza has exactly Package, Pin, Pin-Priority
    for stanza in re.split(r"\n\s*\n", text):
        lines = [ln for ln in stanza.splitlines() if ln and not ln.startswith("#")]
        if lines:
            assert [ln.split(":")[0] for ln in lines] == ["Package", "Pin", "Pin-Priority"]


@pytest.mark.parametrize("method, home", [
    ("pip", "/opt/vllm-deploy/cuda-13.0/cuda"),
    ("apt", "/usr/local/cuda-13.0"),
])
def test_profile_script_exports_cuda_home_and_path(method, home, tmp_path):
    t = templar(UBUNTU_2404, gpu_host_cuda_method=method)
    assert var(t, "_gpu_host_cuda_home") == home
    script = tmp_path / "cuda.sh"
    script.write_text(render(t, "cuda-profile.sh.j2"))
    # Run it the way a login shell does, twice (PATH must not grow).
    import subprocess
    out = subprocess.run(["sh", "-c", ". %s; . %s; echo $CUDA_HOME; echo $PATH" % (script, script)],
                         capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout.splitlines()
    assert out == [home, home + "/bin:/usr/bin:/bin"]


def test_driver_files():
    t = templar(UBUNTU_2404)
    nouveau = render(t, "blacklist-nouveau.conf.j2")
    assert re.findall(r"(?m)^[^#\s].*$", nouveau) == ["blacklist nouveau", "options nouveau modeset=0"]
    uvm = render(t, "nvidia-uvm.conf.j2")
    assert re.findall(r"(?m)^[^#\s].*$", uvm) == ["options nvidia_uvm uvm_disable_hmm=1"]


def test_pip_requirements_pin_every_wheel_and_the_matching_nccl():
    t = templar(UBUNTU_2404)
    reqs = var(t, "_gpu_host_pip_requirements")
    assert "nvidia-nccl-cu13==2.28.9" in reqs
    assert all(re.match(r"^[a-z0-9-]+==\d+(\.\d+)+$", r) for r in reqs), reqs
    # nvcc's wheel depends on crt, nvvm and runtime without versions: all must be pinned here
    names = {r.split("==")[0] for r in reqs}
    assert {"nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime"} <= names
    t = templar(UBUNTU_2404, gpu_host_cuda_version="12.9")
    assert "nvidia-nccl-cu12==2.28.9" in var(t, "_gpu_host_pip_requirements")


@pytest.mark.parametrize("method, present, require, expected", [
    ("auto", False, False, "none"),
    ("auto", True, False, "pip"),
    ("auto", False, True, "pip"),
    ("apt", False, False, "apt"),
    ("none", True, True, "none"),
])
def test_method_resolution(method, present, require, expected):
    t = templar(UBUNTU_2404, gpu_facts={"present": present}, gpu_host_cuda_method=method,
                gpu_host_require_gpu=require)
    assert var(t, "_gpu_host_cuda_method") == expected


def test_layout_and_gpu_requirement_come_from_the_profile():
    # what the role's assert sets: the collection's loader's result (lookup vllm_profile)
    profile = load_profile("minimax-m2.5-tp4")
    t = templar(UBUNTU_2404, _gpu_host_profile=profile)
    assert var(t, "gpu_host_tensor_parallel") == profile["parallel"]["tensor"] == 4
    assert var(t, "gpu_host_require_gpu") is True
    t = templar(UBUNTU_2404, _gpu_host_profile={})
    assert var(t, "gpu_host_tensor_parallel") == 1 and var(t, "gpu_host_require_gpu") is False


def test_variable_names_follow_where_the_profile_came_from():
    t = templar(UBUNTU_2404, vllm_service_profile="cpu-tiny")
    assert var(t, "_gpu_host_variable_names")["profile"] == "vllm_service_profile"
    t = templar(UBUNTU_2404, vllm_service_profile="cpu-tiny", gpu_host_profile="glm-5-fp8")
    names = var(t, "_gpu_host_variable_names")
    assert names["profile"] == "gpu_host_profile"
    assert names["tensor_parallel"] == "gpu_host_tensor_parallel"
