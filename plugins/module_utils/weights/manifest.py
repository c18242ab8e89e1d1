# -*- coding: utf-8 -*-
"""The manifest written next to the weights: the request, the pinned commit, per-file digests,
when every file was last hashed and an ``invalid`` record after a failed hash check; and
whether it allows a no-network no-op.
"""
from __future__ import annotations

import datetime
import json
import os
import socket

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.local_files import (
    _stat_size, digest_of, flagged_files, HfWeightsError, is_commit_sha, MANIFEST_FORMAT,
    sha256_file)


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
