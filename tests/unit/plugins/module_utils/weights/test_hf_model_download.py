"""Unit tests of hf_download.download() in its offline modes (no Hub involved): which files a
run hashes, a failed check marking the manifest invalid and the next run checking again, a
fan-out copy checked against its source's manifest. Real files in a temporary directory; the
online repair is tested against a real Hub server in tests/integration/test_hf_download.py."""
import hashlib
import json
import os

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_model_download import (
    DownloadFailed, download)
from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import (
    build_manifest, files_to_hash, git_blob_oid, normalize_overrides, plan_overrides,
    read_manifest, utc_now, write_json_atomic, write_overrides)

SHA = "3a43b235a4df7b2b2128ab9f6db8b01cf7048bcd"
SHARD = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def put(root, rel, data):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def files():
    return {"config.json": json.dumps({"model_type": "llama", "quantization_config": {
        "kv_cache_scheme": {"num_bits": 8}}}).encode(),
        "tokenizer.json": b'{"version": "1.0"}',
        SHARD: os.urandom(3000), SHARD2: os.urandom(2000)}


def lay_out(root, content, hashed=True, overrides=None):
    """A finished local_dir download with its manifest, as the module writes it."""
    expected = {}
    for rel, data in content.items():
        put(root, rel, data)
        put(root, os.path.join(".cache", "huggingface", "download", rel + ".metadata"),
            ("%s\netag\n1700000000.0\n" % SHA).encode())
        expected[rel] = {"size": len(data), "oid": git_blob_oid(data),
                         "sha256": hashlib.sha256(data).hexdigest()
                         if rel.endswith(".safetensors") else None}
    ops = normalize_overrides(overrides or [])
    applied = write_overrides(str(root), plan_overrides(str(root), ops)) if ops else []
    req = {"repo_id": "org/m", "revision": SHA, "allow_patterns": None,
           "ignore_patterns": None, "overrides": ops}
    m = build_manifest(req, SHA, expected, hashed, applied,
                       hashes_verified_at=utc_now() if hashed else None)
    write_json_atomic(os.path.join(str(root), ".hf-manifest.json"), m)
    return m


def params(root, **kw):
    p = {"repo_id": None, "revision": None, "local_dir": str(root), "allow_patterns": None,
         "ignore_patterns": None, "max_workers": 8, "endpoint": None, "token": None,
         "high_performance": False, "disk_margin_bytes": 0, "verify_hashes": False,
         "overrides": [], "manifest": ".hf-manifest.json", "progress_interval": 1.0,
         "offline": True, "hash_workers": 2, "hash_files": None, "source_manifest": None,
         "on_damage": None}
    p.update(kw)
    return p


