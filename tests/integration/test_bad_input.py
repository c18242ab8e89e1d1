"""Bad input is refused by the first play, before any role touches a host.

Runs the real playbook vllm_ops.deploy.deploy with ansible-playbook. Most hosts use the local
connection (or an address where nothing listens), so a refusal that came too late would
show up as a changed task or a created file; every case checks the message names the
variable and that no converge task ran.

The cases at the end run against a converged test host (tests/harness/testhost.py: vd-val-1,
SSH 26110, vLLM 26111) whose weights came from a real Hub-compatible server (olah through
tests/harness/hubserver.py on 26101, org/tiny with the tag v1): each is refused in the
validation play naming the variable, and the host is unchanged afterwards (unit file, env
file, MainPID and restarts, venvs, downloader venv, model directory). The host is converged
once for the module (a few minutes) and destroyed at the end.
"""
import fcntl
import json
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


def run_deploy(tmp_path, hostvars, group_vars=None, args=(), children=None, env_extra=None,
               inventory_dir=False):
    inv = {"all": {"children": dict({"vllm_hosts": {"hosts": {"badhost": hostvars},
                                                    "vars": dict(GOOD, **(group_vars or {}))}},
                                    **(children or {}))}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", **(env_extra or {}))
    source = str(tmp_path) if inventory_dir else str(path)
    out = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", source, PLAYBOOK] + list(args),
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


def test_a_report_root_that_ansible_would_read_as_inventory_is_refused(tmp_path):
    # Given the inventory directory, Ansible reads every file below it that is not hidden as
    # an inventory source; the default root (.reports in it) is hidden.
    root = tmp_path / "reports"
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_benchmark_report_root": str(root)},
                         inventory_dir=True)
    assert_refused_before_converge(rc, out)
    assert ("vllm_benchmark_report_root=%s lies inside the inventory directory %s"
            % (root, os.path.realpath(tmp_path))) in out, out
    assert "the default is %s/.reports" % tmp_path in out


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
    # No Hub answers here: the validation play's Hub check is switched off, and says so.
    extra = {"hf": {"model_weights_repo_id": "demo/tiny-llama", "model_weights_revision": "main",
                    "model_weights_validate_remote": False},
             "path": {}}[source]
    rc, out = run_deploy(tmp_path, LOCAL, dict(
        extra, model_weights_source=source, vllm_deploy_models_root=str(tmp_path / "models"),
        vllm_service_instances=[{"name": "one", "port": 8999,
                                 "profile_overrides": {"max_model_len": 4096}}]))
    assert_refused_before_converge(rc, out)
    assert ("instance one: max_model_len 4096 is above the model's limit 1024 (derived from %s/config.json"
            % model) in out, out
    assert sorted(p.name for p in model.iterdir()) == before
    if source == "hf":
        assert re.search(r"SKIPPED: model_weights_validate_remote: false: the Hub at "
                         r"https://huggingface.co was not asked whether demo/tiny-llama@main "
                         r"exists", " ".join(out.split())), out


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


def test_missing_ssh_key_of_the_configuration_is_named(tmp_path):
    """private_key_file set in the Ansible configuration (molecule's ansible.cfg sets it) is
    checked like the inventory's."""
    key = str(tmp_path / "no-such-config-key")
    rc, out = run_deploy(tmp_path, {"ansible_host": "127.0.0.1", "ansible_port": 1},
                         env_extra={"ANSIBLE_PRIVATE_KEY_FILE": key})
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


def test_benchmark_url_and_model_replaced_by_the_services_endpoints_are_refused(tmp_path):
    rc, out = run_deploy(tmp_path, LOCAL, {"vllm_benchmark_url": "http://10.0.0.9:8000",
                                           "vllm_benchmark_model": "other"})
    assert_refused_before_converge(rc, out)
    flat = " ".join(out.split())
    assert ("vllm_benchmark_url=http://10.0.0.9:8000 and vllm_benchmark_model=other would be "
            "ignored: vllm_service publishes this host's endpoints (vllm_service_endpoints, "
            "instances main)") in flat, out


def test_tensor_parallel_that_does_not_divide_the_gpu_list_is_refused(tmp_path):
    # This controller has no NVIDIA GPU: the list is refused for that too, both named.
    rc, out = run_deploy(tmp_path, LOCAL, {
        "gpu_host_gpus": list(range(8)),
        "gpu_host_tensor_parallel": 3})
    assert_refused_before_converge(rc, out)
    flat = " ".join(out.split())
    assert ("gpu_host_gpus=[0, 1, 2, 3, 4, 5, 6, 7] declares 8 GPUs, which "
            "gpu_host_tensor_parallel 3 does not divide") in flat, out
    assert re.search(r"host badhost has no NVIDIA GPU \([^)]*\) but gpu_host_gpus=\[0, 1, 2, 3, 4, "
                     r"5, 6, 7\] declares 8: set gpu_host_gpus: \[\]", flat), out
    assert "busbw_gbps" not in out


