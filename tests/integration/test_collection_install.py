"""The collection as an Ansible user consumes it, without this repository.

`ansible-galaxy collection build` makes the tarball; `ansible-galaxy collection install`
puts it into a fresh temporary directory; then `ansible-playbook vllm_ops.deploy.deploy` runs
from a directory outside the checkout, with ANSIBLE_COLLECTIONS_PATH naming only that
directory (the ansible package's bundled collections stay on the search path; no
ansible.cfg, no roles path), against a real test host (vd-coll-1, SSH 2211): the host_prep and
gpu_host roles converge (the profile lookup, the gpu_facts module and its module_utils, the
shared vllm_deploy role, all from the installed copy), then the read-only status playbook
resolves the host's vLLM instance with the collection's filter and profile loader.
About 2 minutes on 2 cores.
"""
import json
import os
import subprocess
import sys
import tarfile

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.slow

HOST, SSH_PORT = "vd-coll-1", 2211
GROUP_VARS = {
    "vllm_install_cpu_version": "0.32.0",
    "model_weights_source": "path",
    "model_weights_dir": "/srv/models/tiny-llama",
    "vllm_service_profile": "cpu-tiny",
    "vllm_service_host": "127.0.0.1",
    "vllm_service_port": 8250,
}


def clean_env(collections):
    """This process's environment without any Ansible setting, then only the installed
    collections path: nothing can point Ansible at the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=collections, ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="False")
    return env


def run(argv, cwd, env, timeout=900):
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The built tarball installed into a fresh directory, and a work directory outside the
    checkout (no ansible.cfg there)."""
    tmp = tmp_path_factory.mktemp("collection")
    build = run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path",
                 str(tmp / "build"), ROOT], cwd=str(tmp), env=clean_env(str(tmp / "none")))
    assert build.returncode == 0, build.stdout + build.stderr
    [tarball] = list((tmp / "build").glob("vllm_ops-deploy-*.tar.gz"))
    collections = tmp / "collections"
    inst = run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", "--offline",
                "-p", str(collections), str(tarball)], cwd=str(tmp),
               env=clean_env(str(collections)))
    assert inst.returncode == 0, inst.stdout + inst.stderr
    work = tmp / "work"
    work.mkdir()
    return {"tarball": tarball, "collections": str(collections), "work": work,
            "path": collections / "ansible_collections" / "vllm_ops" / "deploy",
            "env": clean_env(str(collections))}


@pytest.fixture(scope="module")
def testhost():
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (systemd-nspawn)")
    import testhost as th
    th.destroy("vd-coll-")
    th.create(HOST, SSH_PORT)
    yield th
    th.destroy("vd-coll-")


@pytest.fixture(scope="module")
def inventory(installed, testhost):
    path = installed["work"] / "inventory" / "hosts.yml"
    path.parent.mkdir()
    testhost.write_inventory([HOST], str(path), extra_vars=GROUP_VARS)
    return str(path)


def test_the_tarball_holds_the_collection_and_none_of_the_checkouts_state(installed):
    with tarfile.open(str(installed["tarball"])) as tar:
        names = tar.getnames()
    manifest = json.loads(open(str(installed["path"] / "MANIFEST.json")).read())
    assert manifest["collection_info"]["namespace"] == "vllm_ops"
    assert manifest["collection_info"]["name"] == "deploy"
    for must in ("meta/runtime.yml", "playbooks/deploy.yml", "roles/vllm_deploy/defaults/main.yml",
                 "plugins/modules/vllm_sweep.py", "plugins/action/vllm_ready.py",
                 "plugins/lookup/vllm_profile.py", "plugins/plugin_utils/service/profiles.py",
                 "plugins/doc_fragments/attributes.py", "profiles/cpu-tiny.yml",
                 "tests/sanity/ignore-2.19.txt", "docs/benchmarks/2026-11-29-h200.md"):
        assert must in names, must
    for name in names:
        assert not name.startswith(("collections", ".venv", ".cache", "reports", "build/")), name
        # the playbook repository around the collection and the test harness stay out
        assert not name.startswith(("molecule/", "inventory/", "tests/harness/", "tests/gpu/",
                                    "tests/benchmarks/", "tests/fixtures/", "tests/unit/",
                                    "tests/integration/", ".ci/", "vllm_deploy/", "demo/",
                                    "tools/")), name
    for must in ("requirements.yml", "meta/execution-environment.yml", "meta/ee-requirements.txt",
                 "changelogs/changelog.yaml", "roles/vllm_service/README.md",
                 "plugins/filter/systemd_quote.yml", "docs/reference/variables.md"):
        assert must in names, must
        assert "__pycache__" not in name and not name.startswith("docs/benchmarks/2026-11-29-h200/")
    assert not os.path.islink(str(installed["path"] / "collections"))


def test_ansible_resolves_the_collection_to_the_installed_copy_only(installed):
    env, work = installed["env"], str(installed["work"])
    out = run([os.path.join(BIN, "ansible-galaxy"), "collection", "list", "vllm_ops.deploy",
               "--format", "json"], cwd=work, env=env)
    assert out.returncode == 0, out.stderr
    assert list(json.loads(out.stdout)) == [installed["collections"] + "/ansible_collections"]
    out = run([os.path.join(BIN, "ansible-doc"), "--json", "vllm_ops.deploy.gpu_facts"],
              cwd=work, env=env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)["vllm_ops.deploy.gpu_facts"]["doc"]
    assert doc["filename"].startswith(str(installed["path"])), doc["filename"]
    assert not doc["filename"].startswith(ROOT)


def test_deploy_playbook_from_the_installed_collection_converges_a_host(installed, inventory):
    env, work = installed["env"], str(installed["work"])
    out = run([os.path.join(BIN, "ansible-playbook"), "-i", inventory, "vllm_ops.deploy.deploy",
               "--tags", "host_prep,gpu_host"], cwd=work, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "TASK [vllm_ops.deploy.host_prep : Create the service user]" in text
    assert "TASK [vllm_ops.deploy.gpu_host : Read GPUs, topology and P2P host state]" in text
    # the profile came from the installed collection's loader: its layout drove the preflight
    assert "layout 1x1x1 (tp x pp x dp) from profile cpu-tiny" in " ".join(text.split())
    assert ROOT not in text  # not one path of the checkout
    recap = [line for line in text.splitlines() if line.startswith(HOST) and "ok=" in line]
    assert recap and "failed=0" in recap[0] and "unreachable=0" in recap[0]

    # read-only status playbook: the instance resolved by the installed filter and loader
    out = run([os.path.join(BIN, "ansible-playbook"), "-i", inventory, "vllm_ops.deploy.status",
               "-e", "ansible_python_interpreter=/usr/bin/python3"], cwd=work, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "vllm-main.service" in text and "http://127.0.0.1:8250" in text
    assert ROOT not in text
    with open(inventory) as f:
        assert yaml.safe_load(f)["all"]["children"]["vllm_hosts"]["hosts"][HOST]
