"""Read-only checks of a pinned Hub download before anything changes on the host: the logic
of the hf_model_info module.

Runs on the target host with the host's own python (standard library only: the downloader
venv may not exist yet on a bare host). It answers, for one request (repo, revision,
patterns, overrides, target directory):

* whether the weights are already in the target directory at that revision (the manifest
  the download writes, checked as the download's own no-network fast path checks it: stat
  of each file). Then the Hub is not asked: the overrides are checked against the local
  files and nothing goes over the network;
* otherwise, with ``remote`` on, one metadata call (``GET {endpoint}/api/models/{repo}/
  revision/{revision}``, the call huggingface_hub makes, HF_ENDPOINT semantics) proves the
  repository and revision exist and resolves the commit, then each JSON file an override
  patches is read at that commit (``GET {endpoint}/{repo}/resolve/{sha}/{file}``) and every
  override is applied in memory, so a key missing at that revision is refused now;
* whether the disk margin can be met on the filesystem that will hold the weights.

A token goes only in an ``Authorization`` header (never a URL, argv or the environment) and
is dropped when a redirect leaves the endpoint's host. Every message names the variable to
change (``names`` maps the module's parameters to the caller's variable names) and says which
host asked which endpoint.
"""
from __future__ import annotations

import json
import os
import socket
import ssl

from urllib.error import HTTPError, URLError
from urllib.parse import quote, urlsplit
from urllib.request import HTTPRedirectHandler, HTTPSHandler, Request, build_opener

from ansible_collections.vllm_ops.deploy.plugins.module_utils.weights.hf_weights import (
    HfWeightsError, apply_json_ops, existing_ancestor, human_bytes, is_commit_sha,
    manifest_matches, normalize_overrides, normalize_patterns, read_manifest)

DEFAULT_ENDPOINT = "https://huggingface.co"
MAX_JSON_BYTES = 16 << 20  # an override target is a small JSON file (config.json)
NAMES = ("repo_id", "revision", "endpoint", "token", "overrides", "allow_patterns",
         "ignore_patterns", "disk_margin_bytes", "remote", "local_dir")


class HubCheckError(Exception):
    """A refusal; the message names the variable to change."""


def endpoint_of(endpoint):
    """The effective endpoint (HF_ENDPOINT semantics: empty = huggingface.co)."""
    return (endpoint or DEFAULT_ENDPOINT).rstrip("/")


def revision_url(endpoint, repo_id, revision):
    return "%s/api/models/%s/revision/%s" % (endpoint_of(endpoint), repo_id,
                                             quote(revision, safe=""))


def resolve_url(endpoint, repo_id, sha, path):
    return "%s/%s/resolve/%s/%s" % (endpoint_of(endpoint), repo_id, quote(sha, safe=""),
                                    quote(path, safe="/"))


def variable_names(overrides=None):
    """The caller's variable name per parameter (default: the parameter's own name)."""
    names = dict((k, k) for k in NAMES)
    unknown = sorted(set(overrides or {}) - set(NAMES))
    if unknown:
        raise HubCheckError("variable_names: unknown keys %s (known: %s)"
                            % (", ".join(unknown), ", ".join(NAMES)))
    names.update((k, str(v)) for k, v in (overrides or {}).items())
    return names


# ---------------------------------------------------------------- HTTP (urllib)

class _Answer(object):
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def error_code(self):
        return self.headers.get("X-Error-Code") or self.headers.get("x-error-code") or ""

    def describe(self):
        code = self.error_code()
        return "HTTP %s%s" % (self.status, (" " + code) if code else "")


