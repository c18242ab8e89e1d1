"""Parallel hashing of model files (no Ansible, no third-party packages).

Used by hf_weights / hf_download (the hf_model_download module) to check weights against the
digests the Hub lists: the sha256 of an LFS file (its LFS oid) and the git blob sha1 of a
small file (``sha1(b"blob <len>\\0" + content)``, the ``oid`` of the tree listing).

Throughput: files are spread over a thread pool, largest first; inside each file a reader
thread fills a few large buffers while the worker hashes the previous one, so reading and
hashing overlap even when one large file is left. Both ``os.readv`` and ``hashlib``'s update
(for blocks over 2 KiB) release the GIL, so the threads run on as many cores as there are.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ALGORITHMS = ("sha256", "git_sha1")
BLOCK_BYTES = 8 << 20
BUFFERS_PER_FILE = 3
MAX_AUTO_WORKERS = 16


def auto_workers(n_files, cpus=None):
    """Workers for ``n_files`` files: one per core (at least 2, so reading one file overlaps
    hashing another), at most MAX_AUTO_WORKERS, never more than the files."""
    cpus = cpus or os.cpu_count() or 1
    return max(1, min(n_files, max(2, min(cpus, MAX_AUTO_WORKERS))))


def new_hasher(algo, size):
    if algo == "sha256":
        return hashlib.sha256()
    if algo == "git_sha1":
        return hashlib.sha1(b"blob %d\0" % size)
    raise ValueError("unknown digest algorithm %r (known: %s)" % (algo, ", ".join(ALGORITHMS)))


def _advise_sequential(fd):
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        try:
            advise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass


def _read_into(fd, buf):
    return os.readv(fd, [buf])


class _Pipe(object):
    """Hand-over of filled buffers from the reader thread to the hashing thread."""

    def __init__(self, block, buffers):
        self.cond = threading.Condition()
        self.free = [bytearray(block) for _unused in range(buffers)]
        self.full = []
        self.error = None
        self.done = False
        self.stop = False


def _reader(fd, pipe):
    try:
        while True:
            with pipe.cond:
                while not pipe.free and not pipe.stop:
                    pipe.cond.wait()
                if pipe.stop:
                    return
                buf = pipe.free.pop()
            n = _read_into(fd, buf)
            with pipe.cond:
                if n:
                    pipe.full.append((buf, n))
                else:
                    pipe.done = True
                pipe.cond.notify_all()
            if not n:
                return
    except BaseException as exc:  # handed to the hashing thread
        with pipe.cond:
            pipe.error = exc
            pipe.done = True
            pipe.cond.notify_all()


def _hash_pipelined(fd, h, block, buffers):
    pipe = _Pipe(block, buffers)
    reader = threading.Thread(target=_reader, args=(fd, pipe), daemon=True)
    reader.start()
    total = 0
    try:
        while True:
            with pipe.cond:
                while not pipe.full and not pipe.done:
                    pipe.cond.wait()
                if pipe.full:
                    buf, n = pipe.full.pop(0)
                elif pipe.error is not None:
                    raise pipe.error
                else:
                    break
            h.update(memoryview(buf)[:n])
            total += n
            with pipe.cond:
                pipe.free.append(buf)
                pipe.cond.notify_all()
    finally:
        with pipe.cond:
            pipe.stop = True
            pipe.cond.notify_all()
        reader.join()
    return total


def digest_file(path, algo, block=BLOCK_BYTES, buffers=BUFFERS_PER_FILE):
    """(hex digest, bytes read) of one file; ``buffers`` >= 2 overlaps reading and hashing."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        h = new_hasher(algo, size)
        _advise_sequential(fd)
        if buffers >= 2:
            total = _hash_pipelined(fd, h, block, buffers)
        else:
            buf = bytearray(block)
            view = memoryview(buf)
            total = 0
            while True:
                n = _read_into(fd, buf)
                if not n:
                    break
                h.update(view[:n])
                total += n
        return h.hexdigest(), total
    finally:
        os.close(fd)


def hash_files(jobs, workers=0, block=BLOCK_BYTES, buffers=BUFFERS_PER_FILE):
    """Hash ``jobs`` in parallel. Each job is a dict with ``path``, ``algo`` and ``size`` (for
    the order: largest first); other keys are returned untouched. Returns
    {"results": [job + {"digest", "bytes"} or {"error"}], "files", "bytes", "elapsed_s",
    "mb_per_s", "workers"}; a file that cannot be read gets ``error`` instead of a digest."""
    jobs = sorted(jobs, key=lambda j: -int(j.get("size") or 0))
    n = workers if workers and workers > 0 else auto_workers(len(jobs))
    n = max(1, min(n, len(jobs) or 1))

    def one(job):
        out = dict(job)
        try:
            out["digest"], out["bytes"] = digest_file(job["path"], job["algo"], block, buffers)
        except (IOError, OSError) as exc:
            out["error"] = "%s: %s" % (type(exc).__name__, exc.strerror or exc)
            out["bytes"] = 0
        return out

    start = time.time()
    if n == 1:
        results = [one(j) for j in jobs]
    else:
        with ThreadPoolExecutor(max_workers=n) as pool:
            results = list(pool.map(one, jobs))
    elapsed = time.time() - start
    total = sum(r["bytes"] for r in results)
    return {"results": results, "files": len(results), "bytes": total,
            "elapsed_s": round(elapsed, 3),
            "mb_per_s": round(total / elapsed / 1e6, 1) if elapsed > 0 and total else None,
            "workers": n}
