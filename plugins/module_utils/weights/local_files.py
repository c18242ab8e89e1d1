# -*- coding: utf-8 -*-
"""The local side of a pinned Hugging Face download, pure Python: pattern validation and
filtering, the disk preflight, the state of a ``local_dir`` download (sizes, the commit in
``.cache/huggingface/download/<path>.metadata``, ``*.incomplete`` files) and hash verification
against the digests the Hub lists, in parallel (weights_hash).
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.weights_hash import hash_files


MANIFEST_FORMAT = 1
DOWNLOAD_META_DIR = os.path.join(".cache", "huggingface", "download")
SHA_RE = re.compile(r"^[0-9a-f]{40}$")


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
