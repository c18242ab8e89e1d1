"""Pure logic for pinned Hugging Face weight downloads (no Ansible, no huggingface_hub).

Used by plugins/module_utils/hf_download.py (the hf_model_download module). Everything here works on plain dicts and the
local filesystem so it can be unit-tested without a network:

* pattern validation and filtering (same semantics as huggingface_hub's filter_repo_objects:
  ``fnmatch.fnmatchcase``, ``*`` crosses ``/``, a pattern ending in ``/`` means the folder);
* disk preflight (selected bytes + margin vs free bytes on the target filesystem);
* cheap verification of a ``local_dir`` download (sizes, ``.cache/huggingface/download/
  <path>.metadata`` commit == pinned sha, no ``*.incomplete``);
* hash verification against the digests the Hub lists (sha256 = LFS oid of a large file, git
  blob sha1 of a small one), in parallel (weights_hash), and which files a run must hash;
* progress sampling (bytes on disk during a download);
* the manifest written next to the weights (with per-file digests, when every file was last
  hashed, and an ``invalid`` record after a failed hash check), and whether it allows a
  no-network no-op;
* declarative JSON overrides (set / delete at a key path) with a one-time ``.orig`` backup.

Expected files are given as ``{path: {"size": int, "sha256": str|None, "oid": str|None}}``
(``sha256`` for LFS files, ``oid`` = git blob id for the others), as listed by the Hub tree API.
"""
from __future__ import annotations

import copy
import datetime
import fnmatch
import hashlib
import json
import os
import re
import socket

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights_hash import hash_files

MANIFEST_FORMAT = 1
DOWNLOAD_META_DIR = os.path.join(".cache", "huggingface", "download")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
OVERRIDE_OPS = ("set", "delete")

# Example: drop the FP8 KV-cache scheme a checkpoint declares (SM120 cannot run it, and a
# scheme declared in the checkpoint forces FP8 KV whatever --kv-cache-dtype says, so editing
# config.json / hf_quant_config.json is the fix). Use the entries that exist in the
# checkpoint: a missing key is an error.
FP8_KV_CACHE_OVERRIDE_EXAMPLE = [
    {"file": "config.json", "delete": "quantization_config.kv_cache_scheme"},
    {"file": "hf_quant_config.json", "delete": "quantization.kv_cache_quant_algo"},
]


class HfWeightsError(Exception):
    """A user-facing error: the message names the variable/file and the numbers."""


# ---------------------------------------------------------------- revisions and patterns

def is_commit_sha(revision):
    return bool(revision) and SHA_RE.match(revision) is not None


def normalize_patterns(patterns, name):
    """Validate allow/ignore patterns; return a list or None. ``name`` is the variable name."""
    if patterns is None:
        return None
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, (list, tuple)):
        raise HfWeightsError("%s must be a list of glob patterns, got %s"
                             % (name, type(patterns).__name__))
    out = []
    for i, pat in enumerate(patterns):
        if not isinstance(pat, str) or not pat.strip():
            raise HfWeightsError("%s[%d] must be a non-empty string, got %r" % (name, i, pat))
        pat = pat.replace("\\", "/")
        if pat.startswith("/") or "\0" in pat or ".." in pat.split("/"):
            raise HfWeightsError("%s[%d] %r is not a repo-relative glob (no leading '/', "
                                 "no '..')" % (name, i, pat))
        if pat.count("[") != pat.count("]"):
            raise HfWeightsError("%s[%d] %r has unbalanced [ ]" % (name, i, pat))
        out.append(pat)
    return out


def _dir_pattern(pat):
    return pat + "*" if pat.endswith("/") else pat


def path_selected(path, allow, ignore):
    if allow is not None and not any(fnmatch.fnmatchcase(path, _dir_pattern(p)) for p in allow):
        return False
    if ignore is not None and any(fnmatch.fnmatchcase(path, _dir_pattern(p)) for p in ignore):
        return False
    return True


def select_files(tree, allow, ignore, where):
    """Filter the repo tree ``{path: info}``; every allow pattern must match some file."""
    if allow is not None:
        for i, pat in enumerate(allow):
            if not any(fnmatch.fnmatchcase(p, _dir_pattern(pat)) for p in tree):
                raise HfWeightsError("allow_patterns[%d] %r matches no file in %s (%d files)"
                                     % (i, pat, where, len(tree)))
    selected = dict((p, info) for p, info in tree.items() if path_selected(p, allow, ignore))
    if not selected:
        raise HfWeightsError("allow_patterns/ignore_patterns select no file in %s" % where)
    return selected


