"""Start/stop a local Hugging Face Hub-compatible server (olah) for tests and the demo.

olah (PyPI, checked with 0.5.4) serves git working trees under ``mirrors-path`` through the
Hub API, offline. This script:

* builds a git repository ``STATE/mirrors/models/<org>/<name>`` from a model directory.
  Files of ``--lfs-min-size`` bytes or more are stored the way the Hub stores weights: the git
  tree holds a Git LFS pointer and the content sits in ``.git/lfs/objects/<aa>/<bb>/<sha256>``
  (written by this script; the git-lfs binary is not needed). olah then reports ``lfs.oid``
  (sha256) and the real size in the tree API, like the Hub. Smaller files are plain git blobs.
* writes olah's ``config.toml`` (offline, upstream ``hf-netloc`` pointed at a closed loopback
  port so nothing leaves the machine, ``mirror-netloc`` = the address clients use);
* runs ``olah-cli -c config.toml`` in the background (pidfile, log in STATE/olah.log, which
  holds uvicorn's access log: one line per request) and waits until the repository answers.

Usage:
  hubserver.py start --model-dir D --repo org/name --port P --state-dir S [--tag v1]
                     [--extra-repo D2=org/name2 ...]
  hubserver.py stop --state-dir S

``start`` prints one JSON line: {"endpoint", "repo", "sha", "branch", "pid", "log",
"extra_repos": {repo: sha}}.

Known limits of olah offline (documented for the tests): no gated or private repositories
(every local mirror is public: it never answers 401/403 for a missing token), and
``model_info()`` without a revision fails; ``revision=<branch|tag|sha>`` works.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

CLOSED_UPSTREAM = "127.0.0.1:9"  # discard port, nothing listens: olah must never go upstream
GIT_ENV = {
    "GIT_AUTHOR_NAME": "hubserver", "GIT_AUTHOR_EMAIL": "hubserver@localhost",
    "GIT_COMMITTER_NAME": "hubserver", "GIT_COMMITTER_EMAIL": "hubserver@localhost",
}


def _git(repo_dir, *args):
    env = dict(os.environ, **GIT_ENV)
    out = subprocess.run(["git", "-C", repo_dir] + list(args), env=env, check=True,
                         capture_output=True, text=True)
    return out.stdout.strip()


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_repo(model_dir, repo_dir, lfs_min_size, branch="main", tag=None):
    """Create a fresh git repo in repo_dir holding model_dir's files; return the commit sha."""
    if os.path.exists(repo_dir):
        shutil.rmtree(repo_dir)
    os.makedirs(repo_dir)
    _git(repo_dir, "init", "-q", "-b", branch)
    lfs_paths = []
    for root, dirs, files in os.walk(model_dir):
        dirs[:] = sorted(d for d in dirs if d not in (".git", ".cache"))
        for name in sorted(files):
            src = os.path.join(root, name)
            rel = os.path.relpath(src, model_dir)
            dst = os.path.join(repo_dir, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            size = os.path.getsize(src)
            if size >= lfs_min_size:
                oid = _sha256_file(src)
                obj = os.path.join(repo_dir, ".git", "lfs", "objects", oid[:2], oid[2:4], oid)
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                shutil.copyfile(src, obj)
                with open(dst, "w") as f:
                    f.write("version https://git-lfs.github.com/spec/v1\n"
                            "oid sha256:%s\nsize %d\n" % (oid, size))
                lfs_paths.append(rel)
            else:
                shutil.copyfile(src, dst)
    if lfs_paths:
        with open(os.path.join(repo_dir, ".gitattributes"), "w") as f:
            for rel in lfs_paths:
                f.write("%s filter=lfs diff=lfs merge=lfs -text\n" % rel)
    _git(repo_dir, "add", "-A")
    _git(repo_dir, "commit", "-q", "-m", "model from %s" % os.path.basename(model_dir.rstrip("/")))
    if tag:
        _git(repo_dir, "tag", tag)
    return _git(repo_dir, "rev-parse", "HEAD")


def write_config(state_dir, host, port, public_netloc):
    path = os.path.join(state_dir, "config.toml")
    mirrors = os.path.join(state_dir, "mirrors")
    with open(path, "w") as f:
        f.write(
            "[basic]\n"
            'host = "%s"\nport = %d\n'
            'repos-path = "%s"\n'
            'hf-scheme = "http"\nhf-netloc = "%s"\nhf-lfs-netloc = "%s"\n'
            'mirror-scheme = "http"\nmirror-netloc = "%s"\nmirror-lfs-netloc = "%s"\n'
            'mirrors-path = ["%s"]\n'
            "\n[accessibility]\noffline = true\n"
            % (host, port, os.path.join(state_dir, "repos"), CLOSED_UPSTREAM, CLOSED_UPSTREAM,
               public_netloc, public_netloc, mirrors))
    return path


def _olah_cli(explicit):
    if explicit:
        return explicit
    beside = os.path.join(os.path.dirname(sys.executable), "olah-cli")
    if os.path.exists(beside):
        return beside
    found = shutil.which("olah-cli")
    if not found:
        sys.exit("hubserver: olah-cli not found (pip install olah==0.5.4, or pass --olah-cli)")
    return found


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_ready(url, proc, timeout):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        if proc.poll() is not None:
            return "olah exited with code %s" % proc.returncode
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return None
        except (urllib.error.URLError, OSError) as exc:
            last = exc
        time.sleep(0.3)
    return "not ready after %ds (%s)" % (timeout, last)


def cmd_start(args):
    state = os.path.abspath(args.state_dir)
    os.makedirs(state, exist_ok=True)
    pidfile = os.path.join(state, "olah.pid")
    if os.path.exists(pidfile):
        sys.exit("hubserver: %s exists; run stop first" % pidfile)
    org, _unused, name = args.repo.partition("/")
    if not org or not name or "/" in name:
        sys.exit("hubserver: --repo must be org/name, got %r" % args.repo)
    repo_dir = os.path.join(state, "mirrors", "models", org, name)
    sha = build_repo(os.path.abspath(args.model_dir), repo_dir, args.lfs_min_size,
                     args.branch, args.tag)
    extra = {}
    for spec in args.extra_repo:
        model_dir, _sep, repo = spec.rpartition("=")
        e_org, _sep, e_name = repo.partition("/")
        if not model_dir or not e_org or not e_name or "/" in e_name:
            sys.exit("hubserver: --extra-repo must be MODEL_DIR=org/name, got %r" % spec)
        extra[repo] = build_repo(os.path.abspath(model_dir),
                                 os.path.join(state, "mirrors", "models", e_org, e_name),
                                 args.lfs_min_size, args.branch)
    public = args.public_netloc or "%s:%d" % (args.host, args.port)
    config = write_config(state, args.host, args.port, public)
    log_path = os.path.join(state, "olah.log")
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        [_olah_cli(args.olah_cli), "-c", config, "--log-path", os.path.join(state, "logs")],
        cwd=state, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        # Unbuffered: the access log is read by tests right after each request.
        env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    with open(pidfile, "w") as f:
        f.write(str(proc.pid))
    err = wait_ready("http://%s:%d/api/models/%s/revision/%s"
                     % (args.host, args.port, args.repo, args.branch), proc, args.timeout)
    if err:
        _stop(state)
        sys.exit("hubserver: %s; see %s" % (err, log_path))
    print(json.dumps({"endpoint": "http://%s" % public, "repo": args.repo, "sha": sha,
                      "branch": args.branch, "pid": proc.pid, "log": log_path,
                      "extra_repos": extra}))


def _stop(state):
    pidfile = os.path.join(state, "olah.pid")
    if not os.path.exists(pidfile):
        return False
    with open(pidfile) as f:
        pid = int(f.read().strip())
    if _pid_alive(pid):
        os.killpg(pid, signal.SIGTERM)  # own session: olah and its uvicorn workers
        for _unused in range(50):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                if not _pid_alive(pid):
                    break
            time.sleep(0.1)
        else:
            os.killpg(pid, signal.SIGKILL)
    os.remove(pidfile)
    return True


def cmd_stop(args):
    state = os.path.abspath(args.state_dir)
    print(json.dumps({"stopped": _stop(state)}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("--model-dir", required=True)
    s.add_argument("--repo", required=True, help="org/name")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--state-dir", required=True)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--public-netloc", default=None,
                   help="host:port clients use (default HOST:PORT)")
    s.add_argument("--branch", default="main")
    s.add_argument("--tag", default=None, help="also tag the commit")
    s.add_argument("--extra-repo", action="append", default=[], metavar="MODEL_DIR=org/name",
                   help="serve another model directory as another repository (repeatable)")
    s.add_argument("--lfs-min-size", type=int, default=1 << 20,
                   help="files this large or larger are stored as LFS objects")
    s.add_argument("--olah-cli", default=None)
    s.add_argument("--timeout", type=int, default=60)
    s.set_defaults(func=cmd_start)
    t = sub.add_parser("stop")
    t.add_argument("--state-dir", required=True)
    t.set_defaults(func=cmd_stop)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
