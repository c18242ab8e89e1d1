"""Run the heavy test jobs (integration tests, molecule scenarios) N at a time; exit non-zero
when any fails.

    run_suite.py [--jobs N] [--light NAME=COMMAND ...] [--log-dir DIR] [--times FILE]
                 [--cpu-account FILE] NAME=COMMAND [NAME=COMMAND ...]

With --times, the heavy jobs start longest first by the seconds FILE records for each (their
last measured times; the longest job bounds the wall time when it starts last); jobs FILE does
not know start first, in the order given (an unmeasured job may be the longest). At the end the
suite prints a table of every job (seconds, result) and writes the seconds of each job that
passed back into FILE, so the next run follows the latest measurements; a failed job keeps its
earlier time (it may have stopped early). Without --times, jobs start in the order given.
With --cpu-account FILE, the kernel's process accounting is on for the run and the end
prints the CPU it recorded by process kind (tests/harness/cpu_account.py), also written into
the --times file. After the tables, each failed job's failure lines (pytest's summary and
assertion lines, failed Ansible tasks) are printed again, so the end of a CI log says what
failed.
Each job's output goes to DIR/NAME.log and is printed whole, under a header, when the job
ends, so the CI log reads job by job however they interleaved. The jobs must not share test
hosts or ports: every scenario and integration test has its own host prefix and ports.

``--light`` jobs (unit tests, lint, sanity: no test host, no server) start at once beside the
first heavy jobs and take no slot: they use the CPU the heavy jobs leave idle while those boot
hosts and wait on SSH, instead of running alone before them.

Why two at a time on a two-core machine: most of a job's time is single-threaded (Python
imports of a starting vLLM server, ansible-playbook, SSH, one pinned CPU engine), so two jobs
use the two cores that one job leaves half idle.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

import cpu_account

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_job(text):
    name, sep, command = text.partition("=")
    if not sep or not name or not command.strip():
        raise argparse.ArgumentTypeError("a job is NAME=COMMAND, got %r" % text)
    return name, shlex.split(command)


def load_times(path):
    """{job name: seconds} from FILE (missing file: none known). A file that is not such a
    mapping is refused with its path, not silently ignored."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        try:
            data = json.load(f)
        except ValueError as e:
            raise ValueError("%s: not JSON (%s)" % (path, e)) from None
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
            for v in jobs.values()):
        raise ValueError("%s: expected {\"jobs\": {NAME: SECONDS, ...}}" % path)
    return {str(k): float(v) for k, v in jobs.items()}


def order_by_cost(jobs, times):
    """Jobs without a recorded time first (in the order given), then the rest longest first;
    equal times keep the order given."""
    indexed = list(enumerate(jobs))
    unknown = [j for _i, j in indexed if j[0] not in times]
    known = sorted(((i, j) for i, j in indexed if j[0] in times),
                   key=lambda ij: (-times[ij[1][0]], ij[0]))
    return unknown + [j for _i, j in known]


def next_job(pending, heavy_running, parallel, apart=()):
    """Index of the pending job to start now, or None. Light jobs start at once; a heavy job
    needs a free slot and must not be kept apart (``apart``: pairs of names) from a heavy job
    that is running; the first such job in order starts."""
    for i, (name, _argv, is_light) in enumerate(pending):
        if is_light:
            return i
        if len(heavy_running) >= parallel:
            return None
        if not any((name, r) in apart or (r, name) in apart for r in heavy_running):
            return i
    return None


def record_times(path, results, wall, parallel, previous=None, cpu=None):
    """Write FILE: every job's last passing time (a failed job keeps its earlier one) and a
    summary of this run (with ``cpu``, the run's CPU seconds by process kind). Written whole
    to a temporary file, then renamed."""
    jobs = {name: int(round(s)) for name, s in (previous or {}).items()}
    for name, rc, took in results:
        if rc == 0:
            jobs[name] = int(round(took))
    doc = {
        "jobs": dict(sorted(jobs.items(), key=lambda kv: (-kv[1], kv[0]))),
        "last_run": {
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": int(round(wall)),
            "jobs_at_a_time": parallel,
            "result": "passed" if all(rc == 0 for _n, rc, _t in results) else "failed",
            "job_s": {name: int(round(took)) for name, _rc, took in results},
        },
    }
    if cpu:
        doc["last_run"]["cpu_s"] = {k: int(round(v)) for k, v in cpu.items()}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    return doc