# ---------------------------------------------------------------- disk preflight

def human_bytes(n):
    """Decimal units like the Hub and ``df -H``: 230.1 GB, 1.2 TB."""
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1000.0
    return "%.1f PB" % n  # pragma: no cover


def existing_ancestor(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path):
    """Free bytes for an unprivileged writer on the filesystem that will hold ``path``."""
    st = os.statvfs(existing_ancestor(path))
    return st.f_bavail * st.f_frsize


def disk_preflight(needed, free, margin, local_dir):
    """Raise HfWeightsError when needed + margin does not fit in free."""
    if needed + margin > free:
        raise HfWeightsError(
            "not enough disk for %s: %s needed + %s margin (disk_margin_bytes), %s free on the "
            "filesystem of %s; free %s or change local_dir / disk_margin_bytes"
            % (local_dir, human_bytes(needed), human_bytes(margin), human_bytes(free),
               existing_ancestor(local_dir), human_bytes(needed + margin - free)))


# ---------------------------------------------------------------- local state of a download

def metadata_path(local_dir, rel):
    return os.path.join(local_dir, DOWNLOAD_META_DIR, rel + ".metadata")


def read_download_metadata(local_dir, rel):
    """huggingface_hub's per-file metadata: commit, etag, timestamp (or None)."""
    try:
        with open(metadata_path(local_dir, rel)) as f:
            lines = f.read().splitlines()
    except (IOError, OSError):
        return None
    if len(lines) < 3:
        return None
    try:
        ts = float(lines[2])
    except ValueError:
        return None
    return {"commit": lines[0].strip(), "etag": lines[1].strip(), "timestamp": ts}


def find_incomplete(local_dir):
    out = []
    root = os.path.join(local_dir, DOWNLOAD_META_DIR)
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".incomplete"):
                out.append(os.path.join(dirpath, name))
    return sorted(out)


def remove_incomplete(local_dir):
    """Delete ``*.incomplete`` parts; return (count, bytes). huggingface_hub >= 1.x names them
    ``<hash>.<etag>.<random>.incomplete`` per process, so a killed download's parts are never
    resumed or cleaned by the next run. Call only while no other downloader uses local_dir."""
    count = size = 0
    for path in find_incomplete(local_dir):
        size += _stat_size(path) or 0
        os.remove(path)
        count += 1
    return count, size


def discard_damaged(local_dir, pending):
    """Delete the local copy and huggingface_hub's metadata of each pending file that exists.

    huggingface_hub skips a file whose metadata etag matches when the file's mtime is within
    a second of the metadata timestamp, so a file damaged right after its download (or by a
    tool that keeps mtimes) would not be fetched again. Its per-file ``.lock`` goes too.
    Returns the paths removed. Call only while no other downloader uses local_dir."""
    removed = []
    for rel in pending:
        full = os.path.join(local_dir, rel)
        if os.path.isfile(full):
            os.remove(full)
            removed.append(rel)
            meta = metadata_path(local_dir, rel)
            for aux in (meta, meta[:-len(".metadata")] + ".lock"):
                if os.path.isfile(aux):
                    os.remove(aux)
    return removed


def incomplete_bytes(local_dir):
    return sum(_stat_size(p) or 0 for p in find_incomplete(local_dir))


