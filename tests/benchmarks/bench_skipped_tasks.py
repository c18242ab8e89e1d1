"""What a skipped task costs the controller: N tasks whose condition is false, as N tasks with
a `when` each, as one block with the `when`, and as one `include_tasks` with the `when`, side by
side in one run.

Ansible evaluates a block's condition again for every task in it, in a worker process forked
for that task, so a block that does not apply costs as much as its tasks each skipped; an
`include_tasks` whose condition is false is skipped once, and its file is not even read. The
roles use includes for the long stretches that most runs skip (a pending switch, the all-reduce
smoke on a host with fewer than 2 GPUs, a venv that is already built, a sweep that is not due,
a router that is off, a Hub download's checks for a local model).

Each case is run --rounds times, the cases alternating so that machine load drifts over all
alike, with `ansible-playbook -c local` on localhost. Measured per run: wall seconds and the CPU
seconds (user + system) of ansible-playbook and every process it started. Printed: a table of
the medians and each case's ratio against the N `when`s.

    python tests/benchmarks/bench_skipped_tasks.py --tasks 200 --rounds 3
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = ("tasks", "block", "include")


def write_cases(work, n):
    """The three playbooks of N skipped tasks; returns {case: path}."""
    task = "- name: t{i}\n  ansible.builtin.debug:\n    msg: x\n"
    cond = "nothing_set | default(false) | bool"
    head = "- hosts: localhost\n  gather_facts: false\n  tasks:\n"

    def indent(text, spaces):
        return "".join(" " * spaces + line + "\n" for line in text.splitlines())

    each = "".join(task.format(i=i) + "  when: %s\n" % cond for i in range(n))
    block = "- when: %s\n  block:\n%s" % (cond, indent("".join(task.format(i=i) for i in range(n)), 4))
    with open(os.path.join(work, "steps.yml"), "w") as f:
        f.write("".join(task.format(i=i) for i in range(n)))
    include = "- ansible.builtin.include_tasks: %s\n  when: %s\n" % (
        os.path.join(work, "steps.yml"), cond)
    paths = {}
    for case, body in (("tasks", each), ("block", block), ("include", include)):
        paths[case] = os.path.join(work, case + ".yml")
        with open(paths[case], "w") as f:
            f.write(head + indent(body, 4))
    return paths


def run(playbook, env):
    """(wall s, CPU s of ansible-playbook and its children, number of skipped tasks)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                          "-i", "localhost,", "-c", "local", playbook],
                         env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise SystemExit("%s failed:\n%s%s" % (playbook, out.stdout[-3000:], out.stderr[-3000:]))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stdout.count("skipping: [localhost]")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=200, help="skipped tasks per case (default 200)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each case (default 3)")
    args = ap.parse_args(argv)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    res = {c: [] for c in CASES}
    with tempfile.TemporaryDirectory(prefix="vd-skip-") as work:
        paths = write_cases(work, args.tasks)
        for _ in range(args.rounds):
            for case in CASES:
                res[case].append(run(paths[case], env))
    print("%d skipped tasks, %d rounds, medians" % (args.tasks, args.rounds))
    print("%-8s %8s %8s %8s %12s %10s" % ("case", "wall s", "CPU s", "skipped", "CPU ms/task",
                                          "CPU ratio"))
    base = statistics.median(r[1] for r in res["tasks"])
    for case in CASES:
        wall = statistics.median(r[0] for r in res[case])
        cpu = statistics.median(r[1] for r in res[case])
        skipped = res[case][0][2]
        print("%-8s %8.2f %8.2f %8d %12.1f %10.3f" % (case, wall, cpu, skipped,
                                                     1000.0 * cpu / args.tasks, cpu / base))


if __name__ == "__main__":
    main()
