"""Benchmark: hashing weights (hf_model_download's hash pass) vs the disk's sequential read.

Writes --files files of --file-mb MB of random bytes into --dir, then, for --rounds rounds,
measures on the same files, side by side:
  * read:  sequential read of every file with 8 MB blocks and no hashing, by 1 thread and by
           the hash pass's number of threads (the faster of the two is the disk's speed);
  * hash:  ``weights_hash.hash_files`` (the module's code: a thread pool over the files, a
           reader thread per file overlapping reads with sha256 updates) with the same files.
Each measurement runs twice: cold (the files' pages evicted from the page cache first, with
posix_fadvise(DONTNEED) on each file, which evicts the clean pages of that file without
privileges, or with --drop-caches ``echo 3 > /proc/sys/vm/drop_caches`` where permitted; the
script reports which one it used) and cached (right after a full read of the same files).
Prints medians, MB/s and ratio = hash MB/s / read MB/s (the target is >= 0.8) per mode.

    bench_hash.py [--dir /var/tmp/vd-bench-hash] [--files 4] [--file-mb 512] [--rounds 3]
                  [--workers 0] [--drop-caches] [--json]

Needs only Python >= 3.9; imports the collection from the checkout (collections/ on sys.path).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.weights_hash import (  # noqa: E402
    BLOCK_BYTES, auto_workers, hash_files)


def write_files(d, n, size):
    os.makedirs(d, exist_ok=True)
    paths = []
    chunk = bytearray(8 << 20)
    for i in range(n):
        p = os.path.join(d, "shard-%05d.bin" % i)
        if not os.path.exists(p) or os.path.getsize(p) != size:
            with open(p, "wb") as f:
                left = size
                while left:
                    k = min(left, len(chunk))
                    f.write(os.urandom(k))
                    left -= k
                f.flush()
                os.fsync(f.fileno())
        paths.append(p)
    return paths


def drop_caches(paths, system=False):
    """Evict the files' pages. posix_fadvise(DONTNEED) on each file by default (only these
    files' clean pages go; no privileges needed, other users of the machine keep their
    cache); with ``system``, ``echo 3 > /proc/sys/vm/drop_caches`` first (root only).
    Returns how: 'drop_caches', 'fadvise' or 'none'."""
    os.sync()
    if system:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            return "drop_caches"
        except OSError:
            pass
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return "none"
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise"


def read_all(paths, threads, block=BLOCK_BYTES):
    """Sequential read of every file, no hashing; returns bytes/s."""
    todo = list(paths)
    lock = threading.Lock()
    total = [0]

    def worker():
        buf = bytearray(block)
        n = 0
        while True:
            with lock:
                if not todo:
                    break
                p = todo.pop(0)
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                while True:
                    k = os.readv(fd, [buf])
                    if not k:
                        break
                    n += k
            finally:
                os.close(fd)
        with lock:
            total[0] += n

    start = time.time()
    ts = [threading.Thread(target=worker) for _i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return total[0] / (time.time() - start)


def hash_all(paths, workers):
    jobs = [{"path": p, "algo": "sha256", "size": os.path.getsize(p)} for p in paths]
    out = hash_files(jobs, workers=workers)
    assert all("digest" in r for r in out["results"]), out["results"]
    return out["bytes"] / out["elapsed_s"], out["workers"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--dir", default="/var/tmp/vd-bench-hash")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--file-mb", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=0, help="0 = the module's default")
    ap.add_argument("--drop-caches", action="store_true",
                    help="evict the whole page cache (root), not only the files' pages")
    ap.add_argument("--keep", action="store_true", help="keep the files")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    paths = write_files(a.dir, a.files, a.file_mb * 1000 * 1000)
    workers = a.workers or auto_workers(len(paths))
    res = {"cold": {"read_1": [], "read_n": [], "hash": []},
           "cached": {"read_1": [], "read_n": [], "hash": []}}
    how = None
    try:
        for _r in range(a.rounds):
            for key, fn in (("read_1", lambda: read_all(paths, 1)),
                            ("read_n", lambda: read_all(paths, workers)),
                            ("hash", lambda: hash_all(paths, workers)[0])):
                how = drop_caches(paths, a.drop_caches)
                res["cold"][key].append(fn())
                fn()  # warm the cache
                res["cached"][key].append(fn())
    finally:
        if not a.keep:
            shutil.rmtree(a.dir, ignore_errors=True)
    out = {"files": a.files, "file_mb": a.file_mb, "rounds": a.rounds, "workers": workers,
           "cpus": os.cpu_count(), "evicted_with": how}
    for mode in ("cold", "cached"):
        m = dict((k, statistics.median(v) / 1e6) for k, v in res[mode].items())
        disk = max(m["read_1"], m["read_n"])
        out[mode] = {"read_1_thread_mb_s": round(m["read_1"], 1),
                     "read_%d_threads_mb_s" % workers: round(m["read_n"], 1),
                     "hash_mb_s": round(m["hash"], 1),
                     "ratio_hash_to_read": round(m["hash"] / disk, 2)}
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print("%d files x %d MB, %d rounds (medians), %d hash workers, %d CPUs; cache evicted with %s"
          % (a.files, a.file_mb, a.rounds, workers, out["cpus"], how))
    print("%-7s %16s %16s %12s %8s" % ("mode", "read 1 thr MB/s", "read %d thr MB/s" % workers,
                                       "hash MB/s", "ratio"))
    for mode in ("cold", "cached"):
        o = out[mode]
        print("%-7s %16.1f %16.1f %12.1f %8.2f" % (
            mode, o["read_1_thread_mb_s"], o["read_%d_threads_mb_s" % workers], o["hash_mb_s"],
            o["ratio_hash_to_read"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