def sha256_file(path, chunk=8 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def git_blob_oid(data):
    """Git blob id of ``data`` (what the Hub tree reports as ``oid`` for non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _stat_size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def file_complete(local_dir, rel, info, sha):
    """Present with the expected size and metadata commit == sha. An overridden file counts
    when its ``.orig`` backup has the expected size."""
    meta = read_download_metadata(local_dir, rel)
    if meta is None or meta["commit"] != sha:
        return False
    full = os.path.join(local_dir, rel)
    if _stat_size(full) == info["size"]:
        return True
    return _stat_size(full + ".orig") == info["size"]


def bytes_missing(local_dir, expected, sha):
    return sum(info["size"] for rel, info in expected.items()
               if not file_complete(local_dir, rel, info, sha))


def progress_bytes(local_dir, expected, sha):
    """Bytes on disk for this download: complete files plus ``*.incomplete`` parts."""
    done = sum(info["size"] for rel, info in expected.items()
               if file_complete(local_dir, rel, info, sha))
    for path in find_incomplete(local_dir):
        done += _stat_size(path) or 0
    total = sum(info["size"] for info in expected.values())
    return min(done, total)


def verify_local_dir(local_dir, expected, sha, hashes=False, workers=0):
    """Check a local_dir download. Returns {"ok", "problems", "hashed"}; problems name files.
    ``hashes``: also check every file's digest (check_hashes, in parallel)."""
    problems = []
    for rel in sorted(expected):
        info = expected[rel]
        full = os.path.join(local_dir, rel)
        size = _stat_size(full)
        if size is None:
            problems.append("%s: missing" % rel)
            continue
        if size != info["size"] and _stat_size(full + ".orig") != info["size"]:
            # (an overridden file is checked through its backup, the download)
            problems.append("%s: size %d, expected %d" % (rel, size, info["size"]))
            continue
        meta = read_download_metadata(local_dir, rel)
        if meta is None:
            problems.append("%s: no download metadata (%s)"
                            % (rel, metadata_path(local_dir, rel)))
        elif meta["commit"] != sha:
            problems.append("%s: downloaded from commit %s, expected %s"
                            % (rel, meta["commit"], sha))
    for path in find_incomplete(local_dir):
        problems.append("%s: incomplete download left" % os.path.relpath(path, local_dir))
    hashed = 0
    if hashes:
        chk = check_hashes(local_dir, expected, sorted(expected), workers=workers)
        hashed = len(chk["hashed"])
        problems.extend("%s: %s" % (rel, why) for rel, why in sorted(chk["bad"].items()))
    return {"ok": not problems, "problems": problems, "hashed": hashed}


# ---------------------------------------------------------------- hash verification

def digest_of(info):
    """(algorithm, hex) a file must hash to: the LFS sha256, else the git blob sha1 of the tree
    listing (``oid``); None when neither is known."""
    if info.get("sha256"):
        return ("sha256", info["sha256"])
    if info.get("oid"):
        return ("git_sha1", info["oid"])
    return None


def manifest_digests(manifest):
    """{path: (algorithm, hex)} recorded by a manifest (``digests``; a manifest written before
    digests were recorded has only ``lfs_sha256``)."""
    out = {}
    if not manifest:
        return out
    for rel, sha in (manifest.get("lfs_sha256") or {}).items():
        out[rel] = ("sha256", sha)
    for rel, d in (manifest.get("digests") or {}).items():
        if isinstance(d, dict):
            for algo in ("sha256", "git_sha1"):
                if d.get(algo):
                    out[rel] = (algo, d[algo])
                    break
    return out


def expected_from_manifest(manifest):
    """The expected-files dict ({path: {"size", "sha256", "oid"}}) a manifest records."""
    digests = manifest_digests(manifest)
    out = {}
    for rel, size in (manifest.get("files") or {}).items():
        algo, hexd = digests.get(rel, (None, None))
        out[rel] = {"size": size, "sha256": hexd if algo == "sha256" else None,
                    "oid": hexd if algo == "git_sha1" else None}
    return out


def flagged_files(manifest):
    """Files a failed hash check recorded in the manifest (its ``invalid`` record)."""
    inv = (manifest or {}).get("invalid")
    if not isinstance(inv, dict):
        return {}
    return dict(inv.get("files") or {})


def files_to_hash(expected, local, force_all=False, extra=()):
    """Which files a run hashes: all of them when asked (``force_all``) or when the local
    manifest records no complete hash pass (first download, first check of a copy); else the
    ones it cannot vouch for: ``extra`` (re-downloaded or re-copied now), files flagged by a
    failed check, and files whose digest differs from what the local manifest recorded."""
    if force_all or not local or not local.get("hashes_verified_at"):
        return sorted(expected)
    known = manifest_digests(local)
    flagged = flagged_files(local)
    extra = set(extra or ())
    return sorted(rel for rel in expected
                  if rel in extra or rel in flagged or known.get(rel) is None
                  or known.get(rel) != digest_of(expected[rel]))


def check_hashes(local_dir, expected, rels, override_files=(), workers=0):
    """Hash ``rels`` (paths of ``expected``) in parallel against their digests. An overridden
    file passes when it or its ``.orig`` backup (the download) has the digest. Returns
    {"bad": {path: problem}, "hashed": [paths], "unhashable": [paths without a digest],
    "report": {"files", "bytes", "elapsed_s", "mb_per_s", "workers"}}."""
    jobs, unhashable = [], []
    overridden = set(override_files or ())
    for rel in rels:
        want = digest_of(expected[rel])
        if want is None:
            unhashable.append(rel)
            continue
        full = os.path.join(local_dir, rel)
        paths = [full] + ([full + ".orig"] if rel in overridden
                          and os.path.exists(full + ".orig") else [])
        for path in paths:
            jobs.append({"rel": rel, "path": path, "algo": want[0], "want": want[1],
                         "size": _stat_size(path) or 0})
    out = hash_files(jobs, workers=workers)
    seen = {}
    for r in out["results"]:
        ok = r.get("digest") == r["want"]
        prev = seen.get(r["rel"])
        if prev is None or ok:
            if ok:
                seen[r["rel"]] = True
            else:
                seen[r["rel"]] = ("%s: %s" % (os.path.basename(r["path"]), r["error"])
                                  if r.get("error") else "%s %s, expected %s"
                                  % ("sha256" if r["algo"] == "sha256" else "git blob sha1",
                                     r["digest"], r["want"]))
    bad = dict((rel, why) for rel, why in seen.items() if why is not True)
    report = dict((k, out[k]) for k in ("bytes", "elapsed_s", "mb_per_s", "workers"))
    report["files"] = len(seen)  # an overridden file and its backup count once
    return {"bad": bad, "hashed": sorted(seen), "unhashable": sorted(unhashable),
            "report": report}


def merge_reports(*reports):
    """One hash report from several passes of a run (files, bytes, time, MB/s)."""
    reports = [r for r in reports if r and r.get("files")]
    if not reports:
        return None
    files = sum(r["files"] for r in reports)
    total = sum(r["bytes"] for r in reports)
    elapsed = sum(r["elapsed_s"] for r in reports)
    return {"files": files, "bytes": total, "elapsed_s": round(elapsed, 3),
            "mb_per_s": round(total / elapsed / 1e6, 1) if elapsed > 0 and total else None,
            "workers": max(r["workers"] for r in reports), "passes": len(reports)}


# ---------------------------------------------------------------- manifest

def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# What a manifest says about its own copy of the files (when it was checked, whether every
# file's digest was, a failed check); the rest describes the files and is the same on every
# copy (the fan-out source's manifest is the reference of its copies).
LOCAL_STATE_KEYS = ("verified_at", "hashes_verified", "hashes_verified_at", "invalid")


def build_manifest(request, sha, expected, hashes_verified, overrides_applied, endpoint=None,
                   hashes_verified_at=None, invalid=None):
    """The manifest of a download. ``hashes_verified``: every file's digest has been checked
    since it was written (``hashes_verified_at``: when the last pass over all of them ended);
    ``invalid``: the record of a failed hash check ({"at", "files": {path: problem}}), which
    no later run accepts without hashing those files again."""
    digests = {}
    for p in sorted(expected):
        d = digest_of(expected[p])
        if d is not None:
            digests[p] = {d[0]: d[1]}
    return {
        "format": MANIFEST_FORMAT,
        "repo_id": request["repo_id"],
        "revision": request["revision"],
        "sha": sha,
        "endpoint": endpoint,
        "allow_patterns": request.get("allow_patterns"),
        "ignore_patterns": request.get("ignore_patterns"),
        "files": dict((p, expected[p]["size"]) for p in sorted(expected)),
        "lfs_sha256": dict((p, expected[p]["sha256"]) for p in sorted(expected)
                           if expected[p].get("sha256")),
        "digests": digests,
        "bytes": sum(info["size"] for info in expected.values()),
        "verified_at": utc_now(),
        "hashes_verified": bool(hashes_verified) and not invalid,
        "hashes_verified_at": hashes_verified_at,
        "invalid": invalid or None,
        "overrides": request.get("overrides") or [],
        "overrides_applied": overrides_applied,
    }


def content_of(manifest):
    """A manifest without its local state: equal on a source and its intact copies."""
    return dict((k, v) for k, v in (manifest or {}).items() if k not in LOCAL_STATE_KEYS)


def with_state(manifest, hashes_verified_at, invalid=None):
    """A copy of ``manifest`` with this copy's state: checked now, the last full hash pass at
    ``hashes_verified_at`` (every file's digest has been checked since it was written), and
    a failed check's record (``invalid``) or none."""
    out = content_of(manifest)
    out.update(verified_at=utc_now(), hashes_verified=bool(hashes_verified_at) and not invalid,
               hashes_verified_at=hashes_verified_at, invalid=invalid or None)
    return out


def invalid_record(bad, previous=None, rechecked=()):
    """The ``invalid`` record of a failed hash check: when, and each file with its problem.
    Files an earlier record flagged stay flagged unless this check hashed them again."""
    rechecked = set(rechecked or ())
    files = dict((rel, why) for rel, why in flagged_files({"invalid": previous}).items()
                 if rel not in rechecked)
    files.update(bad)
    return {"at": utc_now(), "files": dict(sorted(files.items()))}


def read_manifest(path):
    """The manifest dict, or None when absent or unreadable (it is then rebuilt)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (IOError, OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        return None
    return data


def request_from_manifest(manifest, where):
    """The request a manifest records, in the module's parameter form (overrides as
    {file, set|delete, value, create}), for an offline check of files against their own
    manifest (weights on shared storage or copied from another host)."""
    if manifest is None:
        raise HfWeightsError("no readable manifest at %s: cannot verify offline" % where)
    for key in ("repo_id", "sha"):
        if not isinstance(manifest.get(key), str) or not manifest[key]:
            raise HfWeightsError("manifest %s has no %s" % (where, key))
    overrides = []
    for o in manifest.get("overrides") or []:
        item = {"file": o["file"], o["op"]: list(o["path"])}
        if o["op"] == "set":
            item["value"] = o["value"]
            item["create"] = bool(o.get("create", False))
        overrides.append(item)
    return {"repo_id": manifest["repo_id"], "revision": manifest["sha"],
            "allow_patterns": manifest.get("allow_patterns"),
            "ignore_patterns": manifest.get("ignore_patterns"), "overrides": overrides}


def write_json_atomic(path, data):
    """Write JSON through a temporary file in the same directory, flushed to disk, then
    renamed over ``path``: a reader sees the old or the new content, never a part (several
    hosts may write one manifest on shared storage: the temporary name is per host and pid)."""
    tmp = "%s.tmp.%s.%d" % (path, socket.gethostname(), os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=False, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def manifest_matches(manifest, request, local_dir):
    """(True, "") when the manifest proves the request is already satisfied, using only the
    local filesystem (stat of each file, sha256 of overridden small files): the cheap check.
    Whether file digests must be checked too is files_to_hash's question."""
    if manifest is None:
        return False, "no manifest"
    for key in ("repo_id", "allow_patterns", "ignore_patterns"):
        if manifest.get(key) != request.get(key):
            return False, "%s changed" % key
    revision = request["revision"]
    if is_commit_sha(revision):
        if manifest.get("sha") != revision:
            return False, "sha changed"
    elif manifest.get("revision") != revision:
        return False, "revision changed"
    if (manifest.get("overrides") or []) != (request.get("overrides") or []):
        return False, "overrides changed"
    if not manifest.get("files"):
        return False, "manifest lists no files"
    after = dict((o["file"], o["sha256"]) for o in manifest.get("overrides_applied") or [])
    for rel, size in (manifest.get("files") or {}).items():
        full = os.path.join(local_dir, rel)
        if rel in after:
            if _stat_size(full + ".orig") != size:
                return False, "%s.orig missing or resized" % rel
            if _stat_size(full) is None or sha256_file(full) != after[rel]:
                return False, "%s differs from the overridden version" % rel
        elif _stat_size(full) != size:
            return False, "%s missing or resized" % rel
    return True, ""