def flip_byte(path, at=None):
    """Same-size damage that keeps the mtime (what bit rot or a bad copy looks like)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2 if at is None else at)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def manifest(root):
    return read_manifest(os.path.join(str(root), ".hf-manifest.json"))


# ------------------------------------------------------------------ which files are hashed

def test_files_to_hash_rules(tmp_path):
    m = lay_out(tmp_path, files())
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import (
        expected_from_manifest)
    expected = expected_from_manifest(m)
    everything = sorted(expected)
    assert files_to_hash(expected, None) == everything                     # first download
    assert files_to_hash(expected, dict(m, hashes_verified_at=None)) == everything
    assert files_to_hash(expected, m) == []                               # vouched for
    assert files_to_hash(expected, m, force_all=True) == everything       # asked for
    assert files_to_hash(expected, m, extra=[SHARD, "not/listed"]) == [SHARD]
    assert files_to_hash(expected, dict(m, invalid={"at": "x", "files": {SHARD2: "bad"}})) \
        == [SHARD2]
    changed = dict(expected, **{SHARD: dict(expected[SHARD], sha256="0" * 64)})
    assert files_to_hash(changed, m) == [SHARD]                           # new content


def test_default_run_hashes_nothing_once_vouched_for(tmp_path):
    lay_out(tmp_path, files())
    before = os.stat(str(tmp_path / ".hf-manifest.json")).st_mtime_ns
    res = download(params(tmp_path))
    assert res["verified"] and res["hashes_verified"] and not res["changed"]
    assert res["hash"] is None and res["reason"].startswith("manifest matches")
    assert os.stat(str(tmp_path / ".hf-manifest.json")).st_mtime_ns == before  # not written


def test_never_hashed_manifest_is_hashed_once_then_trusted(tmp_path):
    lay_out(tmp_path, files(), hashed=False)
    res = download(params(tmp_path))
    assert res["verified"] and res["hashes_verified"] and not res["changed"]
    assert res["hash"]["files"] == 4
    assert res["hash"]["bytes"] == sum(os.path.getsize(str(tmp_path / f)) for f in files())
    assert manifest(tmp_path)["hashes_verified_at"]
    again = download(params(tmp_path))
    assert again["hash"] is None


# ------------------------------------------------------------------ same-size damage, offline

def test_same_size_damage_fails_invalidates_and_is_checked_again(tmp_path):
    content = files()
    lay_out(tmp_path, content)
    shard = str(tmp_path / SHARD)
    flip_byte(shard)
    # the cheap default check cannot see it
    assert download(params(tmp_path))["verified"] is True
    # asked for: found, named with both digests, the manifest marked invalid
    with pytest.raises(DownloadFailed) as err:
        download(params(tmp_path, verify_hashes=True))
    msg = str(err.value)
    with open(shard, "rb") as f:
        found = hashlib.sha256(f.read()).hexdigest()
    assert "hash verification of org/m@%s in %s failed for 1 file: %s: sha256 %s, expected %s" \
        % (SHA, tmp_path, SHARD, found, hashlib.sha256(content[SHARD]).hexdigest()) in msg
    assert "is marked invalid" in msg and "nothing was repaired (offline" in msg
    assert err.value.result["manifest_invalidated"] and err.value.result["verified"] is False
    m = manifest(tmp_path)
    assert m["invalid"]["files"][SHARD].startswith("sha256 ") and m["hashes_verified"] is False
    assert m["hashes_verified_at"]  # the last full pass is kept: the rest stays vouched for
    # the next DEFAULT run checks that file again (and only it), and fails again
    with pytest.raises(DownloadFailed) as err:
        download(params(tmp_path))
    assert err.value.result["hash"]["files"] == 1
    # the file is restored: the next default run hashes it, clears the record
    put(tmp_path, SHARD, content[SHARD])
    res = download(params(tmp_path))
    assert res["verified"] and res["hashes_verified"] and res["hash"]["files"] == 1
    assert manifest(tmp_path)["invalid"] is None
    assert download(params(tmp_path))["hash"] is None


def test_small_file_damage_found_by_git_blob_sha1(tmp_path):
    content = files()
    lay_out(tmp_path, content)
    flip_byte(str(tmp_path / "tokenizer.json"), at=3)
    with pytest.raises(DownloadFailed) as err:
        download(params(tmp_path, verify_hashes=True))
    assert "tokenizer.json: git blob sha1 " in str(err.value)
    assert "expected %s" % git_blob_oid(content["tokenizer.json"]) in str(err.value)


def test_overridden_file_is_checked_through_its_backup(tmp_path):
    lay_out(tmp_path, files(),
            overrides=[{"file": "config.json", "delete": "quantization_config.kv_cache_scheme"}])
    res = download(params(tmp_path, verify_hashes=True))
    assert res["verified"] and res["hash"]["files"] == 4
    flip_byte(str(tmp_path / "config.json.orig"), at=2)
    with pytest.raises(DownloadFailed) as err:
        download(params(tmp_path, verify_hashes=True))
    assert "config.json: " in str(err.value)


def test_report_mode_returns_the_damage_without_failing(tmp_path):
    lay_out(tmp_path, files())
    flip_byte(str(tmp_path / SHARD2))
    res = download(params(tmp_path, verify_hashes=True, on_damage="report"))
    assert res["verified"] is False and not res["changed"]
    assert list(res["damaged"]) == [SHARD2] and res["manifest_invalidated"]


def test_check_mode_hashes_but_writes_nothing(tmp_path):
    lay_out(tmp_path, files())
    flip_byte(str(tmp_path / SHARD))
    raw = (tmp_path / ".hf-manifest.json").read_bytes()
    with pytest.raises(DownloadFailed) as err:
        download(params(tmp_path, verify_hashes=True), check_mode=True)
    assert SHARD in str(err.value) and "marked invalid" not in str(err.value)
    assert (tmp_path / ".hf-manifest.json").read_bytes() == raw


@pytest.mark.parametrize("change, fragment", [
    ({"on_damage": "repair"}, "on_damage=repair needs the Hub (offline=false)"),
    ({"on_damage": "sometimes"}, "on_damage must be one of repair, fail, report"),
    ({"hash_workers": -1}, "hash_workers must be >= 0"),
    ({"source_manifest": {"format": 99}}, "source_manifest is not a manifest of format 1"),
    ({"offline": False, "repo_id": "org/m", "revision": SHA, "source_manifest": {}},
     "source_manifest (the reference of a copy) needs offline=true"),
    ({"hash_files": ["/etc/passwd"]}, "hash_files[0] '/etc/passwd' is not a repo-relative"),
])
def test_bad_verification_parameters_are_refused(tmp_path, change, fragment):
    lay_out(tmp_path, files())
    with pytest.raises(DownloadFailed) as err:
        download(params(tmp_path, **change))
    assert fragment in str(err.value)


# ------------------------------------------------------------------ a copy vs its source

def test_copy_checked_against_the_source_manifest(tmp_path):
    content = files()
    src = lay_out(tmp_path / "src", content)
    copy = tmp_path / "copy"
    for rel, data in content.items():  # what rsync leaves: the files and their metadata
        put(copy, rel, data)
        put(copy, os.path.join(".cache", "huggingface", "download", rel + ".metadata"),
            ("%s\netag\n1700000000.0\n" % SHA).encode())
    # first check of the copy: every file hashed, the copy's own manifest written
    res = download(params(copy, source_manifest=src))
    assert res["verified"] and res["hash"]["files"] == 4 and not res["changed"]
    mine = manifest(copy)
    assert mine["files"] == src["files"] and mine["digests"] == src["digests"]
    assert mine["hashes_verified_at"] >= src["hashes_verified_at"]
    # next default check: nothing hashed, nothing written
    stamp = os.stat(str(copy / ".hf-manifest.json")).st_mtime_ns
    res = download(params(copy, source_manifest=src))
    assert res["hash"] is None
    assert os.stat(str(copy / ".hf-manifest.json")).st_mtime_ns == stamp
    # rsync re-copied one file: that one is hashed
    res = download(params(copy, source_manifest=src, hash_files=[SHARD2]))
    assert res["hash"]["files"] == 1
    # a damaged copy: found on request, reported for the caller to copy it again
    flip_byte(str(copy / SHARD))
    res = download(params(copy, source_manifest=src, verify_hashes=True, on_damage="report"))
    assert list(res["damaged"]) == [SHARD] and res["verified"] is False
    assert manifest(copy)["invalid"]["files"].keys() == {SHARD}
    assert manifest(tmp_path / "src")["invalid"] is None  # the source is not touched
    # still invalid for the next default check, until the file is right again
    res = download(params(copy, source_manifest=src, on_damage="report"))
    assert list(res["damaged"]) == [SHARD]
    put(copy, SHARD, content[SHARD])
    res = download(params(copy, source_manifest=src, hash_files=[SHARD]))
    assert res["verified"] and manifest(copy)["invalid"] is None


def test_copy_missing_a_file_fails_cheaply(tmp_path):
    content = files()
    src = lay_out(tmp_path / "src", content)
    copy = tmp_path / "copy"
    for rel, data in content.items():
        if rel != SHARD2:
            put(copy, rel, data)
    with pytest.raises(DownloadFailed) as err:
        download(params(copy, source_manifest=src))
    assert "%s missing or resized (manifest source_manifest)" % SHARD2 in str(err.value)