# Lines that say what failed: pytest's short summary and error lines, Ansible's failed tasks,
# molecule's failed actions. A job's whole output is printed when it ends, far above the end of
# the suite; CI logs are often read from the end.
FAILURE_LINE = re.compile(r"^(FAILED |ERROR |E   |fatal: |failed: \[|CRITICAL |.*Executed: Failed"
                          r"|={3,} .*(failed|error).* ={3,}$|TASK \[)")
# Colour codes, and the bar molecule draws before each line of Ansible's output.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MOLECULE_BAR = re.compile(r"^\s*\u2502 ?")
# Lines of a failed task's result kept below its fatal line (Ansible's YAML result is indented).
BODY_LINES = 30


def _plain(line):
    line = _ANSI.sub("", line.rstrip("\n"))
    return _MOLECULE_BAR.sub("", line)


def failure_digest(lines, limit=60):
    """The lines of a failed job's output that name what failed, the last ``limit`` of them.

    A failed Ansible task is kept with its TASK line and the first lines of its result, and left
    out when Ansible ignored it (an expected refusal that a test asserts)."""
    kept = []
    task = None
    body = None          # the failed task being collected: [task line, fatal line, result...]
    for raw in lines:
        line = _plain(raw)
        if body is not None:
            if line.startswith("...ignoring"):
                body = None
                continue
            if line.startswith(" ") and line.strip() and len(body) < BODY_LINES + 2:
                body.append(line[:400])
                continue
            if line.startswith(" ") and line.strip():
                continue
            kept.extend(body)
            body = None
        if not FAILURE_LINE.match(line):
            continue
        if line.startswith("TASK ["):
            task = line
            continue
        if line.startswith("fatal: ") or line.startswith("failed: ["):
            body = ([task] if task else []) + [line[:400]]
            task = None
            continue
        task = None
        kept.append(line[:400])
    if body is not None:
        kept.extend(body)
    if not kept:
        return ["(no failure line found in the job's output)"]
    return kept[-limit:]


def _run_jobs(pending, running, results, parallel, apart, log_dir, t0, out):
    """Start pending jobs as slots free up and collect them until none is left."""
    while pending or running:
        while True:
            i = next_job(pending, [v[0] for v in running.values() if not v[4]], parallel, apart)
            if i is None:
                break
            name, argv, is_light = pending.pop(i)
            path = os.path.join(log_dir, "%s.log" % name)
            log = open(path, "w")
            tag = " (light)" if is_light else ""
            print("=== start %s%s (+%.0f s): %s" % (name, tag, time.time() - t0, shlex.join(argv)),
                  file=out, flush=True)
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            running[proc] = (name, path, log, time.time(), is_light)
        time.sleep(1)
        for proc in [p for p in running if p.poll() is not None]:
            name, path, log, start, _light = running.pop(proc)
            log.close()
            took = time.time() - start
            status = "passed" if proc.returncode == 0 else "FAILED (rc %d)" % proc.returncode
            print("=== output of %s" % name, file=out, flush=True)
            with open(path, errors="replace") as f:
                for line in f:
                    out.write(line)
            print("=== %s: %s in %.0f s" % (name, status, took), file=out, flush=True)
            results.append((name, proc.returncode, took))


