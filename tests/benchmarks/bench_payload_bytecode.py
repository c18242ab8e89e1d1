"""What the module payloads' bytecode saves: an idempotent run of the host_prep and gpu_host
roles against one test host, with the suite's kept payloads as Ansible builds them (each
module_utils file compiled by zipimport on the host for every task) and with their bytecode
(tests/harness/ansible_plugins/callback/vd_payload_cache.py), side by side in one run.

The modules run on the test host, outside ansible-playbook's process tree, so each run is
measured by the whole machine's CPU seconds (user + nice + system from /proc/stat) over it: run
it on an otherwise idle machine. Both cases first build their payloads in a run of their own
(not counted), then run --rounds times, alternating. Printed: each case's median wall and CPU
seconds and the bytecode's CPU ratio against the sources. Needs root (systemd-nspawn).

    python tests/benchmarks/bench_payload_bytecode.py --rounds 3
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "harness"))
import testhost  # noqa: E402

HOST, PORT = "vd-bench-pyc-1", 2297
PLAY = """- name: host_prep and gpu_host, idempotent after the first run
  hosts: vllm_hosts
  become: true
  roles:
    - role: vllm_ops.deploy.host_prep
    - role: vllm_ops.deploy.gpu_host
"""
CASES = (("sources", "0"), ("bytecode", "1"))


def machine_cpu_s():
    with open("/proc/stat") as f:
        user, nice, system = (int(x) for x in f.readline().split()[1:4])
    return (user + nice + system) / float(os.sysconf("SC_CLK_TCK"))


def run(inventory, play, env):
    """(wall s, machine CPU s) of one ansible-playbook run; exits on a failed run."""
    c0, t0 = machine_cpu_s(), time.monotonic()
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                          "-i", inventory, play], env=env, capture_output=True, text=True,
                         check=False)
    wall, cpu = time.monotonic() - t0, machine_cpu_s() - c0
    if out.returncode != 0:
        raise SystemExit("the run failed:\n%s%s" % (out.stdout[-3000:], out.stderr[-3000:]))
    return wall, cpu


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="runs of each case (default 3)")
    args = ap.parse_args(argv)
    res = {c: [] for c, _flag in CASES}
    with tempfile.TemporaryDirectory(prefix="vd-pyc-") as work:
        testhost.destroy("vd-bench-pyc-")
        testhost.create(HOST, PORT)
        try:
            inventory = os.path.join(work, "hosts.yml")
            testhost.write_inventory([HOST], inventory)
            play = os.path.join(work, "play.yml")
            with open(play, "w") as f:
                f.write(PLAY)
            env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                       ANSIBLE_CALLBACK_PLUGINS=os.path.join(ROOT, "tests", "harness",
                                                             "ansible_plugins", "callback"),
                       VD_PAYLOAD_CACHE=os.path.join(work, "payloads"))
            envs = {c: dict(env, VD_PAYLOAD_BYTECODE=flag) for c, flag in CASES}
            for case, _flag in CASES:  # converge, and build each case's payloads
                run(inventory, play, envs[case])
            for _ in range(args.rounds):
                for case, _flag in CASES:
                    res[case].append(run(inventory, play, envs[case]))
        finally:
            testhost.destroy("vd-bench-pyc-")
    print("idempotent host_prep + gpu_host on one test host, %d rounds, medians" % args.rounds)
    print("%-9s %8s %8s %10s" % ("payloads", "wall s", "CPU s", "CPU ratio"))
    base = statistics.median(r[1] for r in res["sources"])
    for case, _flag in CASES:
        print("%-9s %8.2f %8.2f %10.3f" % (case, statistics.median(r[0] for r in res[case]),
                                           statistics.median(r[1] for r in res[case]),
                                           statistics.median(r[1] for r in res[case]) / base))


if __name__ == "__main__":
    main()