# ---------------------------------------------------------------- a converged test host

HOST, SSH_PORT, VLLM_PORT, HUB_PORT, CLOSED_PORT = "vd-val-1", 26110, 26111, 26101, 26199
HUB_VENV = os.environ.get("HF_VENV", "/var/cache/vllm-deploy/hub-venv")
TINY = os.path.join(ROOT, ".cache", "tiny-model")
HOST_VARS = {
    "vllm_install_cpu_version": "0.32.0",
    "model_weights_source": "hf",
    "model_weights_repo_id": "org/tiny",
    "model_weights_revision": "main",
    "model_weights_endpoint": "http://127.0.0.1:%d" % HUB_PORT,
    "model_weights_name": "tiny-llama",
    "vllm_service_profile": "cpu-tiny",
    "vllm_service_host": "127.0.0.1",
    "vllm_service_port": VLLM_PORT,
    "vllm_service_ready_timeout_s": 600,
    "vllm_benchmark_enabled": False,
}
# What must not change on the host: the unit and its environment file, the running process,
# the venvs (vLLM's and the downloader's) and the model directory.
SNAPSHOT = r"""
set -u
unit=vllm-main.service
systemctl show -p FragmentPath,EnvironmentFiles,MainPID,NRestarts,ActiveState $unit
sha256sum "$(systemctl show -P FragmentPath $unit)" /etc/vllm-deploy/main.env
find /opt/vllm-deploy -maxdepth 2 -printf '%p %y %s %T@ %l\n' | sort
find /srv/models/tiny-llama -printf '%p %s %T@\n' | sort
"""


def _ssh(cmd, timeout=60):
    import testhost as th  # noqa: E402 (tests/harness, imported once the fixture ran)
    out = subprocess.run(th.ssh_base(SSH_PORT) + [cmd], capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    if not os.path.exists(os.path.join(HUB_VENV, "bin", "olah-cli")):
        pytest.skip("needs %s with olah (make %s/.installed)" % (HUB_VENV, HUB_VENV))
    if not os.path.exists(os.path.join(TINY, "config.json")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"),
                        TINY], check=True)
    state = tmp_path_factory.mktemp("hub")
    server = [os.path.join(HUB_VENV, "bin", "python"), os.path.join(ROOT, "tests", "harness",
                                                                    "hubserver.py")]
    out = subprocess.run(server + ["start", "--model-dir", TINY, "--repo", "org/tiny", "--port",
                                   str(HUB_PORT), "--state-dir", str(state), "--tag", "v1"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    yield info
    subprocess.run(server + ["stop", "--state-dir", str(state)], check=True, timeout=60)


@pytest.fixture(scope="module")
def converged(hub, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (systemd-nspawn)")
    sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
    import testhost as th
    th.destroy("vd-val-")
    th.create(HOST, SSH_PORT)
    inv = str(tmp_path_factory.mktemp("inv") / "hosts.yml")
    th.write_inventory([HOST], inv, extra_vars=HOST_VARS)
    out = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inv, PLAYBOOK], cwd=ROOT,
                         env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                                  ANSIBLE_NOCOLOR="1"),
                         capture_output=True, text=True, timeout=1500, check=False)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
    with open(inv) as f:
        doc = yaml.safe_load(f)
    yield {"inventory": doc, "hub": hub, "state": _ssh(SNAPSHOT)}
    th.destroy("vd-val-")


def run_on_host(converged, tmp_path, changes):
    """The deploy playbook against the converged host with `changes` over its variables;
    asserts it stopped in the validation play and that the host did not change."""
    doc = json.loads(json.dumps(converged["inventory"]))
    doc["all"]["children"]["vllm_hosts"]["vars"].update(changes)
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(doc))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    res = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", str(path), PLAYBOOK],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
    out = res.stdout + res.stderr
    assert_refused_before_converge(res.returncode, out)
    assert _ssh(SNAPSHOT) == converged["state"], "the host changed:\n" + out
    return " ".join(out.split())


def test_converged_host_serves_the_hub_commit(converged):
    state = converged["state"]
    assert "ActiveState=active" in state and "MainPID=0" not in state
    manifest = json.loads(_ssh("cat /srv/models/tiny-llama/.hf-manifest.json"))
    assert manifest["sha"] == converged["hub"]["sha"] and manifest["repo_id"] == "org/tiny"


def test_revision_missing_on_the_hub_is_refused(converged, tmp_path):
    out = run_on_host(converged, tmp_path, {"model_weights_revision": "no-such-revision"})
    assert ("model_weights_revision='no-such-revision' does not exist in org/tiny on "
            "http://127.0.0.1:%d (asked from host %s: GET http://127.0.0.1:%d/api/models/org/tiny/"
            "revision/no-such-revision answered HTTP 401 RepoNotFound; its branch main answers)"
            % (HUB_PORT, HOST, HUB_PORT)) in out, out


