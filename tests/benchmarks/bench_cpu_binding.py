"""CPU binding benchmark: a vLLM CPU server starting beside another that serves load, per
CPU binding setting (VLLM_CPU_OMP_THREADS_BIND, OMP_NUM_THREADS), side by side in one run.

This is the shape of the test suite on a small machine: one job's instance answers requests
while another job's instance starts. Per setting and round:

1. server A starts (the cpu-tiny profile's arguments, --enforce-eager, the setting's binding)
   and idles; its CPU use while idle is measured (every process of its tree, user + system);
2. a client thread sends greedy completions to A one after another;
3. server B starts with the same setting while A is under that load: measured are B's seconds
   to the first 200 from /health (or "not healthy" at --timeout) and A's output tok/s during
   B's start, against A's tok/s alone just before;
4. both stop.

The settings alternate round by round, so drifting machine load falls on all alike. Printed:
one line per round, a table of medians, and each setting's ratios against ``auto`` (vLLM's
default) from the same run.

    python tests/benchmarks/bench_cpu_binding.py --vllm-python $VD_CACHE_DIR/vllm-cpu-venv/bin/python \\
        --model-dir .cache/tiny-model --work-dir /var/tmp/vd-binding
"""
import argparse
import os
import shutil
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vllm_start as bvs  # noqa: E402  (a sibling script, not a package)

# setting -> the environment it adds (vLLM's default binding is auto)
BINDINGS = {
    "auto": {"VLLM_CPU_OMP_THREADS_BIND": "auto"},
    "nobind": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
    # unpinned, one OpenMP thread per worker: the engine core's busy loop keeps one core
    "nobind-1t": {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"},
}


class Load(threading.Thread):
    """Greedy completions to one server, one at a time, counting output tokens by time."""

    def __init__(self, port, output_len):
        super().__init__(daemon=True)
        self.url = "http://127.0.0.1:%d/v1/completions" % port
        self.body = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": output_len,
                     "temperature": 0, "ignore_eos": True}
        self.done = []  # (finish time, tokens)
        self.errors = 0
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            try:
                out = bvs.post_json(self.url, self.body, timeout=300)
                self.done.append((time.time(), out["usage"]["completion_tokens"]))
            except Exception:  # noqa: BLE001  (counted; the load goes on)
                self.errors += 1
                time.sleep(0.5)

    def tok_s(self, t0, t1):
        return sum(n for t, n in self.done if t0 <= t < t1) / max(t1 - t0, 1e-9)


def serve(args, binding, port, tag):
    """Start a server with this binding; (proc, seconds to healthy) or (None, None) at timeout."""
    bvs.SETTINGS[binding] = (BINDINGS[binding], ["--enforce-eager"])
    a = argparse.Namespace(**vars(args))
    a.port = port
    try:
        proc, took, _log = bvs.start(a, binding, args.work_dir, tag)
    except SystemExit as e:
        print("  %s" % e, flush=True)
        return None, None
    return proc, took


def one_round(args, binding, rnd):
    row = {}
    a, row["a_start_s"] = serve(args, binding, args.port, "a%d" % rnd)
    if a is None:
        return None
    try:
        cpu0 = bvs.tree_cpu_s(a.pid)
        time.sleep(args.idle_s)
        row["a_idle_cpu_pct"] = 100.0 * (bvs.tree_cpu_s(a.pid) - cpu0) / args.idle_s
        load = Load(args.port, args.output_len)
        load.start()
        time.sleep(args.alone_s)
        t_b = time.time()
        row["a_tok_s_alone"] = load.tok_s(t_b - args.alone_s + 5, t_b)
        b, row["b_start_s"] = serve(args, binding, args.port + 1, "b%d" % rnd)
        t_end = time.time()
        row["a_tok_s_during_b"] = load.tok_s(t_b, t_end)
        load.halt.set()
        load.join(timeout=330)
        row["a_errors"] = load.errors
        if b is not None:
            bvs.stop(b)
    finally:
        bvs.stop(a)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--port", type=int, default=26220, help="A's port; B's is the next")
    ap.add_argument("--work-dir", required=True, help="emptied first; caches and logs")
    ap.add_argument("--settings", default=",".join(BINDINGS))
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--idle-s", type=float, default=20.0)
    ap.add_argument("--alone-s", type=float, default=25.0)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--timeout", type=int, default=300, help="B not healthy by then: reported")
    args = ap.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in BINDINGS]
    if unknown:
        ap.error("--settings: unknown %s (known: %s)" % (", ".join(unknown), ", ".join(BINDINGS)))
    args.model_dir = os.path.abspath(args.model_dir)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    rows = {s: [] for s in settings}
    for rnd in range(1, args.rounds + 1):
        for s in settings:
            row = one_round(args, s, rnd)
            rows[s].append(row)
            print("round %d %-9s %s" % (rnd, s, row), flush=True)

    def med(s, key):
        vals = [r[key] for r in rows[s] if r and r.get(key) is not None]
        return statistics.median(vals) if vals else float("nan")

    print("\n%-9s %9s %11s %9s %10s %12s %9s" % ("binding", "A start s", "A idle CPU%",
                                                 "B start s", "A tok/s", "A tok/s (B)", "B failed"))
    for s in settings:
        failed = sum(1 for r in rows[s] if r is None or r.get("b_start_s") is None)
        print("%-9s %9.1f %11.1f %9.1f %10.1f %12.1f %7d/%d" % (
            s, med(s, "a_start_s"), med(s, "a_idle_cpu_pct"), med(s, "b_start_s"),
            med(s, "a_tok_s_alone"), med(s, "a_tok_s_during_b"), failed, args.rounds))
    if "auto" in rows:
        print("\nratios against auto (same run, medians):")
        for s in settings:
            if s == "auto":
                continue
            print("  %-9s B start %.2f  A idle CPU %.2f  A tok/s during B's start %.2f" % (
                s, med(s, "b_start_s") / med("auto", "b_start_s"),
                med(s, "a_idle_cpu_pct") / med("auto", "a_idle_cpu_pct"),
                med(s, "a_tok_s_during_b") / med("auto", "a_tok_s_during_b")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
