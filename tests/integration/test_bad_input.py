"""Bad input is refused by the first play, before any role touches a host.

Runs the real playbook vllm_ops.deploy.deploy with ansible-playbook. The hosts use the local
connection (or an address where nothing listens), so a refusal that came too late would
show up as a changed task or a created file; every case checks the message names the
variable and that no converge task ran.
"""
import fcntl
import os
import re
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
PLAYBOOK = "vllm_ops.deploy.deploy"  # this checkout, through ansible.cfg's collections path

GOOD = {
    "vllm_install_cpu_version": "0.32.0",
    "model_weights_source": "local",
    "model_weights_local_dir": os.path.join(ROOT, "tests", "fixtures", "tiny-model-config"),
    "model_weights_name": "tiny",
    "vllm_service_profile": "cpu-tiny",
    "vllm_service_port": 8999,
}


def run_deploy(tmp_path, hostvars, group_vars=None, args=(), children=None):
    inv = {"all": {"children": dict({"vllm_hosts": {"hosts": {"badhost": hostvars},
                                                    "vars": dict(GOOD, **(group_vars or {}))}},
                                    **(children or {}))}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    out = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(path), PLAYBOOK] + list(args),
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    return out.returncode, out.stdout + out.stderr


LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def assert_refused_before_converge(rc, output):
    assert rc != 0, output
    assert "PLAY [Validate the deployment]" in output
    converge = output.partition("PLAY [Converge vLLM hosts]")[2]
    assert "TASK [" not in converge, "a converge task ran:\n" + output
    assert "changed=0" in output or "unreachable=1" in output


@pytest.fixture(autouse=True)
def model_config_dir():
    # A model directory on the controller is part of the good input.
    d = os.path.join(ROOT, "tests", "fixtures", "tiny-model-config")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"architectures": ["LlamaForCausalLM"]}\n')
    yield


def test_two_vllm_sources_are_refused_with_both_named(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_install_pypi_version": "0.25.0"})
    assert_refused_before_converge(rc, out)
    assert "set now: vllm_install_pypi_version, vllm_install_cpu_version" in out or \
        "set now: vllm_install_cpu_version, vllm_install_pypi_version" in out


def test_no_vllm_source_is_refused(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_install_cpu_version": ""})
    assert_refused_before_converge(rc, out)
    assert "set now: none" in out


def test_short_commit_is_refused(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_install_cpu_version": "",
                                           "vllm_install_commit": "739e5945d"})
    assert_refused_before_converge(rc, out)
    assert "vllm_install_commit must be a full 40-hex" in out
    assert "9 characters" in out


def test_missing_site_dir_is_refused(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_install_site_dirs": [str(tmp_path / "no-torch")]})
    assert_refused_before_converge(rc, out)
    assert "vllm_install_site_dirs must be existing directories" in out
    assert str(tmp_path / "no-torch") in out


def test_no_deps_wheelhouse_without_the_vllm_wheel_is_refused(tmp_path):
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    (wh / "vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"")
    (wh / "uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl").write_bytes(b"")
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_install_cpu_version": "",
                                           "vllm_install_wheelhouse": str(wh),
                                           "vllm_install_wheelhouse_version": "0.25.0",
                                           "vllm_install_wheelhouse_no_deps": True})
    assert_refused_before_converge(rc, out)
    assert "vllm_install_wheelhouse has no vllm wheel of version 0.25.0 (present: 0.24.0)" in out


def test_unknown_profile_lists_the_known_ones(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_service_profile": "no-such-model"})
    assert_refused_before_converge(rc, out)
    # The first role that reads the profile refuses it (gpu_host or vllm_service).
    assert re.search(r"unknown [^\n]*vllm_service.profile", out, re.I), out
    assert "no-such-model" in out
    assert "minimax-m2.5-tp4" in out and "cpu-tiny" in out


def test_non_positive_sweep_levels_are_refused(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_benchmark_levels": [1, 0, 4]})
    assert_refused_before_converge(rc, out)
    assert "vllm_benchmark_levels must be positive integers" in out


def test_bad_monitoring_settings_are_refused_naming_each(tmp_path):
    # The host in the group vllm_monitoring switches monitoring on; both refusals at once.
    rc, out = run_deploy(tmp_path, LOCAL, {
        "vllm_monitoring_alert_kv_cache_usage_threshold": 1.5,
        "vllm_monitoring_node_exporter_listen_address": "127.0.0.1:8999"},
        children={"vllm_monitoring": {"hosts": {"badhost": None}}})
    assert_refused_before_converge(rc, out)
    assert "vllm_monitoring_alert_kv_cache_usage_threshold=1.5 must be <= 1.0" in out
    assert ("node exporter (vllm_monitoring_node_exporter_listen_address) port 8999 is also "
            "the port of vLLM instance main") in out
    assert "PLAY [Monitor the vLLM instances" not in out


def test_missing_model_directory_is_refused(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"model_weights_local_dir": str(tmp_path / "nope")})
    assert_refused_before_converge(rc, out)
    assert "model_weights_local_dir" in out


@pytest.mark.parametrize("source", ["hf", "path"])
def test_max_model_len_above_the_models_limit_on_the_host_is_refused(tmp_path, source):
    # The weights are on the host already (a source that downloads, or a host path): the
    # limit comes from their config.json there, refused in play 1 before any file changes.
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 1024}\n')
    before = sorted(p.name for p in model.iterdir())
    extra = {"hf": {"model_weights_repo_id": "demo/tiny-llama", "model_weights_revision": "main"},
             "path": {}}[source]
    rc, out = run_deploy(tmp_path, LOCAL, dict(
        extra, model_weights_source=source, vllm_deploy_models_root=str(tmp_path / "models"),
        vllm_service_instances=[{"name": "one", "port": 8999,
                                 "profile_overrides": {"max_model_len": 4096}}]))
    assert_refused_before_converge(rc, out)
    assert ("instance one: max_model_len 4096 is above the model's limit 1024 (derived from %s/config.json"
            % model) in out, out
    assert sorted(p.name for p in model.iterdir()) == before


def test_gpu_host_gpus_not_a_list_names_itself(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"gpu_host_gpus": 8})
    assert_refused_before_converge(rc, out)
    assert "gpu_host_gpus=8 must be a list" in out
    # only the bad setting is named, not every gpu_host setting
    assert "gpu_host_cuda_method" not in out and "gpu_host_nccl_profile" not in out


