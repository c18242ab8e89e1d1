"""Pinned Hugging Face weight downloads: the logic of the hf_model_download module.

Runs on the target host, with the interpreter of the downloader venv (huggingface_hub 1.x or
2.x; imported only when the Hub is contacted, so an offline verification needs none). The pure
parts (patterns, disk preflight, verification, manifest, overrides) are in hf_weights; this
module adds the Hub calls, the download in a child process with progress lines, the lock of
the write phase, and the whole run of one request (``download``).
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import (
    MANIFEST_FORMAT, HfWeightsError, build_manifest, bytes_missing, check_hashes, content_of,
    digest_of, discard_damaged, disk_preflight, expected_from_manifest, file_complete,
    files_to_hash, flagged_files, free_bytes, incomplete_bytes, invalid_record, is_commit_sha,
    manifest_matches, merge_reports, normalize_overrides, normalize_patterns, plan_overrides,
    progress_bytes, read_manifest, remove_incomplete, request_from_manifest, select_files,
    utc_now, verify_local_dir, with_state, write_json_atomic, write_overrides)

PROGRESS_FILE = ".download-progress.json"

# Runs in a child process so the parent can report progress and a kill -9 of the downloader
# leaves the module able to report it. The spec arrives on stdin; the token only in HF_TOKEN.
CHILD_CODE = r"""
import json, sys
spec = json.loads(sys.stdin.read())
try:
    from huggingface_hub import snapshot_download
    snapshot_download(spec["repo_id"], revision=spec["sha"], local_dir=spec["local_dir"],
                      allow_patterns=spec["allow_patterns"], ignore_patterns=spec["ignore_patterns"],
                      max_workers=spec["max_workers"], endpoint=spec["endpoint"])
except BaseException as exc:
    resp = getattr(exc, "response", None)
    print(json.dumps({"ok": False, "classes": [c.__name__ for c in type(exc).__mro__],
                      "status": getattr(resp, "status_code", None), "message": str(exc)}))
    sys.exit(3)