# ---------------------------------------------------------------- JSON overrides

def _key_path(raw, where):
    if isinstance(raw, str):
        parts = raw.split(".")
    elif isinstance(raw, (list, tuple)):
        parts = list(raw)
    else:
        raise HfWeightsError("%s: key path must be a dotted string or a list, got %r"
                             % (where, raw))
    if not parts or any(isinstance(p, bool) or not isinstance(p, (str, int)) or p == ""
                        for p in parts):
        raise HfWeightsError("%s: bad key path %r" % (where, raw))
    return parts


def normalize_overrides(overrides):
    """Validate ``overrides`` (a list of {file, set|delete, value, create}) into a canonical
    list of {"file", "op", "path", ["value"], ["create"]}."""
    if overrides is None:
        return []
    if not isinstance(overrides, list):
        raise HfWeightsError("overrides must be a list, got %s" % type(overrides).__name__)
    out = []
    for i, item in enumerate(overrides):
        where = "overrides[%d]" % i
        if not isinstance(item, dict):
            raise HfWeightsError("%s must be a dict, got %r" % (where, item))
        ops = [op for op in OVERRIDE_OPS if op in item]
        unknown = sorted(set(item) - set(OVERRIDE_OPS) - {"file", "value", "create"})
        if unknown:
            raise HfWeightsError("%s: unknown keys %s" % (where, ", ".join(unknown)))
        if len(ops) != 1:
            raise HfWeightsError("%s needs exactly one of set / delete" % where)
        f = item.get("file")
        if not isinstance(f, str) or not f.endswith(".json") or f.startswith("/") \
                or ".." in f.replace("\\", "/").split("/"):
            raise HfWeightsError("%s: file must be a repo-relative .json path, got %r"
                                 % (where, f))
        op = ops[0]
        entry = {"file": f, "op": op, "path": _key_path(item[op], where)}
        if op == "set":
            if "value" not in item:
                raise HfWeightsError("%s: set needs a value" % where)
            entry["value"] = item["value"]
            entry["create"] = bool(item.get("create", False))
        elif "value" in item or "create" in item:
            raise HfWeightsError("%s: delete takes no value/create" % where)
        out.append(entry)
    return out


