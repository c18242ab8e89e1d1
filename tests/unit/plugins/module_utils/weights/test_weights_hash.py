"""Unit tests for plugins/module_utils/weights/weights_hash.py (parallel hashing of real files)."""
import hashlib
import os
import threading

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights import weights_hash
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import git_blob_oid
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.weights_hash import (
    auto_workers, digest_file, hash_files, new_hasher)


def put(path, data):
    with open(str(path), "wb") as f:
        f.write(data)
    return str(path)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 3 * 4096 + 17])
@pytest.mark.parametrize("buffers", [1, 2, 3])
def test_digest_file_equals_hashlib_at_block_edges(tmp_path, size, buffers):
    data = os.urandom(size)
    path = put(tmp_path / "f", data)
    # a tiny block so the reader hands over many buffers, also a partial last one
    assert digest_file(path, "sha256", block=4096, buffers=buffers) == \
        (hashlib.sha256(data).hexdigest(), size)
    assert digest_file(path, "git_sha1", block=4096, buffers=buffers) == \
        (git_blob_oid(data), size)


def test_git_sha1_is_the_git_blob_id(tmp_path):
    # `printf 'hello\n' | git hash-object --stdin`
    path = put(tmp_path / "h", b"hello\n")
    assert digest_file(path, "git_sha1")[0] == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'"):
        new_hasher("md5", 0)


def test_auto_workers():
    assert auto_workers(10, cpus=1) == 2      # reading one file overlaps hashing another
    assert auto_workers(10, cpus=8) == 8
    assert auto_workers(100, cpus=64) == 16    # capped
    assert auto_workers(3, cpus=64) == 3       # never more than the files
    assert auto_workers(0, cpus=8) == 1


def test_hash_files_in_parallel_largest_first_with_errors(tmp_path):
    files = dict(("f%d" % i, os.urandom(1000 * (i + 1))) for i in range(6))
    jobs = [{"rel": k, "path": put(tmp_path / k, v), "algo": "sha256", "size": len(v)}
            for k, v in files.items()]
    jobs.append({"rel": "gone", "path": str(tmp_path / "gone"), "algo": "sha256", "size": 0})
    out = hash_files(jobs, workers=3, block=512)
    assert out["workers"] == 3 and out["files"] == 7
    assert [r["rel"] for r in out["results"]][:6] == ["f5", "f4", "f3", "f2", "f1", "f0"]
    for r in out["results"]:
        if r["rel"] == "gone":
            assert r["error"].startswith("FileNotFoundError") and "digest" not in r
        else:
            assert r["digest"] == hashlib.sha256(files[r["rel"]]).hexdigest()
    assert out["bytes"] == sum(len(v) for v in files.values())
    assert out["mb_per_s"] > 0 and out["elapsed_s"] >= 0


def test_hash_files_uses_several_threads_at_once(tmp_path, monkeypatch):
    """Two files hash at the same time on two workers (each read waits until both started)."""
    paths = [put(tmp_path / n, os.urandom(64 * 1024)) for n in ("a", "b")]
    barrier = threading.Barrier(2, timeout=10)
    seen = set()
    real = weights_hash._read_into

    def read(fd, buf):
        name = threading.current_thread().name
        if name not in seen:
            seen.add(name)
            if len(seen) <= 2:
                barrier.wait()  # raises BrokenBarrierError if the files ran one after the other
        return real(fd, buf)

    monkeypatch.setattr(weights_hash, "_read_into", read)
    out = hash_files([{"path": p, "algo": "sha256", "size": 1} for p in paths], workers=2,
                     buffers=1)
    assert all("digest" in r for r in out["results"])
    assert len(seen) == 2


def test_hash_files_empty():
    out = hash_files([])
    assert out["files"] == 0 and out["bytes"] == 0 and out["mb_per_s"] is None