print(json.dumps({"ok": True}))
"""


class HubError(Exception):
    pass


def hub_message(classes, status, message, repo_id, revision, endpoint, token_given):
    """Translate a huggingface_hub error (by class names, so 1.x and 2.x both work)."""
    names = set(classes)
    where = "%s on %s" % (repo_id, endpoint or "https://huggingface.co")
    first = (message or "").strip().splitlines()[0] if message else ""
    if "GatedRepoError" in names:
        if token_given:
            return ("repo %s is gated and the token has no access (HTTP %s): request access on "
                    "the repo page for the token's account" % (where, status))
        return ("repo %s is gated (HTTP %s) and no token was given: set token (a vaulted HF "
                "token of an account with access)" % (where, status))
    if "RevisionNotFoundError" in names:
        return "revision %r not found in repo %s" % (revision, where)
    if "RepositoryNotFoundError" in names:
        return ("repo %s not found (HTTP %s), or revision %r does not exist, or the repo is "
                "private and the token is missing or has no access" % (where, status, revision))
    if "EntryNotFoundError" in names or "RemoteEntryNotFoundError" in names:
        return "revision %r not found in repo %s (%s)" % (revision, where, first)
    if status in (401, 403):
        return "access to repo %s refused (HTTP %s): check token" % (where, status)
    if "ConnectError" in names or "ConnectionError" in names or "ConnectTimeout" in names:
        return "cannot reach %s: %s" % (endpoint or "https://huggingface.co", first)
    return "%s: %s (%s)" % (where, first, classes[0] if classes else "error")


def _classes(exc):
    return [c.__name__ for c in type(exc).__mro__]


def hub_env(params):
    env = dict(os.environ)
    env.pop("HF_HUB_OFFLINE", None)  # the service sets it; the downloader must not
    env["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    if params["endpoint"]:
        env["HF_ENDPOINT"] = params["endpoint"]
    if params["high_performance"]:
        env["HF_XET_HIGH_PERFORMANCE"] = "1"
    if params["token"]:
        env["HF_TOKEN"] = params["token"]
    return env


def hub_plan(params, request):
    """Resolve the sha, list the tree at it, probe access. Returns (sha, tree)."""
    try:
        import huggingface_hub
        from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
    except ImportError as exc:
        raise HubError("huggingface_hub is not importable by %s (%s): run this module with the "
                       "downloader venv as ansible_python_interpreter" % (sys.executable, exc))
    endpoint = params["endpoint"] or None
    token = params["token"] or None
    repo_id, revision = params["repo_id"], params["revision"]
    api = HfApi(endpoint=endpoint, token=token)
    try:
        sha = revision if is_commit_sha(revision) else api.model_info(repo_id, revision=revision).sha
        tree = {}
        for entry in api.list_repo_tree(repo_id, revision=sha, recursive=True):
            if getattr(entry, "blob_id", None) is None:
                continue  # a folder
            lfs = getattr(entry, "lfs", None)
            tree[entry.path] = {"size": int(entry.size), "oid": entry.blob_id,
                                "sha256": getattr(lfs, "sha256", None) if lfs else None}
        return sha, tree, (get_hf_file_metadata, hf_hub_url), huggingface_hub.__version__
    except Exception as exc:
        raise HubError(hub_message(_classes(exc), getattr(getattr(exc, "response", None),
                                                          "status_code", None),
                                   str(exc), repo_id, revision, endpoint, bool(token)))


def probe_access(params, sha, path, funcs):
    """HEAD one file: a gated repo answers 401/403 here, before anything is written."""
    get_meta, url_for = funcs
    endpoint = params["endpoint"] or None
    try:
        get_meta(url_for(params["repo_id"], path, revision=sha, endpoint=endpoint),
                 token=params["token"] or None)
    except Exception as exc:
        raise HubError(hub_message(_classes(exc), getattr(getattr(exc, "response", None),
                                                          "status_code", None),
                                   str(exc), params["repo_id"], params["revision"], endpoint,
                                   bool(params["token"])))


def precheck_overrides(params, request, sha, pending):
    """Validate overrides against the pinned files before the big download: the small JSON
    targets not yet on disk are fetched into a temporary directory (not local_dir)."""
    targets = sorted(set(o["file"] for o in request["overrides"]) & set(pending))
    if not targets:
        return
    from huggingface_hub import hf_hub_download
    tmp = tempfile.mkdtemp(prefix="hf-override-check-")
    try:
        for rel in targets:
            try:
                hf_hub_download(params["repo_id"], rel, revision=sha, local_dir=tmp,
                                endpoint=params["endpoint"] or None,
                                token=params["token"] or None)
            except Exception as exc:
                raise HubError(hub_message(
                    _classes(exc), getattr(getattr(exc, "response", None), "status_code", None),
                    str(exc), params["repo_id"], params["revision"], params["endpoint"],
                    bool(params["token"])))
        plan_overrides(tmp, [o for o in request["overrides"] if o["file"] in targets])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def acquire_dir_lock(local_dir):
    """Exclusive lock for the write phase; kept until the process exits."""
    lock_dir = os.path.join(local_dir, ".cache", "huggingface")
    if not os.path.isdir(lock_dir):
        os.makedirs(lock_dir)
    path = os.path.join(lock_dir, "hf_model_download.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (IOError, OSError):
        os.close(fd)
        raise HubError("another hf_model_download is writing into %s (lock %s held)"
                       % (local_dir, path))
    return fd


def _progress_line(fh, **data):
    os.write(fh, (json.dumps(data) + "\n").encode())


def run_download(params, request, sha, expected, env):
    local_dir = params["local_dir"]
    progress_path = os.path.join(local_dir, PROGRESS_FILE)
    total = sum(i["size"] for i in expected.values())
    spec = {"repo_id": params["repo_id"], "sha": sha, "local_dir": local_dir,
            "allow_patterns": request["allow_patterns"],
            "ignore_patterns": request["ignore_patterns"],
            "max_workers": params["max_workers"], "endpoint": params["endpoint"] or None}
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    fh = os.open(progress_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    try:
        start = time.time()
        at_start = progress_bytes(local_dir, expected, sha)
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD_CODE], stdin=subprocess.PIPE, stdout=out, stderr=err, env=env,
            close_fds=True)
        proc.stdin.write(json.dumps(spec).encode())
        proc.stdin.close()
        base = dict(repo_id=params["repo_id"], sha=sha, bytes_total=total,
                    bytes_at_start=at_start, downloader_pid=proc.pid)
        _progress_line(fh, time=utc_now(), state="downloading", bytes_done=at_start,
                       rate_bytes_per_s=0, eta_s=None, elapsed_s=0, **base)
        prev_t, prev_done = start, at_start
        while True:
            try:
                proc.wait(timeout=params["progress_interval"])
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            done = progress_bytes(local_dir, expected, sha)
            rate = max(done - prev_done, 0) / max(now - prev_t, 1e-6)
            _progress_line(fh, time=utc_now(), state="downloading", bytes_done=done,
                           rate_bytes_per_s=int(rate),
                           eta_s=int((total - done) / rate) if rate > 0 else None,
                           elapsed_s=round(now - start, 1), **base)
            prev_t, prev_done = now, done
        done = progress_bytes(local_dir, expected, sha)
        elapsed = time.time() - start
        state = "done" if proc.returncode == 0 else "failed"
        _progress_line(fh, time=utc_now(), state=state, bytes_done=done,
                       rate_bytes_per_s=int((done - at_start) / max(elapsed, 1e-6)), eta_s=0,
                       elapsed_s=round(elapsed, 1), returncode=proc.returncode, **base)
    finally:
        os.close(fh)
    out.seek(0)
    err.seek(0)
    lines = out.read().decode("utf-8", "replace").strip().splitlines()
    stderr_tail = err.read().decode("utf-8", "replace")[-2000:]
    if proc.returncode == 0:
        return {"elapsed_s": round(elapsed, 2), "bytes_downloaded": done - at_start}
    if proc.returncode < 0:
        raise HubError("download of %s@%s stopped: downloader pid %d was killed by signal %d; "
                       "finished files are kept, re-run to resume"
                       % (params["repo_id"], sha, proc.pid, -proc.returncode))
    try:
        res = json.loads(lines[-1])
        msg = hub_message(res["classes"], res.get("status"), res.get("message"),
                          params["repo_id"], params["revision"], params["endpoint"],
                          bool(params["token"]))
    except (IndexError, ValueError, KeyError):
        msg = "downloader exited with code %s: %s" % (proc.returncode, stderr_tail)
    raise HubError(msg)


class DownloadFailed(Exception):
    """The request cannot be met; ``result`` holds what is known (returned with the failure)."""

    def __init__(self, msg, result):
        super().__init__(msg)
        self.result = result


def _state(manifest):
    """What the diff shows of a manifest: commit, files and their sizes, overridden files."""
    if not manifest:
        return {}
    return {"repo_id": manifest.get("repo_id"), "sha": manifest.get("sha"),
            "files": dict(sorted((manifest.get("files") or {}).items())),
            "overrides": [o.get("file") for o in manifest.get("overrides") or []]}


ON_DAMAGE = ("repair", "fail", "report")


def _damage_message(where, bad, manifest_path, invalidated, remedy):
    shown = "; ".join("%s: %s" % (rel, why) for rel, why in sorted(bad.items())[:10])
    return ("hash verification of %s failed for %d file%s: %s; %s%s"
            % (where, len(bad), "" if len(bad) == 1 else "s", shown,
               ("the manifest %s is marked invalid (no run accepts these files again without "
                "hashing them); " % manifest_path) if invalidated else "", remedy))


def download(params, check_mode=False):
    """Run one request (the module's parameters): verify, plan, download, verify (hashes
    where it matters), repair what fails, override, record. Returns the module's result, with
    ``diff`` (before/after of the manifest) when something changes (or would change, in check
    mode); raises DownloadFailed."""
    p = dict(params)
    for key, default in (("hash_workers", 0), ("hash_files", None), ("source_manifest", None),
                         ("on_damage", None)):
        p.setdefault(key, default)
    local_dir = p["local_dir"]
    result = dict(changed=False, revision=p["revision"], downloaded=False,
                  manifest=os.path.join(local_dir or "", p["manifest"]),
                  progress_file=os.path.join(local_dir or "", PROGRESS_FILE),
                  hash=None, damaged={}, repaired=[], bytes_fetched=0,
                  manifest_invalidated=False)

    def fail(msg, **extra):
        result.update(extra)
        raise DownloadFailed(msg, result)

    # ---- assert: every input check before any network call or write
    source = p["source_manifest"]
    on_damage = p["on_damage"] or ("fail" if p["offline"] else "repair")
    if on_damage not in ON_DAMAGE:
        fail("on_damage must be one of %s, got %r" % (", ".join(ON_DAMAGE), on_damage))
    if p["offline"] and on_damage == "repair":
        fail("on_damage=repair needs the Hub (offline=false): an offline check can only fail "
             "or report the damaged files")
    if source is not None:
        if not p["offline"]:
            fail("source_manifest (the reference of a copy) needs offline=true")
        if not isinstance(source, dict) or source.get("format") != MANIFEST_FORMAT \
                or not isinstance(source.get("files"), dict):
            fail("source_manifest is not a manifest of format %d" % MANIFEST_FORMAT)
    if p["hash_workers"] < 0:
        fail("hash_workers must be >= 0 (0 = one per core), got %d" % p["hash_workers"])
    manifest_path = result["manifest"]
    if os.path.basename(p["manifest"]) != p["manifest"] or p["manifest"] in ("", ".", ".."):
        fail("manifest must be a file name inside local_dir, got %r" % p["manifest"])
    old = read_manifest(manifest_path)
    ref = source if source is not None else old  # what the files must be
    if p["offline"] and p["repo_id"] is None:
        where = "source_manifest" if source is not None else manifest_path
        try:
            req = request_from_manifest(ref, where)
        except HfWeightsError as exc:
            fail(str(exc), verified=False)
        p.update(repo_id=req["repo_id"], revision=req["revision"],
                 allow_patterns=req["allow_patterns"], ignore_patterns=req["ignore_patterns"],
                 overrides=req["overrides"])
        result["revision"] = req["revision"]
    if p["repo_id"].count("/") != 1 or not all(p["repo_id"].split("/")):
        fail("repo_id must be org/name, got %r" % p["repo_id"])
    if not os.path.isabs(local_dir):
        fail("local_dir must be an absolute path, got %r" % local_dir)
    if p["max_workers"] < 1:
        fail("max_workers must be >= 1, got %d" % p["max_workers"])
    if p["disk_margin_bytes"] < 0:
        fail("disk_margin_bytes must be >= 0, got %d" % p["disk_margin_bytes"])
    if p["progress_interval"] <= 0:
        fail("progress_interval must be > 0, got %s" % p["progress_interval"])
    try:
        request = dict(repo_id=p["repo_id"], revision=p["revision"],
                       allow_patterns=normalize_patterns(p["allow_patterns"], "allow_patterns"),
                       ignore_patterns=normalize_patterns(p["ignore_patterns"], "ignore_patterns"),
                       overrides=normalize_overrides(p["overrides"]),
                       verify_hashes=p["verify_hashes"])
        extra = normalize_patterns(p["hash_files"], "hash_files") or []
    except HfWeightsError as exc:
        fail(str(exc))
    workers = p["hash_workers"]
    hash_reports = []

    # ---- fast path: the manifest proves the request is satisfied (cheap check: sizes); no
    # network. The files' digests are checked where it matters (files_to_hash).
    matches, why = manifest_matches(ref, request, local_dir)
    damaged = {}
    good_now = {}  # files hashed and found right in this run: {path: digest}
    if matches:
        expected = expected_from_manifest(ref)
        todo = files_to_hash(expected, old, force_all=p["verify_hashes"], extra=extra)
        overridden = [o["file"] for o in ref.get("overrides_applied") or []]
        result.update(sha=ref["sha"], files=ref["files"],
                      bytes=ref.get("bytes", sum(ref["files"].values())),
                      overrides_applied=ref.get("overrides_applied") or [])
        if not todo and content_of(old) == content_of(ref) and not flagged_files(old):
            result.update(verified=True, hashes_verified=bool(old.get("hashes_verified")),
                          reason="manifest matches (verified_at %s%s)" % (
                              old.get("verified_at"),
                              ", hashes verified at %s" % old["hashes_verified_at"]
                              if old.get("hashes_verified_at") else ""))
            return result
        chk = check_hashes(local_dir, expected, todo, overridden, workers)
        hash_reports.append(chk["report"])
        result["hash"] = merge_reports(*hash_reports)
        full = set(todo) == set(expected) and not chk["unhashable"]
        if not chk["bad"]:
            hashed_at = utc_now() if full else (old or {}).get("hashes_verified_at")
            new = with_state(ref, hashed_at)
            if not check_mode and (old is None or content_of(old) != content_of(new)
                                   or old.get("hashes_verified_at") != hashed_at
                                   or old.get("invalid")):
                write_json_atomic(manifest_path, new)
            result.update(verified=True, hashes_verified=bool(hashed_at),
                          unhashable=chk["unhashable"],
                          reason="manifest matches; %d of %d files hashed (%s)" % (
                              len(chk["hashed"]), len(expected),
                              "all" if full else "the ones not vouched for yet"))
            return result
        damaged = chk["bad"]
        result["damaged"] = damaged
        good_now = dict((rel, digest_of(expected[rel])) for rel in chk["hashed"]
                        if rel not in damaged)
        invalid = invalid_record(damaged, (old or {}).get("invalid"), chk["hashed"])
        if not check_mode:
            write_json_atomic(manifest_path, with_state(
                ref, (old or {}).get("hashes_verified_at"), invalid=invalid))
            result["manifest_invalidated"] = True
        where = "%s@%s in %s" % (p["repo_id"], ref["sha"], local_dir)
        if on_damage == "report" or (check_mode and on_damage == "repair"):
            result.update(verified=False, hashes_verified=False,
                          changed=check_mode and on_damage == "repair",
                          would_repair=sorted(damaged) if check_mode else [],
                          reason=_damage_message(where, damaged, manifest_path,
                                                 result["manifest_invalidated"], "reported"))
            return result
        if on_damage == "fail":
            fail(_damage_message(
                where, damaged, manifest_path, not check_mode,
                "nothing was repaired (offline: restore the files from where they came from, "
                "or run the download with the Hub reachable)" if p["offline"] else
                "nothing was repaired (on_damage=fail)"), verified=False, hashes_verified=False)
        why = "%d file%s failed hash verification" % (len(damaged),
                                                      "" if len(damaged) == 1 else "s")
    elif p["offline"]:
        fail("offline verification of %s@%s in %s failed: %s (manifest %s); nothing was "
             "downloaded" % (p["repo_id"], p["revision"], local_dir, why,
                             "source_manifest" if source is not None else manifest_path),
             verified=False)

    # ---- plan: resolve, list, select, preflight, probe (read-only)
    env = hub_env(p)
    for key in ("HF_ENDPOINT", "HF_XET_HIGH_PERFORMANCE", "HF_HUB_DISABLE_PROGRESS_BARS",
                "HF_HUB_DISABLE_TELEMETRY"):
        if key in env:
            os.environ[key] = env[key]
    os.environ.pop("HF_HUB_OFFLINE", None)
    try:
        sha, tree, funcs, hub_version = hub_plan(p, request)
        result["sha"] = sha
        expected = select_files(tree, request["allow_patterns"], request["ignore_patterns"],
                                "%s@%s" % (p["repo_id"], sha))
        for i, o in enumerate(request["overrides"]):
            if o["file"] not in expected:
                raise HfWeightsError("overrides[%d]: %s is not among the selected files of "
                                     "%s@%s" % (i, o["file"], p["repo_id"], sha))
        damaged = dict((rel, why_) for rel, why_ in damaged.items() if rel in expected)
        pending = sorted(set(k for k in expected if not file_complete(local_dir, k, expected[k], sha))
                         | set(damaged))
        needed = bytes_missing(local_dir, expected, sha) + sum(
            expected[k]["size"] for k in damaged if file_complete(local_dir, k, expected[k], sha))
        free = free_bytes(local_dir)
        result.update(files=dict((k, v["size"]) for k, v in sorted(expected.items())),
                      bytes=sum(v["size"] for v in expected.values()), bytes_needed=needed,
                      bytes_free=free, huggingface_hub_version=hub_version,
                      reason="manifest: %s" % why)
        if pending:
            # parts left by a killed run are deleted before the download: count them as free;
            # so are the damaged files, deleted before they are fetched again
            disk_preflight(needed, free + incomplete_bytes(local_dir) + sum(
                expected[k]["size"] for k in damaged), p["disk_margin_bytes"], local_dir)
            probe_access(p, sha, pending[0], funcs)
            precheck_overrides(p, request, sha, pending)
    except (HfWeightsError, HubError) as exc:
        fail(str(exc))

    if check_mode:
        result.update(changed=True, verified=False, hashes_verified=False, overrides_applied=[],
                      would_download=bool(pending), would_repair=sorted(damaged),
                      diff={"before": _state(old), "after": {
                          "repo_id": p["repo_id"], "sha": sha, "files": result["files"],
                          "overrides": [o["file"] for o in request["overrides"]]}})
        return result

    # ---- download, verify (hashes where it matters), repair, override, record (one writer)
    where = "%s@%s in %s" % (p["repo_id"], sha, local_dir)
    overridden = [o["file"] for o in request["overrides"]]
    try:
        acquire_dir_lock(local_dir)  # fd stays open (locked) until the module exits
        if pending:
            result["stale_incomplete_removed"] = remove_incomplete(local_dir)[0]
            result["damaged_removed"] = discard_damaged(local_dir, pending)
            result["download"] = run_download(p, request, sha, expected, env)
            result["downloaded"] = True
            result["bytes_fetched"] += result["download"]["bytes_downloaded"]
        check = verify_local_dir(local_dir, expected, sha)
        if not check["ok"]:
            raise HfWeightsError("verification of %s@%s in %s failed (%d problems): %s"
                                 % (p["repo_id"], sha, local_dir, len(check["problems"]),
                                    "; ".join(check["problems"][:10])))
        # hash what this run fetched, and everything the old manifest cannot vouch for (less
        # what this run hashed already, unchanged since)
        todo = sorted(set(pending) | set(
            rel for rel in files_to_hash(expected, old, force_all=p["verify_hashes"], extra=extra)
            if good_now.get(rel) is None or good_now[rel] != digest_of(expected[rel])))
        chk = check_hashes(local_dir, expected, todo, overridden, workers)
        hash_reports.append(chk["report"])
        full = (set(todo) | set(good_now)) == set(expected) and not chk["unhashable"]
        bad = chk["bad"]
        if bad:
            result["damaged"] = dict(damaged, **bad)
            invalid = invalid_record(bad)
            write_json_atomic(manifest_path, build_manifest(
                request, sha, expected, False, [], endpoint=p["endpoint"], invalid=invalid))
            result["manifest_invalidated"] = True
            if on_damage != "repair":
                raise HfWeightsError(_damage_message(where, bad, manifest_path, True,
                                                     "nothing was repaired (on_damage=%s)"
                                                     % on_damage))
            # repair: delete the file and its metadata (else huggingface_hub may keep it), fetch
            # it again in this run, hash it again
            discard_damaged(local_dir, sorted(bad))
            again = run_download(p, request, sha, expected, env)
            result["repair_download"] = again
            result["bytes_fetched"] += again["bytes_downloaded"]
            chk2 = check_hashes(local_dir, expected, sorted(bad), overridden, workers)
            hash_reports.append(chk2["report"])
            if chk2["bad"]:
                raise HfWeightsError(_damage_message(
                    where, chk2["bad"], manifest_path, True,
                    "downloaded again in this run and still wrong: %s serves content that does "
                    "not match the digest its own tree lists" % (p["endpoint"] or
                                                                 "https://huggingface.co")))
        result["repaired"] = sorted(set(damaged) | set(bad))
        oids = dict((k, v["oid"]) for k, v in expected.items() if not v.get("sha256"))
        plans = plan_overrides(local_dir, request["overrides"], pristine_oids=oids)
        applied = write_overrides(local_dir, plans)
    except (HfWeightsError, HubError) as exc:
        result["hash"] = merge_reports(*hash_reports)
        fail(str(exc))
    result["hash"] = merge_reports(*hash_reports)
    if full:
        hashed_at = utc_now()
    elif old and old.get("hashes_verified_at"):
        hashed_at = old["hashes_verified_at"]  # the rest was hashed then, and vouched for now
    else:
        hashed_at = None
    manifest = build_manifest(request, sha, expected, bool(hashed_at), applied,
                              endpoint=p["endpoint"], hashes_verified_at=hashed_at)
    write_json_atomic(manifest_path, manifest)
    result.update(changed=True, verified=True, hashes_verified=bool(hashed_at),
                  unhashable=chk["unhashable"], overrides_applied=applied,
                  diff={"before": _state(old), "after": _state(manifest)})
    return result