def _fmt_path(parts):
    return ".".join(str(p) for p in parts)


def apply_json_ops(obj, ops, filename):
    """Apply canonical ops to a deep copy of obj. A missing key/parent is an error."""
    obj = copy.deepcopy(obj)
    for op in ops:
        parts = op["path"]
        node = obj
        for depth, key in enumerate(parts[:-1]):
            node = _child(node, key, filename, parts[:depth + 1])
        last = parts[-1]
        if op["op"] == "delete":
            _child(node, last, filename, parts)
            del node[last]
        else:
            if not (op.get("create") and isinstance(node, dict)):
                _child(node, last, filename, parts)
            node[last] = copy.deepcopy(op["value"])
    return obj


def _child(node, key, filename, shown):
    if isinstance(node, dict) and isinstance(key, str) and key in node:
        return node[key]
    if isinstance(node, list) and isinstance(key, int) and -len(node) <= key < len(node):
        return node[key]
    raise HfWeightsError("override: key %s not found in %s" % (_fmt_path(shown), filename))


def _load_json(path, label):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except (IOError, OSError) as exc:
        raise HfWeightsError("override: cannot read %s: %s" % (label, exc))
    try:
        return raw, json.loads(raw.decode("utf-8"))
    except ValueError as exc:
        raise HfWeightsError("override: %s is not valid JSON: %s" % (label, exc))


