"""Benchmark: vllm_ops.deploy.hf_model_download vs plain `hf download` from a loopback hub.

Builds a repository of dummy shards, serves it with olah (tests/harness/hubserver.py) on a free
loopback port, then, alternating for --rounds rounds, downloads the same files at the same
pinned sha into fresh directories:
  * plain:  `hf download REPO --revision SHA --local-dir D --max-workers W` (HF_ENDPOINT set);
  * module: `ansible localhost -m hf_model_download` (the module as the role runs it, with the
            downloader venv's python), which adds planning (tree + sizes), a disk preflight,
            an access probe, progress sampling, verification and the manifest.
Prints medians and two ratios (the targets):
  * download ratio = plain time / module time (>= 0.9: the module costs at most ~10 %); given
    end to end (Ansible's own start-up included) and with Ansible's fixed start-up (median of
    `ansible localhost -m ping` with the same interpreter) taken off both sides' difference;
  * verification ratio = cheap verification time / module download time (<= 0.1): the
    module's verify_local_dir (sizes, metadata commit, no *.incomplete) on the result, and the
    whole no-op re-run (manifest matches, no network) for reference; the sha256 pass over
    every LFS file is timed too (what verify_hashes costs).

    bench_download.py [--shards 12] [--shard-mb 64] [--rounds 3] [--workers 8]

Needs HF_VENV (default $VD_CACHE_DIR/hub-venv, else /tmp/hf-venv) with huggingface_hub and
olah==0.5.4, and the tools venv's ansible next to this interpreter (or ANSIBLE_BIN).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("VD_CACHE_DIR", "/var/cache/vllm-deploy")


def default_venv():
    for cand in (os.environ.get("HF_VENV"), os.path.join(CACHE, "hub-venv"), "/tmp/hf-venv"):
        if cand and os.path.exists(os.path.join(cand, "bin", "olah-cli")):
            return cand
    sys.exit("bench: no venv with olah found: set HF_VENV (pip install olah==0.5.4 "
             "huggingface_hub==2.4.0)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_repo(path, shards, shard_bytes):
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, f)
    block = os.urandom(1 << 20)
    for i in range(shards):
        with open(os.path.join(path, "model-%05d-of-%05d.safetensors" % (i + 1, shards)),
                  "wb") as f:
            left = shard_bytes - i  # distinct sizes and contents
            f.write(i.to_bytes(4, "big"))
            left -= 4
            while left > 0:
                f.write(block[:min(left, len(block))])
                left -= len(block)


def timed(cmd, env=None):
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit("bench: %s failed (%d):\n%s\n%s"
                 % (cmd[0], out.returncode, out.stdout[-3000:], out.stderr[-3000:]))
    return elapsed, out.stdout


def ansible_env():
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, "collections"),
                ANSIBLE_STDOUT_CALLBACK="json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
                ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")


def run_module(ansible, py, args):
    cmd = [ansible, "localhost", "-i", "localhost,", "-c", "local", "-m", "vllm_ops.deploy.hf_model_download",
           "-e", "ansible_python_interpreter=%s" % py, "-a", json.dumps(args)]
    elapsed, out = timed(cmd, ansible_env())
    res = json.loads(out)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    if res.get("failed"):
        sys.exit("bench: module failed: %s" % res.get("msg"))
    return elapsed, res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--shards", type=int, default=12)
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--work-dir", default=None, help="default: a temporary directory")
    args = ap.parse_args(argv)

    sys.path.insert(0, os.path.join(ROOT, "collections"))
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import (  # noqa: E402
        read_manifest, verify_local_dir)  # pure Python, no Ansible needed

    venv = default_venv()
    py = os.path.join(venv, "bin", "python")
    hf = os.path.join(venv, "bin", "hf")
    ansible = os.environ.get("ANSIBLE_BIN",
                             os.path.join(os.path.dirname(sys.executable), "ansible"))
    work = args.work_dir or tempfile.mkdtemp(prefix="bench-download-")
    repo, port = "bench/dummy", free_port()
    state = os.path.join(work, "hub")
    total = args.shards * args.shard_mb * 1000 * 1000
    print("bench: %d shards x %d MB = %.2f GB, %d rounds, max_workers %d, work dir %s"
          % (args.shards, args.shard_mb, total / 1e9, args.rounds, args.workers, work),
          flush=True)
    make_repo(os.path.join(work, "model"), args.shards, args.shard_mb * 1000 * 1000)
    info = json.loads(subprocess.run(
        [py, os.path.join(ROOT, "tests", "harness", "hubserver.py"), "start", "--model-dir",
         os.path.join(work, "model"), "--repo", repo, "--port", str(port), "--state-dir", state],
        check=True, capture_output=True, text=True).stdout)
    sha, endpoint = info["sha"], info["endpoint"]
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HUB_DISABLE_PROGRESS_BARS="1",
               HF_HUB_DISABLE_TELEMETRY="1")
    env.pop("HF_HUB_OFFLINE", None)
    plain, module, module_dl, noop, verify, hashed, ping = [], [], [], [], [], [], []
    try:
        for r in range(args.rounds):
            order = ("plain", "module") if r % 2 == 0 else ("module", "plain")
            for kind in order:
                dest = os.path.join(work, "%s-%d" % (kind, r))
                if kind == "plain":
                    t, _unused = timed([hf, "download", repo, "--revision", sha, "--local-dir", dest,
                                        "--max-workers", str(args.workers)], env)
                    plain.append(t)
                else:
                    margs = {"repo_id": repo, "revision": sha, "local_dir": dest,
                             "endpoint": endpoint, "max_workers": args.workers,
                             "disk_margin_bytes": 0, "progress_interval": 1}
                    t, res = run_module(ansible, py, margs)
                    assert res["downloaded"] and res["verified"], res
                    module.append(t)
                    module_dl.append(res["download"]["elapsed_s"])
                    t2, res2 = run_module(ansible, py, margs)
                    assert not res2["changed"] and not res2["downloaded"], res2
                    noop.append(t2)
                    m = read_manifest(os.path.join(dest, ".hf-manifest.json"))
                    expected = dict((p, {"size": s, "sha256": m["lfs_sha256"].get(p)})
                                    for p, s in m["files"].items())
                    t0 = time.perf_counter()
                    ok = verify_local_dir(dest, expected, m["sha"])
                    verify.append(time.perf_counter() - t0)
                    assert ok["ok"], ok
                    t0 = time.perf_counter()
                    ok = verify_local_dir(dest, expected, m["sha"], hashes=True)
                    hashed.append(time.perf_counter() - t0)
                    assert ok["ok"] and ok["hashed"] == args.shards, ok
                print("bench: round %d %-6s %.2f s" % (r + 1, kind, t), flush=True)
                shutil.rmtree(dest)
            ping.append(timed([ansible, "localhost", "-i", "localhost,", "-c", "local", "-m",
                               "ping", "-e", "ansible_python_interpreter=%s" % py],
                              ansible_env())[0])
    finally:
        subprocess.run([py, os.path.join(ROOT, "tests", "harness", "hubserver.py"), "stop",
                        "--state-dir", state], capture_output=True, check=False)
    med = statistics.median
    p, m_, mdl, n, v, h, a = (med(plain), med(module), med(module_dl), med(noop), med(verify),
                              med(hashed), med(ping))
    print("\nmedians over %d rounds (%.2f GB each):" % (args.rounds, total / 1e9))
    print("  plain `hf download`            %7.2f s  (%.0f MB/s)" % (p, total / p / 1e6))
    print("  module, end to end (ansible)   %7.2f s  (%.0f MB/s)" % (m_, total / m_ / 1e6))
    print("  module's snapshot_download     %7.2f s" % mdl)
    print("  ansible start-up (ping)        %7.2f s" % a)
    print("  module no-op re-run (manifest) %7.2f s  (ansible included)" % n)
    print("  cheap verification             %7.3f s  (sizes + metadata commit + no .incomplete)"
          % v)
    print("  sha256 of every LFS file       %7.2f s  (verify_hashes)" % h)
    # paired per round (the two runs of a round are back to back: less drift from other load)
    pairs = [pl / mo for pl, mo in zip(plain, module)]
    pairs_net = [pl / max(mo - a, 1e-6) for pl, mo in zip(plain, module)]
    print("  per-round ratios plain/module   %s" % " ".join("%.2f" % x for x in pairs))
    print("\ndownload ratio plain/module: %.2f end to end, %.2f without Ansible's start-up "
          "(median of per-round ratios; ratio of medians %.2f; target >= 0.9)"
          % (med(pairs), med(pairs_net), p / m_))
    print("verification ratio cheap-verify/download: %.3f (no-op re-run/download: %.2f; "
          "target <= 0.1)" % (v / m_, n / m_))
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