class _KeepAuthOnSameHost(HTTPRedirectHandler):
    """Follow redirects, but send the token only to the endpoint's own host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = HTTPRedirectHandler.redirect_request(self, req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            for key in list(new.headers):
                if key.lower() == "authorization":
                    del new.headers[key]
            new.unredirected_hdrs.pop("Authorization", None)
        return new


def make_opener(ca_pem=None):
    """An opener that honours the host's proxy variables and trusts the host's CA store plus
    ``ca_pem`` (PEM text of extra CA certificates, e.g. a TLS-inspecting proxy's)."""
    context = ssl.create_default_context()
    if ca_pem:
        context.load_verify_locations(cadata=ca_pem)
    return build_opener(_KeepAuthOnSameHost(), HTTPSHandler(context=context))


def http_get(opener, url, token=None, timeout=30.0, limit=MAX_JSON_BYTES):
    """GET url; an _Answer for any HTTP status. Transport failures raise OSError/URLError."""
    headers = {"User-Agent": "vllm-deploy-hf-model-info/1"}
    if token:
        headers["Authorization"] = "Bearer %s" % token
    req = Request(url, headers=headers)
    try:
        resp = opener.open(req, timeout=timeout)
    except HTTPError as exc:
        try:
            body = exc.read(65536)
        except (OSError, ValueError):
            body = b""
        return _Answer(exc.code, exc.headers or {}, body)
    with resp:
        return _Answer(resp.status, resp.headers, resp.read(limit + 1))


def _transport_reason(exc):
    reason = getattr(exc, "reason", None) or exc
    if isinstance(reason, socket.timeout) or "timed out" in str(reason):
        return "timed out"
    return str(reason)


# ---------------------------------------------------------------- pure checks

def local_state(local_dir, manifest_name, request):
    """(present, why, manifest): whether local_dir holds the repo at the revision already
    (repo, revision or sha, patterns, every file at its size), the overrides aside."""
    manifest = read_manifest(os.path.join(local_dir, manifest_name))
    if manifest is None:
        return False, "no manifest in %s" % local_dir, None
    same_overrides = dict(request, overrides=manifest.get("overrides") or [])
    present, why = manifest_matches(manifest, same_overrides, local_dir)
    return present, why, manifest


def _load_json_bytes(raw, label):
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise HfWeightsError("%s is not valid JSON: %s" % (label, exc))


def override_errors(documents, overrides, where, var):
    """Apply each normalized override, in order, to ``documents`` ({file: parsed JSON}).
    Returns messages naming ``var[i]`` for every override that cannot apply."""
    docs = dict(documents)
    errors = []
    for i, op in enumerate(overrides):
        rel = op["file"]
        if rel not in docs:
            continue  # reported by the caller (file missing)
        try:
            docs[rel] = apply_json_ops(docs[rel], [op], rel)
        except HfWeightsError as exc:
            errors.append("%s[%d] (%s %s in %s): %s at %s: remove or correct it"
                          % (var, i, op["op"], ".".join(str(p) for p in op["path"]), rel,
                             str(exc).replace("override: ", ""), where))
    return errors


def local_override_documents(local_dir, files):
    """The pristine JSON of each override target in local_dir: ``<file>.orig`` when an earlier
    run patched the file (the download keeps the original there), else the file itself."""
    docs, missing = {}, []
    for rel in files:
        full = os.path.join(local_dir, rel)
        path = full + ".orig" if os.path.exists(full + ".orig") else full
        try:
            with open(path, "rb") as f:
                docs[rel] = _load_json_bytes(f.read(), path)
        except (IOError, OSError):
            missing.append(rel)
    return docs, missing


def disk_verdict(total, free, margin, present, local_dir, host, var):
    """(error, warning) for the free-space margin on the filesystem holding local_dir."""
    if margin <= 0:
        return None, None
    where = "the filesystem of %s on %s (%s in all, %s free)" % (
        local_dir, host, human_bytes(total), human_bytes(free))
    if margin > total:
        msg = ("%s=%d (%s) is larger than %s: no download can ever keep that much free"
               % (var, margin, human_bytes(margin), where))
        if present:
            return None, (msg + "; the weights are already there, so no download runs now, but "
                          "a new revision would be refused: lower %s" % var)
        return msg + ": lower %s" % var, None
    if margin > free and not present:
        return ("%s=%d (%s) alone is more than %s, before any file is counted: free space or "
                "lower %s" % (var, margin, human_bytes(margin), where, var)), None
    return None, None


# ---------------------------------------------------------------- the whole check

def _ask(opener, url, token, timeout, host, endpoint, names, what):
    try:
        return http_get(opener, url, token, timeout)
    except (URLError, OSError, ValueError) as exc:  # ValueError: an unusable URL
        raise HubCheckError(
            "%s: the Hub at %s did not answer (%s: GET %s): cannot check %s. Fix %s or the "
            "host's proxy, or set %s: false to skip this check (air-gapped hosts)"
            % (host, endpoint, _transport_reason(exc), url, what, names["endpoint"],
               names["remote"]))


def resolve_revision(opener, p, names, host):
    """The commit sha of repo@revision, by one metadata call; HubCheckError names the
    variable when the repo or revision does not exist or access is refused."""
    endpoint = endpoint_of(p["endpoint"])
    repo, rev, token = p["repo_id"], p["revision"], p.get("token") or None
    what = "%s=%s and %s=%s" % (names["repo_id"], repo, names["revision"], rev)
    url = revision_url(endpoint, repo, rev)
    ans = _ask(opener, url, token, p["timeout"], host, endpoint, names, what)
    asked = "asked from %s: GET %s answered %s" % (host, url, ans.describe())
    if ans.status == 200:
        try:
            info = _load_json_bytes(ans.body, url)
        except HfWeightsError as exc:
            raise HubCheckError("%s: %s is not a Hub endpoint (%s); check %s"
                                % (host, endpoint, exc, names["endpoint"]))
        sha = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(sha, str) or not is_commit_sha(sha):
            raise HubCheckError("%s: %s answered no commit for %s@%s (%s); check %s"
                                % (host, endpoint, repo, rev, url, names["endpoint"]))
        if is_commit_sha(rev) and sha != rev:
            raise HubCheckError("%s=%s: %s@%s resolves to %s on %s (%s)"
                                % (names["revision"], rev, repo, rev, sha, endpoint, asked))
        return sha, url
    code = ans.error_code()
    if code == "RevisionNotFound":
        raise HubCheckError("%s=%r does not exist in %s on %s (%s): use a branch, tag or "
                            "40-hex commit of the repository"
                            % (names["revision"], rev, repo, endpoint, asked))
    if code in ("GatedRepo",) or (ans.status in (401, 403) and code != "RepoNotFound"):
        raise HubCheckError("%s: access to %s on %s refused (%s): %s"
                            % (names["repo_id"], repo, endpoint, asked,
                               "check %s (its account needs access)" % names["token"] if token
                               else "the repository is private or gated: set %s" % names["token"]))
    if ans.status >= 500 and code == "" and rev == "main":
        raise HubCheckError("%s: the Hub at %s failed (%s); try again later or set %s: false"
                            % (host, endpoint, asked, names["remote"]))
    # RepoNotFound, 404 or an error without a code: some servers (mirrors) answer a missing
    # revision as a missing repository. The default branch tells which of the two is wrong.
    if rev != "main":
        main_url = revision_url(endpoint, repo, "main")
        main = _ask(opener, main_url, token, p["timeout"], host, endpoint, names, what)
        if main.status == 200:
            raise HubCheckError("%s=%r does not exist in %s on %s (%s; its branch main "
                                "answers): use a branch, tag or 40-hex commit of the repository"
                                % (names["revision"], rev, repo, endpoint, asked))
    raise HubCheckError("%s=%r: no such repository on %s (%s), or it is private or gated and "
                        "%s: check the name%s%s"
                        % (names["repo_id"], repo, endpoint, asked,
                           "the token in %s has no access" % names["token"] if token
                           else "no token was given", "" if token
                           else ", or set %s" % names["token"],
                           "" if code else "; the answer has no X-Error-Code, as a Hub's has: "
                           "check that %s is a Hub endpoint" % names["endpoint"]))


def remote_override_documents(opener, p, names, host, sha, files):
    """{file: parsed JSON} of each override target at sha, and the missing files."""
    endpoint = endpoint_of(p["endpoint"])
    token = p.get("token") or None
    docs, missing, urls = {}, [], []
    for rel in files:
        url = resolve_url(endpoint, p["repo_id"], sha, rel)
        urls.append(url)
        ans = _ask(opener, url, token, p["timeout"], host, endpoint, names,
                   "%s (%s)" % (names["overrides"], rel))
        if ans.status == 200:
            if len(ans.body) > MAX_JSON_BYTES:
                raise HubCheckError("%s: %s of %s@%s is larger than %s: not a JSON file to "
                                    "patch" % (names["overrides"], rel, p["repo_id"], sha,
                                               human_bytes(MAX_JSON_BYTES)))
            try:
                docs[rel] = _load_json_bytes(ans.body, "%s of %s@%s" % (rel, p["repo_id"], sha))
            except HfWeightsError as exc:
                raise HubCheckError("%s: %s" % (names["overrides"], exc))
        elif ans.status in (401, 403) or ans.error_code() == "GatedRepo":
            raise HubCheckError("%s: %s on %s refused to serve %s (asked from %s: GET %s "
                                "answered %s): %s"
                                % (names["repo_id"], p["repo_id"], endpoint, rel, host, url,
                                   ans.describe(),
                                   "check %s (its account needs access)" % names["token"]
                                   if token else "the repository is gated: set %s"
                                   % names["token"]))
        else:
            missing.append((rel, ans.describe()))
    return docs, missing, urls


def check(params, opener=None, host="this host"):
    """Run the whole read-only check. ``params``: repo_id, revision, endpoint, token,
    local_dir, manifest, allow_patterns, ignore_patterns, overrides, remote, timeout,
    disk_margin_bytes, ca_pem, variable_names. Returns the module's result; raises
    HubCheckError (the refusal, naming the variable) or HfWeightsError."""
    p = dict(params)
    names = variable_names(p.get("variable_names"))
    endpoint = endpoint_of(p.get("endpoint"))
    try:
        request = dict(repo_id=p["repo_id"], revision=p["revision"],
                       allow_patterns=normalize_patterns(p.get("allow_patterns"),
                                                         names["allow_patterns"]),
                       ignore_patterns=normalize_patterns(p.get("ignore_patterns"),
                                                          names["ignore_patterns"]))
        overrides = normalize_overrides(p.get("overrides"))
    except HfWeightsError as exc:
        raise HubCheckError(str(exc).replace("overrides", names["overrides"], 1)
                            if str(exc).startswith("overrides") else str(exc))
    local_dir = p["local_dir"]
    if not os.path.isabs(local_dir):
        raise HubCheckError("%s must be an absolute path, got %r" % (names["local_dir"], local_dir))
    result = dict(changed=False, endpoint=endpoint, repo_id=p["repo_id"], revision=p["revision"],
                  sha=None, asked=[], remote_checked=False, overrides_checked=[],
                  warnings=[])
    manifest_name = p.get("manifest") or ".hf-manifest.json"
    present, why, manifest = local_state(local_dir, manifest_name, request)
    if present:
        why = "manifest %s matches %s@%s" % (manifest_name, p["repo_id"], manifest.get("sha"))
    result.update(present=present, present_reason=why)

    margin = int(p.get("disk_margin_bytes") or 0)
    fs_path = existing_ancestor(local_dir)
    st = os.statvfs(fs_path)
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    result["filesystem"] = dict(path=fs_path, total_bytes=total, free_bytes=free)
    error, warning = disk_verdict(total, free, margin, present, local_dir, host,
                                  names["disk_margin_bytes"])
    if error:
        raise HubCheckError(error)
    if warning:
        result["warnings"].append(warning)

    files = []
    for op in overrides:
        if op["file"] not in files:
            files.append(op["file"])
    if present:
        result["sha"] = manifest.get("sha")
        docs, missing = local_override_documents(local_dir, files)
        where = "%s@%s in %s" % (p["repo_id"], manifest.get("sha"), local_dir)
        missing = [(rel, "not in %s" % local_dir) for rel in missing]
    elif not p.get("remote", True):
        result["skipped"] = ("%s: false: the Hub at %s was not asked whether %s@%s exists%s"
                             % (names["remote"], endpoint, p["repo_id"], p["revision"],
                                " or has the files %s patches" % names["overrides"]
                                if overrides else ""))
        return result
    else:
        opener = opener or make_opener(p.get("ca_pem"))
        sha, url = resolve_revision(opener, p, names, host)
        result["asked"].append(url)
        result.update(sha=sha, remote_checked=True)
        docs, missing, urls = remote_override_documents(opener, p, names, host, sha, files)
        result["asked"].extend(urls)
        where = "%s@%s on %s" % (p["repo_id"], sha, endpoint)
    errors = ["%s names %s, which %s does not have (%s)"
              % (", ".join("%s[%d]" % (names["overrides"], i)
                           for i, op in enumerate(overrides) if op["file"] == rel),
                 rel, where, how) for rel, how in missing]
    errors += override_errors(docs, overrides, where, names["overrides"])
    if errors:
        raise HubCheckError("; ".join(errors))
    result["overrides_checked"] = sorted(docs)
    return result