def _dump_json(obj):
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def plan_overrides(local_dir, overrides, pristine_oids=None):
    """Compute every override in memory (nothing written). ``pristine_oids`` maps a file to
    its git blob id at the pinned sha: a current file with that id is a fresh download (the
    base to patch and back up); otherwise the ``.orig`` backup is the base when present.
    Returns a list of {"file", "changed", "write_backup", "content", "sha256"}."""
    pristine_oids = pristine_oids or {}
    by_file = {}
    order = []
    for op in overrides:
        if op["file"] not in by_file:
            by_file[op["file"]] = []
            order.append(op["file"])
        by_file[op["file"]].append(op)
    plans = []
    for rel in order:
        full = os.path.join(local_dir, rel)
        cur_raw, cur = _load_json(full, rel)
        backup = full + ".orig"
        fresh = pristine_oids.get(rel) == git_blob_oid(cur_raw)
        if os.path.exists(backup) and not fresh:
            base_raw, base = _load_json(backup, rel + ".orig")
        else:
            base_raw, base = cur_raw, cur
        new = apply_json_ops(base, by_file[rel], rel)
        changed = new != cur
        write_backup = base_raw is cur_raw and (
            not os.path.exists(backup) or _load_json(backup, rel + ".orig")[0] != cur_raw)
        content = _dump_json(new) if changed else cur_raw
        plans.append({"file": rel, "changed": changed, "write_backup": changed and write_backup,
                      "content": content, "sha256": hashlib.sha256(content).hexdigest()})
    return plans


def write_overrides(local_dir, plans):
    """Write planned overrides: backup first (only when planned), then the patched file."""
    for plan in plans:
        if not plan["changed"]:
            continue
        full = os.path.join(local_dir, plan["file"])
        if plan["write_backup"]:
            with open(full, "rb") as f:
                raw = f.read()
            with open(full + ".orig.tmp", "wb") as f:
                f.write(raw)
            os.replace(full + ".orig.tmp", full + ".orig")
        mode = os.stat(full).st_mode & 0o7777
        with open(full + ".tmp", "wb") as f:
            f.write(plan["content"])
        os.chmod(full + ".tmp", mode)
        os.replace(full + ".tmp", full)
    return [{"file": p["file"], "changed": p["changed"], "backup": p["file"] + ".orig",
             "sha256": p["sha256"]} for p in plans]
