"""host_prep on a host with no apt archive: a real test host (vd-offline-1, SSH 2285) whose apt
sources and package lists are removed, through the real playbook (--tags host_prep).

- Everything of host_prep_packages is installed already: host_prep converges and apt is not
  called (the package lists stay empty, the install task is skipped).
- host_prep_packages: [] converges the same way.
- A package that is not installed cannot come from anywhere: the play fails naming it and how
  to provide it, and nothing was installed.
About a minute on 2 cores.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.slow

HOST, SSH_PORT = "vd-offline-1", 2285
GROUP_VARS = {
    "vllm_install_cpu_version": "0.32.0",
    "model_weights_source": "local",
    "model_weights_local_dir": os.path.join(ROOT, "tests", "fixtures", "tiny-model-config"),
    "model_weights_name": "tiny",
    "vllm_service_profile": "cpu-tiny",
    "vllm_service_port": 8998,
}


@pytest.fixture(scope="module")
def offline_host(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (systemd-nspawn)")
    import testhost as th
    d = os.path.join(ROOT, "tests", "fixtures", "tiny-model-config")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"architectures": ["LlamaForCausalLM"]}\n')
    th.destroy("vd-offline-")
    th.create(HOST, SSH_PORT)
    inv = str(tmp_path_factory.mktemp("inv") / "hosts.yml")
    th.write_inventory([HOST], inv, extra_vars=GROUP_VARS)
    # no apt archive: no sources, no package lists
    rc, out = ansible(inv, "shell", "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*; "
                                    "rm -rf /var/lib/apt/lists/*; apt-get update -qq; ls /var/lib/apt/lists")
    assert rc == 0, out
    yield inv
    th.destroy("vd-offline-")


def ansible(inv, module, args):
    out = subprocess.run([os.path.join(BIN, "ansible"), "-i", inv, HOST, "-m", module, "-a", args],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg")), check=False)
    return out.returncode, out.stdout + out.stderr


def deploy(inv, extra):
    out = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inv, "vllm_ops.deploy.deploy",
                          "--tags", "host_prep", "-e", json.dumps(extra)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                                  ANSIBLE_NOCOLOR="1"), check=False)
    return out.returncode, out.stdout + out.stderr


def package_lists(inv):
    rc, out = ansible(inv, "command", "find /var/lib/apt/lists -type f -name '*_Packages*'")
    assert rc == 0, out
    return [ln for ln in out.splitlines()[1:] if ln.strip()]


def test_installed_defaults_converge_without_apt(offline_host):
    rc, out = deploy(offline_host, {})
    assert rc == 0, out
    assert "TASK [vllm_ops.deploy.host_prep : Install with apt" not in out or "skipping: [%s]" % HOST in \
        out.partition("TASK [vllm_ops.deploy.host_prep : Install with apt")[2].partition("TASK [")[0]
    assert "Create the service user" in out
    assert package_lists(offline_host) == []


def test_an_empty_list_converges_without_apt(offline_host):
    rc, out = deploy(offline_host, {"host_prep_packages": []})
    assert rc == 0, out
    assert package_lists(offline_host) == []


def test_a_missing_package_is_refused_naming_it_and_how_to_provide_it(offline_host):
    rc, out = deploy(offline_host, {"host_prep_packages": ["python3", "cowsay"]})
    assert rc != 0, out
    flat = " ".join(out.split())
    assert "host_prep_packages needs cowsay, which is not installed" in flat, out
    assert "reachable apt archive" in flat
    assert "python3, cowsay" not in flat  # only what is missing is named
    rc, out = ansible(offline_host, "command", "dpkg-query --show cowsay")
    assert rc != 0