def test_repository_missing_on_the_hub_is_refused(converged, tmp_path):
    out = run_on_host(converged, tmp_path, {"model_weights_repo_id": "org/no-such-model"})
    assert ("model_weights_repo_id='org/no-such-model': no such repository on http://127.0.0.1:%d "
            "(asked from host %s" % (HUB_PORT, HOST)) in out, out
    assert "set model_weights_hf_token" in out


@pytest.mark.parametrize("revision,where", [
    ("v1", "on the Hub at that commit"),          # not on the host at that revision: asked
    ("main", "in the weights already on the host"),  # on the host: checked there, nothing asked
])
def test_override_key_missing_at_the_revision_is_refused(converged, tmp_path, revision, where):
    sha = converged["hub"]["sha"]
    out = run_on_host(converged, tmp_path, {
        "model_weights_revision": revision,
        "model_weights_overrides": [{"file": "config.json", "set": "rope_scaling.factor", "value": 2},
                                    {"file": "config.json", "delete": "max_position_embeddings"}]})
    at = ("org/tiny@%s on http://127.0.0.1:%d" % (sha, HUB_PORT) if revision == "v1"
          else "org/tiny@%s in /srv/models/tiny-llama" % sha)
    assert ("model_weights_overrides[0] (set rope_scaling.factor in config.json): key "
            "rope_scaling not found in config.json at %s: remove or correct it" % at) in out, where
    assert "model_weights_overrides[1] (" not in out  # that key exists: no refusal names it


def test_unreachable_hub_is_refused_naming_the_host_and_the_skip(converged, tmp_path):
    out = run_on_host(converged, tmp_path, {
        "model_weights_endpoint": "http://127.0.0.1:%d" % CLOSED_PORT,
        "model_weights_revision": "v1"})
    assert ("host %s: the Hub at http://127.0.0.1:%d did not answer (" % (HOST, CLOSED_PORT)) in out
    assert ("Fix model_weights_endpoint or the host's proxy, or set "
            "model_weights_validate_remote: false to skip this check") in out, out


def test_weights_present_need_no_hub_and_an_impossible_margin_is_a_warning(converged, tmp_path):
    # The weights are on the host at that revision: the closed endpoint is never asked; the
    # petabyte margin cannot matter now, and says so. A bad sweep level stops the run.
    out = run_on_host(converged, tmp_path, {
        "model_weights_endpoint": "http://127.0.0.1:%d" % CLOSED_PORT,
        "model_weights_disk_margin_bytes": 10 ** 15,
        "vllm_benchmark_levels": [1, 0]})
    assert ("/srv/models/tiny-llama already holds org/tiny@%s (manifest .hf-manifest.json "
            "matches org/tiny@%s): the Hub was not asked" % ((converged["hub"]["sha"],) * 2)) in out, out
    assert re.search(r"\[WARNING\]: model_weights_disk_margin_bytes=1000000000000000 \(1000\.0 TB\) "
                     r"is larger than the filesystem of /srv/models/tiny-llama on host %s" % HOST,
                     out), out
    assert "vllm_benchmark_levels must be positive integers" in out


def test_impossible_margin_is_refused_when_a_download_would_run(converged, tmp_path):
    out = run_on_host(converged, tmp_path, {"model_weights_revision": "v1",
                                            "model_weights_disk_margin_bytes": 10 ** 15})
    assert ("model_weights_disk_margin_bytes=1000000000000000 (1000.0 TB) is larger than the "
            "filesystem of /srv/models/tiny-llama on host %s" % HOST) in out, out
    assert "no download can ever keep that much free: lower model_weights_disk_margin_bytes" in out


def test_tp_not_dividing_the_gpu_list_on_the_host_is_refused(converged, tmp_path):
    out = run_on_host(converged, tmp_path, {
        "gpu_host_gpus": list(range(8)),
        "gpu_host_tensor_parallel": 3})
    assert ("gpu_host_gpus=[0, 1, 2, 3, 4, 5, 6, 7] declares 8 GPUs, which "
            "gpu_host_tensor_parallel 3 does not divide") in out, out
    assert "host %s has no NVIDIA GPU" % HOST in out


def test_benchmark_url_on_the_host_is_refused(converged, tmp_path):
    out = run_on_host(converged, tmp_path, {"vllm_benchmark_url": "http://127.0.0.1:9"})
    assert ("vllm_benchmark_url=http://127.0.0.1:9 would be ignored: vllm_service publishes this "
            "host's endpoints (vllm_service_endpoints, instances main)") in out, out
