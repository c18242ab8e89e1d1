"""Run the heavy test jobs (integration tests, molecule scenarios) N at a time; exit non-zero
when any fails.

    run_suite.py [--jobs N] [--light NAME=COMMAND ...] [--log-dir DIR] NAME=COMMAND [NAME=COMMAND ...]

Jobs start in the order given (put the longest first: the longest job bounds the wall time);
each job's output goes to DIR/NAME.log and is printed whole, under a header, when the job
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
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_job(text):
    name, sep, command = text.partition("=")
    if not sep or not name or not command.strip():
        raise argparse.ArgumentTypeError("a job is NAME=COMMAND, got %r" % text)
    return name, shlex.split(command)


def run(jobs, parallel, log_dir, out=sys.stdout, light=()):
    os.makedirs(log_dir, exist_ok=True)
    pending = [(name, argv, True) for name, argv in light] + [(name, argv, False) for name, argv in jobs]
    running = {}  # Popen -> (name, log path, log file, start, light)
    results = []
    t0 = time.time()
    while pending or running:
        while pending and (pending[0][2] or sum(1 for v in running.values() if not v[4]) < parallel):
            name, argv, is_light = pending.pop(0)
            path = os.path.join(log_dir, "%s.log" % name)
            log = open(path, "w")
            print("=== start %s%s (+%.0f s): %s" % (name, " (light)" if is_light else "",
                                                   time.time() - t0, shlex.join(argv)),
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
    print("=== suite: %d jobs, %d at a time, %.0f s wall"
          % (len(results), parallel, time.time() - t0), file=out)
    for name, rc, took in results:
        print("    %-24s %-8s %5.0f s" % (name, "passed" if rc == 0 else "FAILED", took), file=out)
    failed = [name for name, rc, _took in results if rc != 0]
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
    ap.add_argument("job", nargs="+", type=parse_job, help="NAME=COMMAND")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1, got %d" % args.jobs)
    names = [n for n, _argv in args.light + args.job]
    if len(set(names)) != len(names):
        ap.error("job names must be unique: %s" % ", ".join(names))
    return run(args.job, args.jobs, args.log_dir, light=args.light)


if __name__ == "__main__":
    sys.exit(main())
