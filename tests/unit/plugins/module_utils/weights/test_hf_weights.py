"""Unit tests for plugins/module_utils/weights/hf_weights.py (pure logic, no network)."""
import hashlib
import json
import os

import pytest

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import (
    FP8_KV_CACHE_OVERRIDE_EXAMPLE, HfWeightsError, apply_json_ops, build_manifest, bytes_missing,
    disk_preflight, existing_ancestor, file_complete, find_incomplete, free_bytes, git_blob_oid,
    human_bytes, incomplete_bytes, is_commit_sha, manifest_matches, normalize_overrides,
    normalize_patterns, path_selected, plan_overrides, progress_bytes, read_download_metadata,
    read_manifest, remove_incomplete, request_from_manifest, select_files, verify_local_dir,
    write_json_atomic, write_overrides)

SHA = "3a43b235a4df7b2b2128ab9f6db8b01cf7048bcd"
OTHER_SHA = "0" * 40


# ------------------------------------------------------------------ helpers

def put(root, rel, data):
    path = os.path.join(str(root), rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def put_meta(root, rel, commit=SHA, etag="e", ts=1700000000.0):
    """The metadata file huggingface_hub writes next to a local_dir download."""
    put(root, os.path.join(".cache", "huggingface", "download", rel + ".metadata"),
        ("%s\n%s\n%s\n" % (commit, etag, ts)).encode())


def downloaded(root, files, commit=SHA):
    """Lay out files as a finished local_dir download; return the expected-files dict."""
    expected = {}
    for rel, data in files.items():
        put(root, rel, data)
        put_meta(root, rel, commit)
        expected[rel] = {"size": len(data), "oid": git_blob_oid(data),
                         "sha256": hashlib.sha256(data).hexdigest()
                         if rel.endswith(".safetensors") else None}
    return expected


CONFIG = {"model_type": "minimax_m2",
          "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                  "kv_cache_scheme": {"type": "float", "num_bits": 8}}}
QUANT = {"producer": {"name": "modelopt"},
         "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}


def model_files():
    return {"config.json": json.dumps(CONFIG).encode(),
            "hf_quant_config.json": json.dumps(QUANT).encode(),
            "model-00001-of-00002.safetensors": b"a" * 1000,
            "model-00002-of-00002.safetensors": b"b" * 500}


# ------------------------------------------------------------------ revisions and patterns

def test_is_commit_sha():
    assert is_commit_sha(SHA)
    assert not is_commit_sha("main")
    assert not is_commit_sha(SHA.upper())
    assert not is_commit_sha(SHA[:39])
    assert not is_commit_sha(None)


def test_normalize_patterns_accepts_lists_and_strings():
    assert normalize_patterns(None, "allow_patterns") is None
    assert normalize_patterns("*.json", "allow_patterns") == ["*.json"]
    assert normalize_patterns(["a\\*.json", "sub/"], "x") == ["a/*.json", "sub/"]


@pytest.mark.parametrize("bad, fragment", [
    ([""], "allow_patterns[0] must be a non-empty string"),
    (["*.json", 3], "allow_patterns[1] must be a non-empty string"),
    (["/etc/*"], "allow_patterns[0] '/etc/*' is not a repo-relative glob"),
    (["a/../b"], "is not a repo-relative glob"),
    (["model-[0-9.safetensors"], "unbalanced"),
    ({"a": 1}, "allow_patterns must be a list"),
])
def test_normalize_patterns_rejects_bad_patterns(bad, fragment):
    with pytest.raises(HfWeightsError) as err:
        normalize_patterns(bad, "allow_patterns")
    assert fragment in str(err.value)


def test_path_selected_follows_huggingface_hub_semantics():
    # '*' crosses '/', case-sensitive, 'dir/' means everything below dir
    assert path_selected("sub/deep/a.json", ["*.json"], None)
    assert not path_selected("config.JSON", ["*.json"], None)
    assert path_selected("original/x.pth", ["original/"], None)
    assert not path_selected("original/x.pth", None, ["original/"])
    assert path_selected("x.bin", None, None)
    assert not path_selected("a.json", ["*.json"], ["a.*"])


def test_select_files_filters_and_reports_unmatched_allow_pattern():
    tree = {"config.json": {"size": 1}, "model.safetensors": {"size": 2},
            "original/consolidated.pth": {"size": 3}, "sub/a.txt": {"size": 4}}
    got = select_files(tree, ["*.json", "*.safetensors", "sub/"], ["original/*"], "o/r@sha")
    assert sorted(got) == ["config.json", "model.safetensors", "sub/a.txt"]
    with pytest.raises(HfWeightsError) as err:
        select_files(tree, ["*.json", "*.gguf"], None, "o/r@sha")
    assert "allow_patterns[1] '*.gguf' matches no file in o/r@sha (4 files)" == str(err.value)
    with pytest.raises(HfWeightsError) as err:
        select_files(tree, None, ["*"], "o/r@sha")
    assert "select no file in o/r@sha" in str(err.value)


# ------------------------------------------------------------------ disk preflight

@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (999, "999 B"), (1500, "1.5 kB"), (230100000000, "230.1 GB"),
    (1200000000000, "1.2 TB"), (540 * 10 ** 9, "540.0 GB"), (3 * 10 ** 15, "3000.0 TB"),
])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_disk_preflight_message_and_boundary():
    disk_preflight(230100000000, 1200000000000, 0, "/srv/models/m")  # fits: no error
    disk_preflight(100, 150, 50, "/srv/models/m")  # exactly fits
    with pytest.raises(HfWeightsError) as err:
        disk_preflight(100, 150, 51, "/srv/models/m")
    assert "1 B" in str(err.value)
    with pytest.raises(HfWeightsError) as err:
        disk_preflight(230100000000, 1200000000, 10 ** 9, "/nonexistent-xyz/models/m")
    msg = str(err.value)
    assert "230.1 GB needed + 1.0 GB margin (disk_margin_bytes), 1.2 GB free" in msg
    assert "filesystem of /" in msg and "local_dir" in msg
    assert "free 229.9 GB" in msg  # 230.1 + 1.0 - 1.2


def test_free_bytes_uses_nearest_existing_parent(tmp_path):
    target = tmp_path / "not" / "yet" / "there"
    assert existing_ancestor(str(target)) == str(tmp_path)
    st = os.statvfs(str(tmp_path))
    # free space can move between two calls on a shared disk: allow a little drift
    assert abs(free_bytes(str(target)) - st.f_bavail * st.f_frsize) < 64 * 2 ** 20


# ------------------------------------------------------------------ verification

def test_read_download_metadata(tmp_path):
    assert read_download_metadata(str(tmp_path), "config.json") is None
    put_meta(tmp_path, "sub/config.json", SHA, "abc", 12.5)
    assert read_download_metadata(str(tmp_path), "sub/config.json") == \
        {"commit": SHA, "etag": "abc", "timestamp": 12.5}
    put(tmp_path, ".cache/huggingface/download/bad.json.metadata", b"only-one-line\n")
    assert read_download_metadata(str(tmp_path), "bad.json") is None


def test_verify_complete_download(tmp_path):
    expected = downloaded(tmp_path, model_files())
    res = verify_local_dir(str(tmp_path), expected, SHA, hashes=True)
    assert res == {"ok": True, "problems": [], "hashed": 4}  # 2 LFS sha256, 2 git blob sha1
    assert bytes_missing(str(tmp_path), expected, SHA) == 0
    assert progress_bytes(str(tmp_path), expected, SHA) == sum(
        i["size"] for i in expected.values())


def test_verify_reports_each_problem(tmp_path):
    expected = downloaded(tmp_path, model_files())
    root = str(tmp_path)
    os.remove(os.path.join(root, "hf_quant_config.json"))                     # missing
    put(root, "model-00002-of-00002.safetensors", b"b" * 499)                  # short
    put_meta(root, "config.json", OTHER_SHA)                                   # other commit
    os.remove(os.path.join(root, ".cache/huggingface/download/"
                                 "model-00001-of-00002.safetensors.metadata"))  # no metadata
    put(root, ".cache/huggingface/download/x1.abc.incomplete", b"123")         # leftover
    res = verify_local_dir(root, expected, SHA)
    assert not res["ok"]
    assert res["problems"] == [
        "config.json: downloaded from commit %s, expected %s" % (OTHER_SHA, SHA),
        "hf_quant_config.json: missing",
        "model-00001-of-00002.safetensors: no download metadata (%s)" % os.path.join(
            root, ".cache", "huggingface", "download",
            "model-00001-of-00002.safetensors.metadata"),
        "model-00002-of-00002.safetensors: size 499, expected 500",
        ".cache/huggingface/download/x1.abc.incomplete: incomplete download left",
    ]
    # missing bytes: config (other commit) + quant (missing) + shard1 (no meta) + shard2
    assert bytes_missing(root, expected, SHA) == sum(i["size"] for i in expected.values())
    # progress counts only the .incomplete part here
    assert progress_bytes(root, expected, SHA) == 3


def test_verify_hashes_catches_same_size_corruption(tmp_path):
    expected = downloaded(tmp_path, model_files())
    put(tmp_path, "model-00001-of-00002.safetensors", b"x" * 1000)
    assert verify_local_dir(str(tmp_path), expected, SHA)["ok"]  # cheap check cannot see it
    res = verify_local_dir(str(tmp_path), expected, SHA, hashes=True)
    assert res["problems"] == ["model-00001-of-00002.safetensors: sha256 %s, expected %s"
                               % (hashlib.sha256(b"x" * 1000).hexdigest(),
                                  hashlib.sha256(b"a" * 1000).hexdigest())]


def test_overridden_file_is_verified_through_its_backup(tmp_path):
    expected = downloaded(tmp_path, model_files())
    root = str(tmp_path)
    put(root, "config.json.orig", model_files()["config.json"])
    put(root, "config.json", b"{}")
    assert verify_local_dir(root, expected, SHA)["ok"]
    assert file_complete(root, "config.json", expected["config.json"], SHA)
    os.remove(os.path.join(root, "config.json.orig"))
    assert not verify_local_dir(root, expected, SHA)["ok"]


def test_find_incomplete(tmp_path):
    assert find_incomplete(str(tmp_path)) == []
    p = put(tmp_path, ".cache/huggingface/download/sub/abc.etag.incomplete", b"")
    assert find_incomplete(str(tmp_path)) == [p]


def test_remove_incomplete_counts_and_clears(tmp_path):
    root = str(tmp_path)
    expected = downloaded(tmp_path, model_files())
    put(root, ".cache/huggingface/download/a.e1.1234abcd.incomplete", b"x" * 70)
    put(root, ".cache/huggingface/download/sub/b.e2.9999ffff.incomplete", b"y" * 30)
    assert incomplete_bytes(root) == 100
    assert not verify_local_dir(root, expected, SHA)["ok"]
    assert remove_incomplete(root) == (2, 100)
    assert incomplete_bytes(root) == 0 and find_incomplete(root) == []
    assert verify_local_dir(root, expected, SHA)["ok"]
    assert remove_incomplete(root) == (0, 0)


def test_git_blob_oid_matches_git():
    # `printf 'hello\n' | git hash-object --stdin`
    assert git_blob_oid(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"
    assert git_blob_oid(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


# ------------------------------------------------------------------ manifest

def request(**kw):
    req = {"repo_id": "org/m", "revision": SHA, "allow_patterns": ["*.json", "*.safetensors"],
           "ignore_patterns": None, "overrides": [], "verify_hashes": False}
    req.update(kw)
    return req


def test_manifest_round_trip_and_match(tmp_path):
    root = str(tmp_path)
    expected = downloaded(tmp_path, model_files())
    m = build_manifest(request(), SHA, expected, False, [], endpoint="http://127.0.0.1:1")
    assert m["bytes"] == sum(len(v) for v in model_files().values())
    assert m["files"]["model-00002-of-00002.safetensors"] == 500
    assert m["lfs_sha256"]["model-00001-of-00002.safetensors"] == \
        hashlib.sha256(b"a" * 1000).hexdigest()
    path = os.path.join(root, ".hf-manifest.json")
    write_json_atomic(path, m)
    assert read_manifest(path) == m
    assert manifest_matches(read_manifest(path), request(), root) == (True, "")


@pytest.mark.parametrize("change, reason", [
    ({"repo_id": "org/other"}, "repo_id changed"),
    ({"revision": OTHER_SHA}, "sha changed"),
    ({"revision": "main"}, "revision changed"),
    ({"allow_patterns": ["*.json"]}, "allow_patterns changed"),
    ({"ignore_patterns": ["*.md"]}, "ignore_patterns changed"),
    ({"overrides": [{"file": "config.json", "op": "delete", "path": ["a"]}]},
     "overrides changed"),
])
def test_manifest_mismatch_reasons(tmp_path, change, reason):
    expected = downloaded(tmp_path, model_files())
    m = build_manifest(request(), SHA, expected, False, [])
    assert manifest_matches(m, request(**change), str(tmp_path)) == (False, reason)


def test_manifest_branch_revision_is_reused_without_resolving(tmp_path):
    expected = downloaded(tmp_path, model_files())
    m = build_manifest(request(revision="main"), SHA, expected, True, [])
    assert manifest_matches(m, request(revision="main"), str(tmp_path)) == (True, "")
    assert manifest_matches(m, request(revision="main", verify_hashes=True),
                            str(tmp_path)) == (True, "")
    assert manifest_matches(m, request(revision="v2"), str(tmp_path))[0] is False


def test_manifest_detects_local_damage(tmp_path):
    root = str(tmp_path)
    expected = downloaded(tmp_path, model_files())
    m = build_manifest(request(), SHA, expected, False, [])
    put(root, "model-00002-of-00002.safetensors", b"b" * 10)
    assert manifest_matches(m, request(), root) == \
        (False, "model-00002-of-00002.safetensors missing or resized")
    os.remove(os.path.join(root, "model-00002-of-00002.safetensors"))
    assert manifest_matches(m, request(), root)[0] is False
    assert manifest_matches(None, request(), root) == (False, "no manifest")


def test_request_from_manifest_round_trips_through_normalize(tmp_path):
    """Offline verification of a copy against its own manifest (no repo/revision given)."""
    root = str(tmp_path)
    expected = downloaded(tmp_path, model_files())
    given = [{"file": "config.json", "delete": "quantization_config.kv_cache_scheme"},
             {"file": "config.json", "set": ["quantization_config", "quant_method"],
              "value": "fp8"},
             {"file": "config.json", "set": "note", "value": {"a": 1}, "create": True}]
    req = request(revision="main", allow_patterns=["*.json", "*.safetensors"],
                  overrides=normalize_overrides(given))
    m = build_manifest(req, SHA, expected, False, [])
    back = request_from_manifest(m, "M")
    assert back["repo_id"] == req["repo_id"] and back["revision"] == SHA
    assert back["allow_patterns"] == ["*.json", "*.safetensors"]
    assert normalize_overrides(back["overrides"]) == m["overrides"]
    again = dict(back, overrides=normalize_overrides(back["overrides"]), verify_hashes=False)
    assert manifest_matches(m, again, root) == (True, "")
    put(root, "model-00001-of-00002.safetensors", b"a" * 999)
    assert manifest_matches(m, again, root) == \
        (False, "model-00001-of-00002.safetensors missing or resized")


def test_request_from_manifest_needs_a_manifest():
    with pytest.raises(HfWeightsError, match="no readable manifest at /x/m.json"):
        request_from_manifest(None, "/x/m.json")
    with pytest.raises(HfWeightsError, match="manifest /x/m.json has no sha"):
        request_from_manifest({"format": 1, "repo_id": "a/b"}, "/x/m.json")


def test_read_manifest_ignores_garbage(tmp_path):
    p = put(tmp_path, "m.json", b"{not json")
    assert read_manifest(p) is None
    put(tmp_path, "m.json", b'{"format": 99}')
    assert read_manifest(p) is None
    assert read_manifest(os.path.join(str(tmp_path), "absent.json")) is None


# ------------------------------------------------------------------ overrides

def test_normalize_overrides_canonical_form():
    got = normalize_overrides([
        {"file": "config.json", "delete": "quantization_config.kv_cache_scheme"},
        {"file": "config.json", "set": ["rope_scaling", "factor"], "value": 4.0},
        {"file": "config.json", "set": "new_key", "value": None, "create": True},
    ])
    assert got == [
        {"file": "config.json", "op": "delete", "path": ["quantization_config",
                                                         "kv_cache_scheme"]},
        {"file": "config.json", "op": "set", "path": ["rope_scaling", "factor"],
         "value": 4.0, "create": False},
        {"file": "config.json", "op": "set", "path": ["new_key"], "value": None,
         "create": True},
    ]
    assert normalize_overrides(None) == []


@pytest.mark.parametrize("bad, fragment", [
    ({"file": "config.json"}, "overrides[0] needs exactly one of set / delete"),
    ({"file": "config.json", "set": "a", "delete": "b"}, "exactly one of"),
    ({"file": "config.json", "set": "a"}, "overrides[0]: set needs a value"),
    ({"file": "config.json", "delete": "a", "value": 1}, "delete takes no value"),
    ({"file": "model.safetensors", "delete": "a"}, "repo-relative .json path"),
    ({"file": "../config.json", "delete": "a"}, "repo-relative .json path"),
    ({"file": "config.json", "delete": "a..b"}, "bad key path"),
    ({"file": "config.json", "delete": 5}, "key path must be a dotted string or a list"),
    ({"file": "config.json", "delete": "a", "when": 1}, "unknown keys when"),
    ("config.json", "overrides[0] must be a dict"),
])
def test_normalize_overrides_rejects(bad, fragment):
    with pytest.raises(HfWeightsError) as err:
        normalize_overrides([bad])
    assert fragment in str(err.value)


def test_apply_json_ops_set_delete_create_and_list_index():
    ops = normalize_overrides([
        {"file": "c.json", "delete": "quantization_config.kv_cache_scheme"},
        {"file": "c.json", "set": ["quantization_config", "weight_block_size", 1],
         "value": 64},
        {"file": "c.json", "set": "max_position_embeddings", "value": 8192, "create": True},
    ])
    out = apply_json_ops(CONFIG, ops, "c.json")
    assert out == {"model_type": "minimax_m2", "max_position_embeddings": 8192,
                   "quantization_config": {"quant_method": "fp8",
                                           "weight_block_size": [128, 64]}}
    assert "kv_cache_scheme" in CONFIG["quantization_config"]  # input untouched


@pytest.mark.parametrize("override, shown", [
    ({"file": "c.json", "delete": "quantization_config.kv_scheme"},
     "quantization_config.kv_scheme"),
    ({"file": "c.json", "set": "quantization.quant_algo", "value": 1}, "quantization"),
    ({"file": "c.json", "set": "rope_theta", "value": 1}, "rope_theta"),
    ({"file": "c.json", "set": ["quantization_config", "weight_block_size", 2], "value": 1},
     "quantization_config.weight_block_size.2"),
])
def test_apply_json_ops_missing_key_is_an_error(override, shown):
    with pytest.raises(HfWeightsError) as err:
        apply_json_ops(CONFIG, normalize_overrides([override]), "c.json")
    assert str(err.value) == "override: key %s not found in c.json" % shown


def test_fp8_kv_cache_example_drops_both_declarations(tmp_path):
    root = str(tmp_path)
    expected = downloaded(tmp_path, model_files())
    plans = plan_overrides(root, normalize_overrides(FP8_KV_CACHE_OVERRIDE_EXAMPLE))
    write_overrides(root, plans)
    with open(os.path.join(root, "config.json")) as f:
        assert "kv_cache_scheme" not in json.load(f)["quantization_config"]
    with open(os.path.join(root, "hf_quant_config.json")) as f:
        assert json.load(f)["quantization"] == {"quant_algo": "FP8"}
    assert verify_local_dir(root, expected, SHA)["ok"]


def test_overrides_backup_once_and_idempotent(tmp_path):
    root = str(tmp_path)
    expected = downloaded(tmp_path, model_files())
    original = model_files()["config.json"]
    oids = {"config.json": expected["config.json"]["oid"]}
    ops = normalize_overrides([{"file": "config.json",
                                "delete": "quantization_config.kv_cache_scheme"}])
    first = write_overrides(root, plan_overrides(root, ops, oids))
    assert first[0]["changed"] and first[0]["backup"] == "config.json.orig"
    with open(os.path.join(root, "config.json.orig"), "rb") as f:
        assert f.read() == original
    with open(os.path.join(root, "config.json"), "rb") as f:
        patched = f.read()
    assert hashlib.sha256(patched).hexdigest() == first[0]["sha256"]
    # second run: nothing to do, backup untouched, same resulting hash
    second = plan_overrides(root, ops, oids)
    assert second[0]["changed"] is False and second[0]["sha256"] == first[0]["sha256"]
    write_overrides(root, second)
    with open(os.path.join(root, "config.json.orig"), "rb") as f:
        assert f.read() == original
    # a new op is applied on top of the original (from the backup), not of the patched file
    ops2 = ops + normalize_overrides([{"file": "config.json", "set": "model_type",
                                       "value": "llama"}])
    third = write_overrides(root, plan_overrides(root, ops2, oids))
    assert third[0]["changed"]
    with open(os.path.join(root, "config.json")) as f:
        assert json.load(f) == {"model_type": "llama",
                                "quantization_config": {"quant_method": "fp8",
                                                        "weight_block_size": [128, 128]}}
    with open(os.path.join(root, "config.json.orig"), "rb") as f:
        assert f.read() == original


def test_overrides_reapplied_after_redownload(tmp_path):
    root = str(tmp_path)
    expected = downloaded(tmp_path, model_files())
    oids = {"config.json": expected["config.json"]["oid"]}
    ops = normalize_overrides([{"file": "config.json",
                                "delete": "quantization_config.kv_cache_scheme"}])
    write_overrides(root, plan_overrides(root, ops, oids))
    put(root, "config.json", model_files()["config.json"])  # fresh download of the original
    plans = plan_overrides(root, ops, oids)
    assert plans[0]["changed"] and plans[0]["write_backup"] is False  # backup already equal
    write_overrides(root, plans)
    with open(os.path.join(root, "config.json")) as f:
        assert "kv_cache_scheme" not in json.load(f)["quantization_config"]


def test_overrides_missing_key_writes_nothing(tmp_path):
    root = str(tmp_path)
    downloaded(tmp_path, model_files())
    before = dict((n, open(os.path.join(root, n), "rb").read())
                  for n in ("config.json", "hf_quant_config.json"))
    ops = normalize_overrides([
        {"file": "config.json", "delete": "quantization_config.kv_cache_scheme"},
        {"file": "hf_quant_config.json", "delete": "quantization.kv_cache_scheme"},
    ])
    with pytest.raises(HfWeightsError) as err:
        write_overrides(root, plan_overrides(root, ops))
    assert str(err.value) == \
        "override: key quantization.kv_cache_scheme not found in hf_quant_config.json"
    for name, data in before.items():
        with open(os.path.join(root, name), "rb") as f:
            assert f.read() == data
        assert not os.path.exists(os.path.join(root, name + ".orig"))


def test_overrides_bad_json_named(tmp_path):
    put(tmp_path, "config.json", b"{oops")
    with pytest.raises(HfWeightsError) as err:
        plan_overrides(str(tmp_path), normalize_overrides([{"file": "config.json",
                                                            "delete": "a"}]))
    assert "config.json is not valid JSON" in str(err.value)


def test_manifest_tracks_overridden_file(tmp_path):
    root = str(tmp_path)
    expected = downloaded(tmp_path, model_files())
    ops = normalize_overrides(FP8_KV_CACHE_OVERRIDE_EXAMPLE)
    applied = write_overrides(root, plan_overrides(root, ops))
    m = build_manifest(request(overrides=ops), SHA, expected, False, applied)
    assert manifest_matches(m, request(overrides=ops), root) == (True, "")
    put(root, "config.json", model_files()["config.json"])  # someone restored the original
    assert manifest_matches(m, request(overrides=ops), root) == \
        (False, "config.json differs from the overridden version")


def test_discard_damaged_removes_the_file_and_its_metadata(tmp_path):
    from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import (
        discard_damaged, metadata_path)

    d = str(tmp_path)
    for rel in ("a.bin", "sub/b.bin"):
        os.makedirs(os.path.dirname(os.path.join(d, rel)) or d, exist_ok=True)
        with open(os.path.join(d, rel), "wb") as f:
            f.write(b"x" * 10)
        meta = metadata_path(d, rel)
        os.makedirs(os.path.dirname(meta), exist_ok=True)
        with open(meta, "w") as f:
            f.write("sha\netag\n1.0\n")
    assert discard_damaged(d, ["sub/b.bin", "missing.bin"]) == ["sub/b.bin"]
    assert not os.path.exists(os.path.join(d, "sub/b.bin"))
    assert not os.path.exists(metadata_path(d, "sub/b.bin"))
    assert os.path.exists(os.path.join(d, "a.bin")) and os.path.exists(metadata_path(d, "a.bin"))