def run(jobs, parallel, log_dir, out=sys.stdout, light=(), times_file=None, apart=(),
        cpu_file=None):
    os.makedirs(log_dir, exist_ok=True)
    if cpu_file:
        why = cpu_account.start(cpu_file)
        if why:
            print("=== no CPU accounting (%s): the run goes on without it" % why, file=out)
            cpu_file = None
    times = load_times(times_file) if times_file else {}
    if times_file:
        jobs = order_by_cost(jobs, times)
        print("=== order by the times in %s: %s" % (
            times_file, ", ".join("%s (%s)" % (n, "%.0f s" % times[n] if n in times else "new")
                                  for n, _argv in jobs)), file=out, flush=True)
    pending = [(name, argv, True) for name, argv in light] + [(name, argv, False) for name, argv in jobs]
    running = {}  # Popen -> (name, log path, log file, start, light)
    results = []
    t0 = time.time()
    try:
        _run_jobs(pending, running, results, parallel, apart, log_dir, t0, out)
    finally:
        # off however the run ends: accounting does not outlive it
        why = cpu_account.stop() if cpu_file else None
    wall = time.time() - t0
    print("=== suite: %d jobs, %d at a time, %.0f s wall" % (len(results), parallel, wall),
          file=out)
    print("    %-24s %7s  %s" % ("job", "seconds", "result"), file=out)
    for name, rc, took in sorted(results, key=lambda r: -r[2]):
        print("    %-24s %7.0f  %s" % (name, took, "passed" if rc == 0 else "FAILED"), file=out)
    print("    %-24s %7.0f  (jobs summed)" % ("total", sum(r[2] for r in results)), file=out)
    cpu = None
    if cpu_file:
        records = cpu_account.read(cpu_file)
        print("=== CPU by process kind (BSD process accounting, %s%s)"
              % (cpu_file, "; " + why if why else ""), file=out)
        for line in cpu_account.table(records):
            print(line, file=out)
        by, _total = cpu_account.summarize(records)
        cpu = {k: v[0] for k, v in by.items()}
    if times_file:
        record_times(times_file, results, wall, parallel, times, cpu=cpu)
        print("=== times written to %s" % times_file, file=out)
    failed = [name for name, rc, _took in results if rc != 0]
    for name in failed:
        with open(os.path.join(log_dir, "%s.log" % name), errors="replace") as f:
            digest = failure_digest(f)
        print("=== what failed in %s (%d line(s); the whole output is above)" % (name, len(digest)),
              file=out)
        for line in digest:
            out.write(line if line.endswith("\n") else line + "\n")
    if failed:
        print("failed: %s" % ", ".join(failed), file=out)
    out.flush()
    return 1 if failed else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="jobs at a time (default 2)")
    ap.add_argument("--light", action="append", default=[], type=parse_job, metavar="NAME=COMMAND",
                    help="a job that needs no test host: starts at once and takes no slot")
    ap.add_argument("--log-dir", default=os.path.join(ROOT, ".cache", "suite"))
    ap.add_argument("--times", default=None, metavar="FILE",
                    help="JSON of each job's last measured seconds: order the heavy jobs "
                         "longest first by it, and write this run's times back into it")
    ap.add_argument("--apart", action="append", default=[], metavar="NAME,NAME",
                    help="two heavy jobs that never run at the same time (both measure vLLM "
                         "servers side by side on the same cores)")
    ap.add_argument("--cpu-account", default=None, metavar="FILE",
                    help="turn the kernel's process accounting on into FILE for the run and "
                         "print its CPU by process kind at the end (tests/harness/cpu_account.py)")
    ap.add_argument("job", nargs="+", type=parse_job, help="NAME=COMMAND")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1, got %d" % args.jobs)
    names = [n for n, _argv in args.light + args.job]
    if len(set(names)) != len(names):
        ap.error("job names must be unique: %s" % ", ".join(names))
    try:
        load_times(args.times)
    except (OSError, ValueError) as e:
        ap.error("--times: %s" % e)
    apart = set()
    for pair in args.apart:
        names_ = [n.strip() for n in pair.split(",")]
        if len(names_) != 2 or not all(names_):
            ap.error("--apart takes two job names separated by a comma, got %r" % pair)
        apart.add(tuple(names_))
    return run(args.job, args.jobs, args.log_dir, light=args.light, times_file=args.times,
               apart=apart, cpu_file=args.cpu_account)


if __name__ == "__main__":
    sys.exit(main())
