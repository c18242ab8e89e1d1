"""The old module names in meta/runtime.yml's plugin_routing keep working: each redirect names
a module that exists, and one old name (port_listeners) runs the new module for real through
Ansible, with the deprecation warning that names its replacement."""
import json
import os
import socket
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))
PORT = 26301  # this test's port: a listener the module must find


def routing():
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as f:
        return yaml.safe_load(f)["plugin_routing"]["modules"]


def test_every_redirect_names_an_existing_module():
    modules = routing()
    assert {"port_listeners", "ray_cluster_status", "vllm_instance_state"} <= set(modules)
    for old, entry in modules.items():
        target = entry["redirect"]
        assert target.startswith("vllm_ops.deploy."), old
        assert os.path.isfile(os.path.join(ROOT, "plugins", "modules",
                                           target.rsplit(".", 1)[1] + ".py")), old
        assert not os.path.exists(os.path.join(ROOT, "plugins", "modules", old + ".py")), old
        assert target in entry["deprecation"]["warning_text"], old


def test_the_old_port_listeners_name_runs_port_listeners_info():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", PORT))
    sock.listen(1)
    try:
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                   ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json",
                   ANSIBLE_DEPRECATION_WARNINGS="1")
        out = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-i",
             "localhost,", "-c", "local", "-e", "ansible_python_interpreter=" + sys.executable,
             "-m", "vllm_ops.deploy.port_listeners", "-a", json.dumps({"ports": [PORT]})],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    finally:
        sock.close()
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["changed"] is False
    found = result["listeners"][str(PORT)]
    assert [(entry["address"], entry["pid"]) for entry in found] == [("127.0.0.1", os.getpid())]
    assert "port_listeners_info" in out.stdout + out.stderr  # the deprecation names the new one