def test_negative_ready_timeout_names_vllm_service_ready_timeout_s(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_service_ready_timeout_s": -5})
    assert_refused_before_converge(rc, out)
    assert "vllm_service_ready_timeout_s (which vllm_install_switch_timeout_s defaults to) > 0 " \
           "(got -5)" in out


def test_unsupported_os_release_is_refused_with_the_supported_list(tmp_path):
    # This controller is Debian 12 with Python 3.11 (a supported release): a list without it
    # makes it an unsupported one, as Debian 13 (trixie, Python 3.13) is by default.
    rc, out = run_deploy(tmp_path, LOCAL, {"host_prep_supported_os": [
        {"distribution": "Debian", "version": "13", "python": "3.13"},
        {"distribution": "Ubuntu", "version": "24.04", "python": "3.12"}]})
    assert_refused_before_converge(rc, out)
    assert re.search(r"runs Debian 12[^\n]* \(bookworm\) with Python 3\.11: not supported", out), out
    assert "host_prep_supported_os: Debian 13 with Python 3.13, Ubuntu 24.04 with Python 3.12" in out


@pytest.mark.parametrize("tags", ["host_prep,model_weights", "vllm_benchmark", "flashinfer"])
def test_a_tag_run_validates_first(tmp_path, tags):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_benchmark_levels": [1, 0, 4]},
                         args=["--tags", tags])
    assert_refused_before_converge(rc, out)
    assert "vllm_benchmark_levels must be positive integers" in out


def test_missing_ssh_key_is_named(tmp_path):
    key = str(tmp_path / "no-such-key")
    rc, out = run_deploy(tmp_path, {"ansible_host": "127.0.0.1", "ansible_port": 1,
                                    "ansible_ssh_private_key_file": key})
    assert_refused_before_converge(rc, out)
    assert "ansible_ssh_private_key_file=%s" % key in out
    assert "does not exist on the controller" in out


def test_unreachable_host_stops_before_converge(tmp_path):
    rc, out = run_deploy(tmp_path, {"ansible_host": "127.0.0.1", "ansible_port": 1,
                                    "ansible_ssh_common_args": "-o ConnectTimeout=3"})
    assert_refused_before_converge(rc, out)
    assert "UNREACHABLE" in out


def test_second_demo_is_refused_while_one_runs(tmp_path):
    env = dict(os.environ, VD_CACHE_DIR=str(tmp_path))
    lock_path = tmp_path / "demo.lock"
    with open(lock_path, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        out = subprocess.run([sys.executable, os.path.join(ROOT, "demo", "demo.py")],
                             env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert "another demo is already running" in out.stderr
