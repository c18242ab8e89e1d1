"""The vllm_benchmark role with several load-generator hosts, against test_sweep_real.py's
vLLM CPU server (its ``server`` fixture; these tests are collected there, so the server starts
once): an agent on a test host reached over SSH (vd-mh-1, SSH 2311, agent port 8312) and one
on this machine (8313), coordinated from this machine (the runner), the GPU host unreachable.

Needs root (systemd-nspawn test hosts) besides what test_sweep_real.py needs. The test host's
agent runs with a venv of its own (/opt/lg) that gets aiohttp from wheels copied in from here
(pip download on this machine; the host has no index of its own).
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))

VLLM_PYTHON = os.environ.get("VD_VLLM_PYTHON")
HOST, SSH_PORT, AGENT_PORT, LOCAL_AGENT_PORT = "vd-mh-1", 2311, 8312, 8313
LG_PYTHON = "/opt/lg/bin/python"
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
API_KEY = "multihost-key-2b7e"


def dead_port():
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def yaml_load(path):
    import yaml
    with open(str(path)) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def loadgen_host(server):
    """vd-mh-1 booted, with a Python that has aiohttp; the workspace of these tests."""
    if os.geteuid() != 0:
        pytest.skip("test hosts need root (systemd-nspawn)")
    import testhost as th
    tmp = server["tmp"] / "multihost"
    tmp.mkdir()
    t0 = time.monotonic()
    th.destroy("vd-mh-")
    try:
        st = th.create(HOST, SSH_PORT)
        wheels = os.path.join(st["root"], "srv", "lg-wheels")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                        "-d", wheels, "aiohttp"], check=True, timeout=300)
        subprocess.run(th.ssh_base(SSH_PORT) + [
            "python3 -m venv /opt/lg && /opt/lg/bin/pip install -q --no-index "
            "--find-links /srv/lg-wheels aiohttp"], check=True, timeout=300)
        print("multihost: %s booted with aiohttp in %.1f s" % (HOST, time.monotonic() - t0))
        yield {"th": th, "tmp": tmp, "base": server["base"]}
    finally:
        t0 = time.monotonic()
        th.destroy("vd-mh-")
        print("multihost: %s destroyed in %.1f s" % (HOST, time.monotonic() - t0))


def _inventory(s):
    th, tmp = s["th"], s["tmp"]
    inv = tmp / "inv"
    (inv / "host_vars").mkdir(parents=True, exist_ok=True)
    path = str(inv / "ssh.yml")
    th.write_inventory([HOST], path)
    doc = yaml_load(path)
    hosts = doc["all"]["children"]["vllm_hosts"]["hosts"]
    hosts[HOST].update(vllm_benchmark_python=LG_PYTHON, vllm_benchmark_agent_port=AGENT_PORT)
    # the play's vllm_benchmark_python is the GPU host's (an extra var would win over the
    # load generator's own, as extra vars win over every host's variables)
    doc["all"]["hosts"] = {
        "gpu": {"ansible_host": "127.0.0.1", "ansible_port": dead_port(),
                "ansible_connection": "ssh", "vllm_benchmark_python": VLLM_PYTHON},
        "loadgen": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "ansible_host": "127.0.0.1", "vllm_benchmark_agent_port": LOCAL_AGENT_PORT},
    }
    with open(str(inv / "hosts.yml"), "w") as f:
        json.dump(doc, f)
    os.unlink(path)
    (tmp / "play.yml").write_text(
        "- name: Benchmark\n  hosts: gpu\n  gather_facts: false\n"
        "  roles:\n    - role: vllm_ops.deploy.vllm_benchmark\n")
    return inv


def _play(s, inv, extra):
    evars = {
        "vllm_benchmark_url": s["base"], "vllm_benchmark_model": "tiny",
        "vllm_benchmark_api_key": API_KEY,
        "vllm_benchmark_delegate_to": "loadgen", "vllm_benchmark_levels": [2, 4],
        "vllm_benchmark_input_len": 32, "vllm_benchmark_output_len": 16,
        "vllm_benchmark_duration_s": 2, "vllm_benchmark_stop_on_saturation": False,
        "vllm_benchmark_report_root": str(s["tmp"] / "reports"),
        "vllm_benchmark_request_log_dir": str(s["tmp"]),
        "vllm_benchmark_agent_listen_host": "127.0.0.1",
        "vllm_benchmark_agent_timeout_s": 120,
    }
    evars.update(extra)
    path = s["tmp"] / "vars.json"
    path.write_text(json.dumps(evars))
    t0 = time.monotonic()
    out = subprocess.run([PLAYBOOK, "-i", str(inv / "hosts.yml"), str(s["tmp"] / "play.yml"),
                          "-e", "@%s" % path], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, check=False,
                         env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"))
    return out.returncode, out.stdout + out.stderr, time.monotonic() - t0


def _listening(port):
    with socket.socket() as sk:
        return sk.connect_ex(("127.0.0.1", port)) == 0


def _left_on_host(th):
    """Async job files and vllm_sweep processes left on the test host. async_wrapper's
    watcher checks its job every 5 s, so it may outlive the job by that long."""
    deadline = time.monotonic() + 15
    while True:
        left = subprocess.run(th.ssh_base(SSH_PORT) + [
            "ls -A /root/.ansible_async 2>/dev/null | wc -l; pgrep -fc '[v]llm_sweep' || true"],
            capture_output=True, text=True, timeout=60, check=True).stdout.split()
        if left == ["0", "0"] or time.monotonic() > deadline:
            return left
        time.sleep(1)


def test_role_sweeps_from_an_agent_over_ssh_and_a_local_one(loadgen_host):
    s = loadgen_host
    inv = _inventory(s)
    rc, out, took = _play(s, inv, {"vllm_benchmark_load_generators": [HOST, "loadgen"]})
    assert rc == 0, out[-4000:]
    assert API_KEY not in out
    results = yaml_load(str(inv / "host_vars" / "gpu" / "vllm_benchmark.yml"))
    stored = results["vllm_benchmark_results"]
    assert stored["provenance"]["load_generator"] == "loadgen"
    assert stored["provenance"]["load_generators"] == [HOST, "loadgen"]
    run = sorted((s["tmp"] / "reports" / "gpu" / "main").iterdir())[-1]
    text = (run / "sweep.json").read_text()
    assert API_KEY not in text and "authkey" not in text.replace('"load_generator_authkey"', "")
    sweep = json.loads(text)
    assert "load_generator_authkey" not in sweep["parameters"]
    agents = ["127.0.0.1:%d" % AGENT_PORT, "127.0.0.1:%d" % LOCAL_AGENT_PORT]
    assert sweep["client"]["load_generators"] == agents and sweep["client"]["processes"] == 2
    rows = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == sum(lv["requests_total"] for lv in sweep["levels"])
    for lv in sweep["levels"]:
        chk = lv["server_check"]
        # the merged requests of both agents are exactly the server's counter deltas
        assert chk["match"] is True, chk
        assert chk["client_output_tokens"] == chk["server_output_tokens"] == \
            16 * lv["requests_total"]
        assert chk["client_prompt_tokens"] == chk["server_prompt_tokens"] == \
            32 * lv["requests_total"]
        assert lv["requests_failed"] == 0
        cl = lv["client"]
        assert [p["host"] for p in cl["per_process"]] == [
            "load generator %s (load_generators[%d])" % (a, i) for i, a in enumerate(agents)]
        for p in cl["per_process"]:
            assert p["workers"] == lv["concurrency"] // 2
            assert p["clock"]["pings"] == 8 and p["clock"]["error_bound_ms"] < 20, p["clock"]
        assert cl["cpu_s_level"] > 0 and cl["connections_opened"] >= 0
        # every worker of the level sent requests: both agents took part
        assert {r["worker"] for r in rows if r["level"] == lv["concurrency"]} == \
            set(range(lv["concurrency"]))
    # the agents ended with the sweep, their job files are gone
    assert not _listening(AGENT_PORT) and not _listening(LOCAL_AGENT_PORT)
    left = _left_on_host(s["th"])
    assert left == ["0", "0"], left
    print("multihost role run: %.1f s" % took)


def test_role_refuses_a_load_generator_not_in_the_inventory(loadgen_host):
    s = loadgen_host
    inv = _inventory(s)
    rc, out, _unused = _play(s, inv, {"vllm_benchmark_load_generators": ["nohost"],
                                      "vllm_benchmark_force": True})
    assert rc != 0
    flat = " ".join(out.split())
    assert "vllm_benchmark_load_generators must list inventory hosts" in flat
    assert "not in the inventory: nohost" in flat


def test_role_stops_waiting_agents_when_the_sweep_fails(loadgen_host):
    """The sweep fails in its preflight (no server there), before it connects to any agent:
    the agents, waiting, are told to quit; nothing is left running or in the async files."""
    s = loadgen_host
    inv = _inventory(s)
    rc, out, _unused = _play(s, inv, {"vllm_benchmark_load_generators": [HOST, "loadgen"],
                                      "vllm_benchmark_url": "http://127.0.0.1:%d" % dead_port(),
                                      "vllm_benchmark_force": True})
    assert rc != 0
    flat = " ".join(out.split())
    assert "cannot reach the server at" in flat, out[-4000:]
    assert "Tell the agents to quit that still wait for a sweep that failed" in flat, out[-4000:]
    # no agent failed or was left running
    assert re.search(r"Say which agents failed or did not end\] \*+ skipping: \[gpu\]", flat), \
        out[-4000:]
    assert not _listening(AGENT_PORT) and not _listening(LOCAL_AGENT_PORT)
    left = _left_on_host(s["th"])
    assert left == ["0", "0"], left
