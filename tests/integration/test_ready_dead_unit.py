"""A server that dies at start ends every readiness wait in seconds, and what an interrupted
upgrade gate left is removed: a real test host (vd-ready-1, SSH 2286) with systemd as PID 1.

- vllm_ops.deploy.vllm_ready waits on a transient unit started the way the upgrade gate starts
  its candidate (systemd-run --collect, Type=exec) whose process prints the error vLLM printed
  on the H200 when a second server found the GPU taken, and exits 1: systemd unloads the unit
  at once (ActiveState=inactive, LoadState=not-found, never `failed`). The wait must end within
  seconds of the exit (not at timeout_s) and name that error line.
- The same for an ordinary unit whose process exits without Restart= (inactive).
- A unit that is alive but not answering keeps the wait going until timeout_s.
- A leftover candidate unit and its /run environment file (an interrupted gate) are stopped
  and removed by vllm_install's first tasks, which say so; a second run changes nothing.
"""
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.slow

HOST, SSH_PORT = "vd-ready-1", 2286
OOM = ("ValueError: Free memory on device cuda:0 (9.33/139.8 GiB) on startup is less than "
       "desired GPU memory utilization (0.92, 128.62 GiB)")
ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (systemd-nspawn)")
    import testhost as th
    th.destroy("vd-ready-")
    th.create(HOST, SSH_PORT)
    inv = str(tmp_path_factory.mktemp("inv") / "hosts.yml")
    th.write_inventory([HOST], inv)
    yield inv
    th.destroy("vd-ready-")


def ansible(inv, module, args, timeout=180):
    out = subprocess.run([os.path.join(BIN, "ansible"), "-i", inv, HOST, "-m", module, "-a", args],
                         cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=ENV,
                         check=False)
    return out.returncode, out.stdout + out.stderr


def wait_ready(inv, unit, timeout_s):
    t0 = time.monotonic()
    rc, out = ansible(inv, "vllm_ops.deploy.vllm_ready", json.dumps(
        {"url": "http://127.0.0.1:8977", "model": "tiny", "unit": unit, "timeout_s": timeout_s,
         "progress_s": 5}))
    return rc, out, time.monotonic() - t0


def test_a_collected_transient_candidate_that_dies_ends_the_wait_in_seconds(host):
    script = "sleep 3; echo %s >&2; exit 1" % json.dumps(OOM)
    rc, out = ansible(host, "command", json.dumps({"argv": [
        "systemd-run", "--unit=vd-dead-cand.service", "--collect", "--service-type=exec",
        "/bin/sh", "-c", script]}))
    assert rc == 0, out
    rc, out, took = wait_ready(host, "vd-dead-cand.service", 300)
    assert rc != 0, out
    assert "vd-dead-cand.service is gone" in out and OOM in out, out
    # the process lived 3 s; the wait polls every 2 s and one ansible call costs a few seconds
    assert took < 60, "the wait took %.0f s of its 300 s for a unit that died after 3 s" % took


def test_an_ordinary_unit_that_exits_without_restart_ends_the_wait(host):
    unit = ("[Service]\nType=exec\nExecStart=/bin/sh -c 'sleep 2; "
            "echo \"RuntimeError: CUDA error: no kernel image\" >&2; exit 3'\n")
    rc, out = ansible(host, "copy", json.dumps({"dest": "/etc/systemd/system/vd-dead-svc.service",
                                                "content": unit}))
    assert rc == 0, out
    rc, out = ansible(host, "systemd_service", "name=vd-dead-svc.service state=started daemon_reload=true")
    assert rc == 0, out
    rc, out, took = wait_ready(host, "vd-dead-svc.service", 300)
    assert rc != 0 and "exited with status 3" in out and "RuntimeError: CUDA error" in out, out
    assert took < 60, out


def test_a_live_unit_that_does_not_answer_keeps_the_wait_until_its_timeout(host):
    rc, out = ansible(host, "command", json.dumps({"argv": [
        "systemd-run", "--unit=vd-slow-load.service", "--collect", "--service-type=exec",
        "/bin/sleep", "300"]}))
    assert rc == 0, out
    try:
        rc, out, took = wait_ready(host, "vd-slow-load.service", 12)
        assert rc != 0 and "not ready after" in out, out
        assert took >= 12, out
    finally:
        ansible(host, "command", "systemctl stop vd-slow-load.service")


LEFTOVERS_PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: vllm_ops.deploy.vllm_install
        tasks_from: gate_leftovers
"""


def test_an_interrupted_gates_candidate_and_env_file_are_removed(host, tmp_path):
    rc, out = ansible(host, "copy", json.dumps({"dest": "/run/vllm-gate-main.env", "mode": "0600",
                                                "content": "VLLM_API_KEY=not-a-real-key\n"}))
    assert rc == 0, out
    rc, out = ansible(host, "command", json.dumps({"argv": [
        "systemd-run", "--unit=vllm-gate-main.service", "--collect", "--service-type=exec",
        "/bin/sleep", "600"]}))
    assert rc == 0, out
    play = tmp_path / "leftovers.yml"
    play.write_text(LEFTOVERS_PLAY)

    def run():
        p = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", host, str(play)],
                           cwd=ROOT, capture_output=True, text=True, timeout=180, env=ENV,
                           check=False)
        return p.returncode, p.stdout + p.stderr
    rc, out = run()
    assert rc == 0, out
    assert "an interrupted upgrade gate left units vllm-gate-main.service and environment " \
           "files /run/vllm-gate-main.env" in out, out
    assert "not-a-real-key" not in out
    rc2, state = ansible(host, "shell", "systemctl is-active vllm-gate-main.service; "
                                        "ls /run/vllm-gate-main.env")
    assert "inactive" in state and "No such file" in state, state
    rc, out = run()
    assert rc == 0 and "changed=0" in out and "an interrupted upgrade gate left units" not in out, out
