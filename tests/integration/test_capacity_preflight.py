"""The capacity planner inside vllm_service's validation, through real ansible-playbook runs
(connection local: the "host" is this machine, the GPU facts are given, nothing is started).

The model directory holds only config.json, as for --load-format dummy: the planner must read
config.json from the host and estimate the weights from it. On the lent H200 (2026-12-01) the
role never planned a host-side model: it dropped every slurp result (they carry failed: false).
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
MODELS = os.path.join(ROOT, "tests", "gpu", "models")
H200 = {"present": True, "count": 1, "gpus": [{"index": 0, "name": "NVIDIA H200",
                                               "memory_total_mib": 143771}]}
PLAY = """
- name: Validate vllm_service only
  hosts: all
  gather_facts: false
  tasks:
    - name: Run the role's checks
      ansible.builtin.include_role:
        name: vllm_ops.deploy.vllm_service
        tasks_from: assert
"""


def model_dir(tmp_path, fixture, layers=None):
    with open(os.path.join(MODELS, fixture + ".json")) as f:
        cfg = json.load(f)
    meta = cfg.pop("_fixture")
    cfg["num_hidden_layers"] = layers or meta["num_hidden_layers"]
    d = tmp_path / fixture
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def validate(tmp_path, **hostvars):
    inv = {"all": {"hosts": {"gpubox": dict({"ansible_connection": "local",
                                             "ansible_python_interpreter": sys.executable,
                                             "vllm_service_gpu_facts": H200}, **hostvars)}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inv))
    (tmp_path / "play.yml").write_text(PLAY)
    out = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                          str(tmp_path / "play.yml")], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                                               ANSIBLE_NOCOLOR="1"), check=False)
    return out.returncode, " ".join((out.stdout + out.stderr).split())


def test_dummy_weights_on_the_host_are_planned_from_config(tmp_path):
    rc, out = validate(tmp_path, vllm_service_profile="minimax-m2.5-tp4",
                       vllm_service_profile_overrides={"parallel": {"tensor": 1}, "max_model_len": 8192},
                       vllm_service_model_dir=model_dir(tmp_path, "minimax-m2.5"),
                       vllm_service_extra_args=["--load-format", "dummy"])
    assert rc == 0, out
    assert "is not on the host yet" not in out
    assert "instance main: weights 15.96 GiB per GPU (estimated from config.json" in out, out


def test_the_full_model_on_one_gpu_is_refused_with_the_planners_numbers(tmp_path):
    rc, out = validate(tmp_path, vllm_service_profile="minimax-m2.5-tp4",
                       vllm_service_profile_overrides={"parallel": {"tensor": 1}, "max_model_len": 8192},
                       vllm_service_model_dir=model_dir(tmp_path, "minimax-m2.5", layers=62),
                       vllm_service_extra_args=["--load-format", "dummy"])
    assert rc != 0, out
    assert "capacity plan refused" in out and "GiB" in out, out


def test_max_model_len_above_the_hosts_config_is_refused(tmp_path):
    rc, out = validate(tmp_path, vllm_service_profile="kimi-k2.5-int4-tp8",
                       vllm_service_profile_overrides={"parallel": {"tensor": 1}, "max_model_len": 300000},
                       vllm_service_model_dir=model_dir(tmp_path, "kimi-k2.5-text"),
                       vllm_service_extra_args=["--load-format", "dummy"])
    assert rc != 0, out
    assert "max_model_len 300000 is above the model" in out and "262144" in out, out
